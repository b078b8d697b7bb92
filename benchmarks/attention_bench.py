"""SFT train-step speed of the attention implementations (`model.attention`).

One jitted forward + backward of the SFT loss (`sft_loss.sft_loss`) on a
small model (4 layers, hidden 128, 2 heads, 1 KV head, head_dim 32, vocab
4096), a batch of full rows, for each variant `IMPL[:BLOCK]`:
`reference` (one dense [T,T] score matrix a head), `reference:N` (causal
query blocks of N, `attention_block`), `blocked:N` (the same blocks with
the written backward), `chunked:N` (flash attention in blocks of N,
`attention_chunk`), `xla` (jax.nn.dot_product_attention), `tokamax` (the
optional package).
Variants are timed interleaved (one call each per round) so that outside
load hits them alike; the table gives the median of `--reps` rounds, the
speed-up over the first variant, the largest loss and gradient differences
from it, and the compiled temporaries of the step.

  python benchmarks/attention_bench.py
  python benchmarks/attention_bench.py --seq=512 --variants=reference,chunked:128
  python benchmarks/attention_bench.py --preset=demo --variants=reference:128,chunked:256
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
  ap.add_argument("--variants",
                  default="reference,reference:128,blocked:128,chunked:128,"
                          "chunked:256,chunked:512")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--preset", choices=("small", "demo", "config"),
                  default="small",
                  help="small: the model above; demo: the demo preset "
                  "(hidden 256, 4 heads, 2 KV heads, head_dim 64); config: "
                  "configs/demo.py's model (hidden 128, 4 heads, 4 KV heads, "
                  "head_dim 32)")
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
  if args.preset == "demo":
    base = {}
  elif args.preset == "config":
    base.update(num_heads=4, num_kv_heads=4)
  variants = [v for v in args.variants.split(",") if v]
  steps, outs, temps = {}, {}, {}
  for name in variants:
    impl, _, blk = name.partition(":")
    opts = dict(attention=impl, logits_chunk=0)
    if blk:
      key = ("attention_block" if impl in ("reference", "blocked")
             else "attention_chunk")
      opts[key] = int(blk)
    cfg = qwen3.Qwen3Config.preset("demo", **opts, **base)
    step, state = make_step(cfg, tokens, loss_mask, attention_mask)
    t0 = time.perf_counter()
    temps[name] = step.lower(state).compile().memory_analysis().temp_size_in_bytes
    outs[name] = jax.block_until_ready(step(state))
    print(f"{name}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    steps[name] = (step, state)
  times = {name: [] for name in variants}
  for _ in range(args.reps):
    for name in variants:
      step, state = steps[name]
      t0 = time.perf_counter()
      jax.block_until_ready(step(state))
      times[name].append(time.perf_counter() - t0)
  first = variants[0]
  base_s = statistics.median(times[first])
  l0, g0 = outs[first]
  print(f"\nSFT fwd+bwd, batch {b} x {t} tokens, {jax.devices()[0].platform}, "
        f"median of {args.reps}; load average {os.getloadavg()[0]:.1f}")
  print(f"| attention | s/step | tokens/s | vs {first} | temporaries MiB | "
        "max |loss diff| | max |grad diff| |")
  print("|---|---|---|---|---|---|---|")
  for name in variants:
    sec = statistics.median(times[name])
    l, g = outs[name]
    gd = max(float(jnp.max(jnp.abs(x - y))) for x, y in
             zip(jax.tree.leaves(g), jax.tree.leaves(g0)))
    print(f"| {name} | {sec:.3f} | {b * t / sec:,.0f} | {base_s / sec:.2f}x | "
          f"{temps[name] / 2**20:,.0f} | {abs(float(l) - float(l0)):.1e} | {gd:.1e} |")


if __name__ == "__main__":
  main()
