"""The RL update on episodes of unequal length: one scan over max_len rows
vs micro-batches of length-sorted rows, each padded to its own bucket.

Same model (the demo's RL shape: Qwen3, hidden 128, 4 layers, 4 query and 4
KV heads), the same batch (32 episodes, group 4, ``rl.max_len`` 2,048,
episode lengths drawn uniformly from ``--min_len``-``--max_len``; the demo's
RL rollouts average ~900 tokens with the longest at 2,048, see
``train/rollout/episode_tokens`` in an RL run's metrics), the same optimizer,
4 micro-batches. The two steps are timed interleaved so load from other
processes hits both alike; the table reports medians, and the last line
checks that both give the same loss.

Run (a few minutes on 2 CPU cores)::

  python benchmarks/rl_update_bench.py
  python benchmarks/rl_update_bench.py --batch=16 --reps=3 --buckets=512,1024,1536
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
import numpy as np

from paraagent_jax.models import qwen3
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import step as ts


def demo_rl_model(vocab: int, seed: int = 0):
  """The demo's RL policy shape (configs/demo.py), random weights."""
  cfg = qwen3.Qwen3Config.preset("demo")
  cfg = cfg.replace(vocab_size=vocab, hidden_size=128, intermediate_size=512, num_layers=4,
                    num_heads=4, num_kv_heads=4, head_dim=32, attention_block=128)
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), cfg


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--max_len", type=int, default=2048)
  ap.add_argument("--min_len", type=int, default=300)
  ap.add_argument("--buckets", default="1024,1536")
  ap.add_argument("--micro", type=int, default=4)
  ap.add_argument("--vocab", type=int, default=4096)
  ap.add_argument("--reps", type=int, default=4)
  args = ap.parse_args(argv)

  mesh = jax.make_mesh((1, 1, 1), ts.DEFAULT_BATCH_AXES + ("tensor",),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=jax.devices()[:1])
  batch = batch_lib.synthetic_batch(0, batch_size=args.batch, seq_len=args.max_len,
                                    num_steps=16, num_phases=8, group_size=4,
                                    vocab_size=args.vocab, with_ref=False)
  rng = np.random.default_rng(0)
  lens = rng.integers(args.min_len, args.max_len + 1, size=args.batch).astype(np.int32)
  lens[0] = args.max_len                    # as in a batch with one mixed task at the cap
  pos = np.arange(args.max_len)[None]
  real = pos < lens[:, None]
  batch = batch.replace(seq_len=lens, attention_mask=np.asarray(batch.attention_mask) * real,
                        loss_mask=np.asarray(batch.loss_mask) * real)
  buckets = [int(x) for x in args.buckets.split(",") if x] + [args.max_len]
  model, cfg = demo_rl_model(args.vocab)
  graphdef = nnx.split(model)[0]
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-5))
  gcfg = grpo.GRPOConfig(num_micro_batches=args.micro)
  variants = {
      f"scan: {args.micro} micro-batches x {args.max_len} tokens": (),
      f"sorted: {args.micro} micro-batches, buckets {args.buckets},{args.max_len}": buckets,
  }
  runs = {}
  for name, lengths in variants.items():
    state, opt_state = ts.shard_train_state(nnx.split(demo_rl_model(args.vocab)[0])[1],
                                            optimizer, mesh)
    step = grpo.make_train_step(graphdef, optimizer, gcfg, mesh, lengths=lengths)
    t0 = time.perf_counter()
    state, opt_state, m = step(state, opt_state, batch, jax.random.key(0))
    jax.block_until_ready(state)
    runs[name] = [step, state, opt_state, time.perf_counter() - t0, [], float(m["loss"]),
                  m.get("padded_tokens", args.batch * args.max_len)]
  for rep in range(args.reps):
    for name in variants:
      r = runs[name]
      t0 = time.perf_counter()
      r[1], r[2], m = r[0](r[1], r[2], batch, jax.random.key(rep + 1))
      jax.block_until_ready(r[1])
      r[4].append(time.perf_counter() - t0)

  print(f"model: demo RL shape (hidden {cfg.hidden_size}, {cfg.num_layers} layers, "
        f"{cfg.num_heads}/{cfg.num_kv_heads} heads), vocab {args.vocab}; batch {args.batch} "
        f"episodes of {args.min_len}-{args.max_len} tokens (mean {lens.mean():.0f}); backend "
        f"{jax.default_backend()}, {args.reps} timed steps each, interleaved")
  base = statistics.median(runs[next(iter(variants))][4])
  print(f"| {'update':55s} | tokens computed | median s | first (compile) s | vs scan |")
  print(f"|{'-' * 57}|-----------------|----------|-------------------|---------|")
  for name, r in runs.items():
    med = statistics.median(r[4])
    print(f"| {name:55s} | {int(r[6]):15d} | {med:8.2f} | {r[3]:17.1f} | {med / base:7.2f} |")
  losses = [r[5] for r in runs.values()]
  print(f"first-step loss: scan {losses[0]:.6f}, sorted {losses[1]:.6f} "
        f"(same update; tests/learner/test_grpo.py checks it)")


if __name__ == "__main__":
  main()
