"""The sampled token's draw: `jax.random.categorical` against the inverse-CDF draw.

A sampled decode step draws one token per row from softmax(logits / T). The
default draw (``rl.draw="gumbel"``) is `jax.random.categorical`: V random bits
and two logs per entry. ``"inverse_cdf"`` (`sampling.programs.inverse_cdf_choice`)
draws the same distribution with one uniform per row and one exp per entry.
This prints the CPU milliseconds of one jitted draw of each kind at the demo's
shape ([32, 4096]; `--batch`, `--vocab`), each inside `sample_token` with its
log-prob, plus, as a check, the total-variation distance between each draw's
token frequencies and the true probabilities over `--check_draws` draws.

  python benchmarks/draw_bench.py
  python benchmarks/draw_bench.py --batch=8 --repeats=9
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax.sampling import programs as sk


def _draw_fn(draw: str):
  def fn(logits, key):
    return sk.sample_token(logits, key, 0.7, 1.0, greedy=False, top_k=0, use_top_p=False,
                           draw=draw)
  return jax.jit(fn)


def _cpu_ms(fn, logits, calls: int, repeats: int) -> tuple[float, float]:
  """(best, median) over `repeats` of the mean CPU ms of one call."""
  keys = [jax.random.key(i) for i in range(calls)]
  jax.block_until_ready(fn(logits, keys[0]))
  per = []
  for _ in range(repeats):
    start = time.process_time()
    for k in keys:
      out = fn(logits, k)
    jax.block_until_ready(out)
    per.append(1e3 * (time.process_time() - start) / calls)
  return min(per), float(np.median(per))


def _tv_distance(draw: str, draws: int) -> float:
  """Total variation between `draws` draws of a 64-entry row and its softmax."""
  rng = np.random.default_rng(0)
  logits = rng.normal(scale=1.5, size=(1, 64)).astype(np.float32)
  p = np.exp(logits[0] / 0.7 - (logits[0] / 0.7).max())
  p /= p.sum()
  fn = _draw_fn(draw)
  keys = jax.random.split(jax.random.key(7), draws)
  toks = np.asarray(jax.vmap(lambda k: fn(jnp.asarray(logits), k)[0])(keys))[:, 0]
  freq = np.bincount(toks, minlength=64) / draws
  return 0.5 * float(np.abs(freq - p).sum())


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--vocab", type=int, default=4096)
  ap.add_argument("--calls", type=int, default=200)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--check_draws", type=int, default=20000)
  a = ap.parse_args(argv)
  logits = jnp.asarray(np.random.default_rng(1).normal(scale=3.0, size=(a.batch, a.vocab)),
                       jnp.float32)
  print(f"draw of one token per row from [{a.batch}, {a.vocab}] logits (temperature 0.7), "
        f"CPU ms per call, {a.calls} calls x {a.repeats} repeats; "
        f"TV distance of {a.check_draws} draws from a 64-entry softmax\n")
  print("| draw | best ms | median ms | x gumbel (median) | TV distance |")
  print("|---|---|---|---|---|")
  base = None
  for draw in sk.DRAWS:
    best, med = _cpu_ms(_draw_fn(draw), logits, a.calls, a.repeats)
    base = base or med
    tv = _tv_distance(draw, a.check_draws)
    print(f"| {draw} | {best:.3f} | {med:.3f} | {base / med:.2f} | {tv:.4f} |")
  # Two independent samples of n draws from 64 categories differ by TV ~
  # sqrt(64 / (2 pi n)); both draws should sit at that noise level.
  print(f"\nsampling noise of TV at {a.check_draws} draws: ~"
        f"{np.sqrt(64 / (2 * np.pi * a.check_draws)):.4f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
