"""Train-step benches: RL vs plain cross-entropy, and SFT padded vs packed rows.

``--mode=rl`` (default): the RL (GRPO, three advantage levels) train step vs
a plain cross-entropy step. Same model, same batch, same optimizer and the
same train-step machinery (`paraagent_jax.learner.step`); the only
difference is the loss. The RL step adds the segment-reduction advantages,
the clipped-ratio policy term, the k3 KL against the batch's reference
log-probs and the entropy metric. Target: RL / CE <= 1.1.

``--mode=packing``: the SFT step on real demonstrations (built with
configs/demo.py's data settings and the shipped tokenizer), one per row
padded to ``--seq`` vs packed several per row (``data.pack``, segment ids).
Both read the same epoch order; each timed step takes the next batch of its
stream, and tokens/s counts real (non-padding) tokens. Target: packed >= 1.5x
the padded tokens/s. The speed-up is bounded by the ratio of the two "fill"
columns (real tokens per row slot): both steps cost the same per row.

Steps are timed interleaved (A, B, A, B, ...) so that load from other
processes hits both alike.

Run (about a minute each on a laptop CPU)::

  .venv/bin/python benchmarks/train_step_bench.py
  .venv/bin/python benchmarks/train_step_bench.py --batch=8 --seq=512 --reps=7
  .venv/bin/python benchmarks/train_step_bench.py --mode=packing --seq=1024 --batch=8 --reps=7
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from flax import nnx  # pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from paraagent_jax import config_utils
from paraagent_jax.coldstart import build as coldstart_build
from paraagent_jax.data import demonstrations
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import sft_loss
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import step as ts
from paraagent_jax.models import qwen3


REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DEMO_CONFIG = os.path.join(REPO, "configs", "demo.py")
SHIPPED_TOKENIZER = os.path.join(REPO, "pretrained", "demo_sft")
# The demo config's attention settings, copied onto the preset.
ATTENTION_KEYS = ("attention", "attention_block", "attention_chunk", "logits_chunk",
                  "logits_capacity")
# The demo model's settings before issue 18: the einsum attention in causal
# query blocks of 128, full [B,T,V] logits (at every position), and the
# projections as batched einsums (`_einsum_dense`).
BEFORE = {"attention": "reference", "attention_block": 128, "logits_chunk": 0,
          "logits_capacity": 0.0}


def _einsum_dense(x, w, w_out_first=False, out_dtype=None):
  """`qwen3._dense` as the model wrote it before issue 18: one batched
  contraction ("BTD,DF->BTF"), whose autodiff weight gradient XLA:CPU runs
  as a slow dot plus transposes."""
  if w_out_first:
    return jnp.einsum("...D,VD->...V", x, w, preferred_element_type=out_dtype)
  lead, out = "ABCEG"[:x.ndim - 1], "UVW"[:w.ndim - 1]
  return jnp.einsum(f"{lead}D,D{out}->{lead}{out}", x, w,
                    preferred_element_type=out_dtype)


@contextlib.contextmanager
def _projections(before: bool):
  """Traces (and so compiles) the model with the old projections if `before`."""
  saved = qwen3._dense  # pylint: disable=protected-access
  if before:
    qwen3._dense = _einsum_dense  # pylint: disable=protected-access
  try:
    yield
  finally:
    qwen3._dense = saved  # pylint: disable=protected-access


def build_model(seed: int, preset: str = "demo", **overrides):
  """A Qwen3 preset (random weights) and a line describing it."""
  cfg = qwen3.Qwen3Config.preset(preset, **overrides)
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), f"qwen3 {preset} preset {cfg}"


def _block(tree):
  jax.tree.map(lambda x: x.block_until_ready(), tree)


def _mesh():
  return jax.make_mesh((1, 1, 1), ts.DEFAULT_BATCH_AXES + ("tensor",),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3,
                       devices=jax.devices()[:1])


def main(argv=None):
  """Times the steps of ``--mode`` and prints the table."""
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mode", choices=("rl", "packing"), default="rl")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=0,
                  help="row length (default 512 for rl, 1024 for packing)")
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--micro", type=int, default=1)
  ap.add_argument("--preset", default="demo", help="Qwen3 preset")
  ap.add_argument("--tasks", type=int, default=400,
                  help="packing: demonstrations to build (train split)")
  ap.add_argument("--data_dir", default="",
                  help="packing: built demonstrations to read (default: build "
                       "--tasks of them in a temporary directory)")
  ap.add_argument("--model", choices=("preset", "config"), default="preset",
                  help="packing: 'preset' = --preset with the demo config's "
                  "attention settings; 'config' = configs/demo.py's model "
                  "(hidden 128, the tokenizer's vocabulary)")
  ap.add_argument("--with_before", action="store_true",
                  help="packing: also time padded rows on the attention and "
                       "logits path before issue 18 (`BEFORE`)")
  ap.add_argument("--model_set", default="",
                  help="packing: model overrides for the timed rows (not the "
                       "before row), e.g. 'attention=chunked,attention_chunk=128'")
  args = ap.parse_args(argv)
  if args.mode == "packing":
    return packing_main(args)
  args.seq = args.seq or 512

  mesh = _mesh()
  model, desc = build_model(0, args.preset)
  vocab = int(model(jnp.zeros((1, 2), jnp.int32),
                    attention_mask=jnp.ones((1, 2), jnp.int32)).shape[-1])
  batch = batch_lib.synthetic_batch(
      0, batch_size=args.batch, seq_len=args.seq, num_steps=16, num_phases=8,
      group_size=4, vocab_size=vocab)
  sft_batch = {"tokens": batch.tokens, "loss_mask": batch.loss_mask,
               "attention_mask": batch.attention_mask}
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-5))
  graphdef = nnx.split(model)[0]

  variants = {
      "CE (plain masked cross-entropy)": (
          sft_loss.make_sft_train_step(graphdef, optimizer, mesh,
                                       num_micro_batches=args.micro),
          sft_batch),
      "RL: 3 levels + KL(k3) + entropy metric": (
          grpo.make_train_step(graphdef, optimizer, grpo.GRPOConfig(
              beta=0.04, clip_eps_high=0.28, num_micro_batches=args.micro),
                               mesh), batch),
      "RL: 3 levels, no KL, no entropy": (
          grpo.make_train_step(graphdef, optimizer, grpo.GRPOConfig(
              compute_entropy=False, num_micro_batches=args.micro), mesh),
          batch),
  }
  states = {}
  for name, (step, data) in variants.items():
    state, opt_state = ts.shard_train_state(
        nnx.split(build_model(0, args.preset)[0])[1], optimizer, mesh)
    t0 = time.perf_counter()
    state, opt_state, m = step(state, opt_state, data, jax.random.key(0))
    _block(m)
    states[name] = (state, opt_state, time.perf_counter() - t0)

  times = {name: [] for name in variants}
  for rep in range(args.reps):
    for name, (step, data) in variants.items():
      state, opt_state, compile_s = states[name]
      t0 = time.perf_counter()
      state, opt_state, m = step(state, opt_state, data,
                                 jax.random.key(rep))
      _block((state, m))
      times[name].append(time.perf_counter() - t0)
      states[name] = (state, opt_state, compile_s)

  print(f"model: {desc}")
  print(f"batch {args.batch} x {args.seq} tokens, micro-batches {args.micro},"
        f" {args.reps} timed steps each (interleaved), backend "
        f"{jax.default_backend()}, {len(jax.devices())} device(s), mesh 1x1x1")
  base = statistics.median(times[next(iter(variants))])
  print(f"| {'step':40s} | median s | min s  | first (compile) s | ratio |")
  print(f"|{'-' * 42}|----------|--------|-------------------|-------|")
  for name, ts_ in times.items():
    med = statistics.median(ts_)
    print(f"| {name:40s} | {med:8.3f} | {min(ts_):6.3f} | "
          f"{states[name][2]:17.1f} | {med / base:5.3f} |")
  rl = statistics.median(times["RL: 3 levels + KL(k3) + entropy metric"])
  print(f"RL/CE ratio (full RL step): {rl / base:.3f}  (target <= 1.1)")
  return np.float64(rl / base)


def demo_sft_data(args, data_dir: str, pack: bool):
  """The demo's SFT demonstrations at ``args.seq``: demonstration batches
  only (no copy warm-up or copy batches, no length buckets)."""
  config = config_utils.load_config(f"{DEMO_CONFIG}:stage=sft")
  data = ml_collections.ConfigDict(dict(
      config.data.to_dict(), data_dir=data_dir, tokenizer=SHIPPED_TOKENIZER,
      length_bucket=0, copy_warmup=0, copy_every=0, turn_warmup=0, pack=pack))
  return config, demonstrations.make_sft_data(
      data, split="train", batch_size=args.batch, seq_len=args.seq, seed=0)


def _overrides(spec: str) -> dict:
  """'a=1,b=x' -> {"a": 1, "b": "x"} (ints and floats parsed)."""
  out = {}
  for item in filter(None, spec.split(",")):
    key, sep, val = item.partition("=")
    if not sep:
      raise SystemExit(f"--model_set: {item!r} is not key=value")
    for cast in (int, float):
      try:
        val = cast(val)
        break
      except ValueError:
        pass
    out[key.strip()] = val
  return out


def packing_main(args):
  """SFT step on real demonstration rows: one per row padded vs packed."""
  args.seq = args.seq or 1024
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = args.data_dir
    if not data_dir:
      config = config_utils.load_config(f"{DEMO_CONFIG}:stage=sft")
      config.data.num_tasks = args.tasks
      data_dir = os.path.join(tmp, "demos")
      coldstart_build.build_demonstrations(config, data_dir)
    config, packed = demo_sft_data(args, data_dir, pack=True)
    if args.model == "config":
      attention = {k: v for k, v in config.model.items()
                   if k not in ("preset", "vocab_size")}
      attention["vocab_size"] = packed.vocab_size
      args.preset = config.model.preset
    else:
      attention = {k: config.model[k] for k in ATTENTION_KEYS if k in config.model}
    attention.update(_overrides(args.model_set))
    # name -> (rows, model overrides, old projections); the padded streams
    # read the same batches.
    variants = {"padded: one demonstration a row": (
        demo_sft_data(args, data_dir, pack=False)[1], attention, False)}
    if args.with_before:
      variants["padded, model code before issue 18"] = (
          demo_sft_data(args, data_dir, pack=False)[1], {**attention, **BEFORE},
          True)
    variants["packed: data.pack (segment ids)"] = (packed, attention, False)
  print(f"demonstrations: {packed.pack_summary()}")
  mesh = _mesh()
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-5))
  runs = {}
  for name, (data, overrides, before) in variants.items():
    model, desc = build_model(0, args.preset, **overrides)
    if data.vocab_size > model.config.vocab_size:
      raise SystemExit(f"--preset={args.preset}: vocabulary {model.config.vocab_size} "
                       f"< the tokenizer's {data.vocab_size}")
    graphdef, state = nnx.split(model)
    step = sft_loss.make_sft_train_step(graphdef, optimizer, mesh,
                                        num_micro_batches=args.micro)
    state, opt_state = ts.shard_train_state(state, optimizer, mesh)
    t0 = time.perf_counter()
    with _projections(before):
      state, opt_state, m = step(state, opt_state, next(data), jax.random.key(0))
    _block(m)
    runs[name] = dict(step=step, state=state, opt_state=opt_state, desc=desc,
                      compile_s=time.perf_counter() - t0, times=[], tokens=0,
                      slots=0, demos=0)
  for rep in range(args.reps):
    for name, (data, _, before) in variants.items():
      run = runs[name]
      batch = next(data)
      t0 = time.perf_counter()
      with _projections(before):
        run["state"], run["opt_state"], m = run["step"](
            run["state"], run["opt_state"], batch, jax.random.key(rep))
      _block((run["state"], m))
      run["times"].append(time.perf_counter() - t0)
      run["tokens"] += int(batch["attention_mask"].sum())
      run["slots"] += batch["attention_mask"].size
      seg = batch.get("segment_ids", batch["attention_mask"])
      run["demos"] += int(seg.max(axis=1).sum())

  print(f"model: {next(iter(runs.values()))['desc']}")
  if args.with_before:
    print(f"before issue 18: the same with {BEFORE} and the projections as "
          "batched einsums")
  print(f"SFT step, batch {args.batch} x {args.seq} tokens, micro-batches "
        f"{args.micro}, {args.reps} timed steps each (interleaved, a new batch "
        f"each), backend {jax.default_backend()}, {len(jax.devices())} device(s), mesh 1x1x1")
  print(f"| {'rows':34s} | demos/row | fill  | median s | first (compile) s | real tokens/s |")
  print(f"|{'-' * 36}|-----------|-------|----------|-------------------|---------------|")
  rate = {}
  for name, run in runs.items():
    rate[name] = run["tokens"] / sum(run["times"])
    rows = args.batch * args.reps
    print(f"| {name:34s} | {run['demos'] / rows:9.2f} | {run['tokens'] / run['slots']:5.3f} | "
          f"{statistics.median(run['times']):8.3f} | {run['compile_s']:17.1f} | "
          f"{rate[name]:13.0f} |")
  names = list(rate)
  ratio = rate[names[-1]] / rate[names[0]]
  print(f"packed / padded real tokens/s (same model code): {ratio:.3f}")
  if args.with_before:
    ratio = rate[names[-1]] / rate[names[1]]
    print(f"packed / padded before issue 18: {ratio:.3f}  (issue 18's target "
          ">= 1.5)")
  return np.float64(ratio)

if __name__ == "__main__":
  main()
