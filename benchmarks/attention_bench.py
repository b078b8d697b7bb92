"""SFT train-step speed: dense causal attention vs causal query blocks.

One jitted forward + backward of the SFT loss (`sft_loss.sft_loss`) on the
model `configs/demo.py` trains (4 layers, hidden 128, 2 heads, 1 KV head,
head_dim 32, vocab 4096), a batch of full rows, with
`Qwen3Config.attention_block` = 0 (one dense [T,T] score matrix a head) and
the block sizes given. Variants are timed interleaved (one call each per
round) so that outside load hits them alike; the table gives the median of
`--reps` rounds, the speed-up over dense and the largest loss and gradient
differences from dense (the blocked form is the same math).

  .venv/bin/python benchmarks/attention_bench.py
  .venv/bin/python benchmarks/attention_bench.py --seq=512 --blocks=64,128,256
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

from paraagent_jax.models import qwen3
from paraagent_jax.learner import sft_loss


def make_step(cfg, tokens, loss_mask, attention_mask):
  """(jitted loss-and-grad of the parameter state, that state)."""
  graphdef, state = nnx.split(qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))

  @jax.jit
  def step(state):
    def f(state):
      return sft_loss.sft_loss(nnx.merge(graphdef, state), tokens, loss_mask,
                               attention_mask)
    return jax.value_and_grad(f)(state)
  return step, state


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=1024)
  ap.add_argument("--blocks", default="64,128,256")
  ap.add_argument("--reps", type=int, default=5)
  args = ap.parse_args(argv)
  b, t = args.batch, args.seq
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(10, 4096, (b, t)), jnp.int32)
  # The last row is half padding, as bucketed SFT batches are.
  attention_mask = np.ones((b, t), np.int32)
  attention_mask[-1, t // 2:] = 0
  loss_mask = jnp.asarray(attention_mask, jnp.float32)
  attention_mask = jnp.asarray(attention_mask)
  base = dict(vocab_size=4096, hidden_size=128, intermediate_size=512,
              num_layers=4, num_heads=2, num_kv_heads=1, head_dim=32)
  variants = [0] + [int(x) for x in args.blocks.split(",") if x]
  steps, outs = {}, {}
  for blk in variants:
    cfg = qwen3.Qwen3Config.preset("demo", attention_block=blk, **base)
    step, state = make_step(cfg, tokens, loss_mask, attention_mask)
    t0 = time.perf_counter()
    outs[blk] = jax.block_until_ready(step(state))
    print(f"block {blk}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    steps[blk] = (step, state)
  times = {blk: [] for blk in variants}
  for _ in range(args.reps):
    for blk in variants:
      step, state = steps[blk]
      t0 = time.perf_counter()
      jax.block_until_ready(step(state))
      times[blk].append(time.perf_counter() - t0)
  dense_s = statistics.median(times[0])
  l0, g0 = outs[0]
  print(f"\nSFT fwd+bwd, batch {b} x {t} tokens, {jax.devices()[0].platform}, "
        f"median of {args.reps}; load average {os.getloadavg()[0]:.1f}")
  print("| attention | s/step | tokens/s | vs dense | max |loss diff| | max |grad diff| |")
  print("|---|---|---|---|---|---|")
  for blk in variants:
    s = statistics.median(times[blk])
    l, g = outs[blk]
    gd = max(float(jnp.max(jnp.abs(x - y))) for x, y in
             zip(jax.tree.leaves(g), jax.tree.leaves(g0)))
    name = "dense" if blk == 0 else f"blocks of {blk}"
    print(f"| {name} | {s:.3f} | {b * t / s:,.0f} | {dense_s / s:.2f}x | "
          f"{abs(float(l) - float(l0)):.1e} | {gd:.1e} |")


if __name__ == "__main__":
  main()
