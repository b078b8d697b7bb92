"""RL (GRPO, three advantage levels) train step vs a plain cross-entropy step.

Same model, same batch, same optimizer and the same train-step machinery
(`paraagent_jax.learner.step`); the only difference is the loss. The RL
step adds the segment-reduction advantages, the clipped-ratio policy term,
the k3 KL against the batch's reference log-probs and the entropy metric.
Steps are timed interleaved (CE, RL, CE, RL, ...) so that load from other
processes hits both alike; the table reports medians.

Run (about a minute on a laptop CPU)::

  .venv/bin/python benchmarks/train_step_bench.py
  .venv/bin/python benchmarks/train_step_bench.py --batch=8 --seq=512 --reps=7

Target: RL / CE <= 1.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from flax import nnx  # pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import sft_loss
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import step as ts
from paraagent_jax.models import qwen3


def build_model(seed: int):
  """The demo preset of Qwen3 (random weights) and a line describing it."""
  cfg = qwen3.Qwen3Config.preset("demo")
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), f"qwen3 demo preset {cfg}"


def _block(tree):
  jax.tree.map(lambda x: x.block_until_ready(), tree)


def main(argv=None):
  """Times both steps and prints the table."""
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=512)
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--micro", type=int, default=1)
  args = ap.parse_args(argv)

  mesh = jax.make_mesh((1, 1, 1), ts.DEFAULT_BATCH_AXES + ("tensor",),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3,
                       devices=jax.devices()[:1])
  model, desc = build_model(0)
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
    state, opt_state = ts.shard_train_state(nnx.split(build_model(0)[0])[1],
                                            optimizer, mesh)
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


if __name__ == "__main__":
  main()
