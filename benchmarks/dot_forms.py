"""How fast XLA:CPU runs a decode step's product, by how it is written.

A decode step multiplies activations x [batch, In] by a weight of [In, Out]. The
same product can be written four ways: with the weight as stored ([In, Out]) or
as a transposed copy ([Out, In]), and with the product written [batch, Out] or
[Out, batch]. This prints GFLOP/s for each form at the demo model's shapes
(gate/up, down, LM head), one pinned thread, a jitted list of `--layers`
products with distinct weights so that the weights stream from the cache
hierarchy as in a decode step (one weight would stay in L2), and the largest
difference between each form's products and the first's: the same numbers up
to rounding. `sampling.cached_forward.decode_weights` uses the fastest form measured here for
the decode step's MLP and LM head (docs/records/sampler_speed.md, sixteenth session).

  .venv/bin/python benchmarks/dot_forms.py
  .venv/bin/python benchmarks/dot_forms.py --batch=8 --shapes=256x768,256x4096
"""

import argparse
import os
import sys
import time

_CPUS = sorted(os.sched_getaffinity(0))[:1]
os.sched_setaffinity(0, _CPUS)          # before JAX starts: one XLA worker
if "multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_cpu_multi_thread_eigen=false").strip()

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

# (label, einsum spec, weight stored transposed?) with x as "MI".
FORMS = (
    ("x @ W -> [batch, Out] (the parameters' layout)", "MI,IO->MO", False),
    ("Wt, x -> [Out, batch] (decode_weights)", "OI,MI->OM", True),
    ("Wt, x -> [batch, Out]", "OI,MI->MO", True),
    ("W, x -> [Out, batch]", "IO,MI->OM", False),
)


def _product(spec: str, x, w):
  """The einsum of `spec`, whose first operand is x ("M...") or the weight."""
  return jnp.einsum(spec, x, w) if spec[0] == "M" else jnp.einsum(spec, w, x)


def _cpu_seconds(fn, args, calls: int, repeats: int) -> float:
  """Best of `repeats` of the mean CPU seconds of one call of jitted `fn`."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.process_time()
    for _ in range(calls):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.process_time() - start) / calls)
  return best


def measure(batch: int, shape: tuple[int, int], layers: int, calls: int,
            repeats: int) -> list[tuple[str, float, float]]:
  """[(form, GFLOP/s, max |difference| to the first form's products)]."""
  n_in, n_out = shape
  rs = np.random.RandomState(0)
  ws = [rs.randn(n_in, n_out).astype(np.float32) * 0.05 for _ in range(layers)]
  x = jnp.asarray(rs.randn(batch, n_in).astype(np.float32))
  flops = 2.0 * batch * n_in * n_out * layers
  rows, first = [], None
  for label, spec, transposed in FORMS:
    weights = [jnp.asarray(w.T.copy() if transposed else w) for w in ws]
    fn = jax.jit(lambda x, ws, spec=spec: [_product(spec, x, w) for w in ws])
    sec = _cpu_seconds(fn, (x, weights), calls, repeats)
    outs = [np.asarray(o) for o in fn(x, weights)]
    if spec.endswith("OM"):
      outs = [o.T for o in outs]
    first = outs if first is None else first
    diff = max(float(np.abs(a - b).max()) for a, b in zip(outs, first))
    rows.append((label, flops / sec / 1e9, diff))
  return rows


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--shapes", default="256x768,768x256,256x4096",
                      help="comma-separated [In]x[Out] weight shapes")
  parser.add_argument("--layers", type=int, default=8,
                      help="distinct weights per call")
  parser.add_argument("--calls", type=int, default=200)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
  print(f"jax {jax.__version__}; batch {args.batch}, {args.layers} weights a "
        f"call, best of {args.repeats} x {args.calls} calls; pinned to CPUs "
        f"{_CPUS}")
  print()
  print("| weight [In, Out] | form | GFLOP/s | max abs difference to the first form |")
  print("|---|---|---|---|")
  for shape in shapes:
    for label, gflops, diff in measure(args.batch, shape, args.layers,
                                       args.calls, args.repeats):
      print(f"| {shape[0]} x {shape[1]} | {label} | {gflops:.0f} | {diff:.1e} |")
  sys.stdout.flush()


if __name__ == "__main__":
  main()
