"""Where a decode call's time goes: per-op CPU time of one `Sampler.generate`.

Profiles one greedy `generate` call of `benchmarks/sampler_bench.py`'s model
(demo size, random weights, fp32, pinned to `--threads` CPUs like that bench)
with `jax.profiler`, maps each XLA thunk of the trace to its instruction in the
optimised HLO of its program (dumped by XLA), and prints a table: time per
call grouped by (JAX op, output shape), largest first. Loops (`while`)
contain other thunks and are left out of the sum. The sampler is the one
`sampler_bench.py` times: by default its cache grows (`Sampler(cache_steps=)`,
4 sizes on the CPU for this bench), so one call runs the decode program of
each size it passes through, and the copies into the next size between them
(`resize` rows). Each run of a program is mapped to the program of its size:
the trace names the module and run of every thunk, and the call goes through
the sizes in order from the prefilled state's. In shapes, `S` stands for the
cache's slots when the call ran at several sizes. `--cache_steps=1` profiles
one decode program over the whole cache.

The peer in the same run: the same dense matmuls (q, k, v, o, gate, up, down
of every layer and the LM head, at the same batch and shapes) as a bare jitted
loop of `--new_tokens` steps, nothing else. It is the floor the model's dense
part can reach with XLA's own dot on this machine; the table shows what the
rest (attention over the cache, norms, RoPE, argmax, cache writes) adds. The
same chain in torch (eager, `--threads` threads) is the second peer: it shows
whether XLA's dot kernels, or the machine, set that floor. The third is the
first with the MLP's and the LM head's products out-major, as the CPU decode
step runs them (`sampling.cached_forward.decode_weights`: weights [Out, In], products written
[Out, batch]).

  .venv/bin/python benchmarks/decode_profile.py                 # batch 32
  .venv/bin/python benchmarks/decode_profile.py --batch=8 --top=30
  .venv/bin/python benchmarks/decode_profile.py --cache_steps=1  # one cache size

Thunk times come from the profiler, which adds a little to each; the total
printed next to them is the traced call's wall time.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

_DUMP = tempfile.mkdtemp(prefix="decode_profile_hlo_")
# XLA reads its flags when it starts: the dump flag goes in before
# sampler_bench (imported below) pins the process and imports JAX.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_dump_to={_DUMP} --xla_dump_hlo_as_text").strip()
# XLA dumps only what it compiles: a program loaded from a persistent
# compilation cache (JAX_COMPILATION_CACHE_DIR, which the test suite sets)
# would leave no HLO to name the trace's thunks by.
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
import sampler_bench  # pins the process to --threads CPUs (read from argv)

from paraagent_jax import sampling
from paraagent_jax.sampling import kv_cache

_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+) ([\w-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def parse_instructions(path: str) -> dict:
  """{instruction name: (output shape, JAX op)} of a dumped optimised module."""
  out = {}
  with open(path) as f:
    for line in f:
      m = _INSTR.match(line)
      if not m:
        continue
      name, shape, opcode = m.groups()
      op = _OP_NAME.search(line)
      # The op's last path part ("BTD,DF->BTF/dot_general"), else the opcode.
      label = "/".join(op.group(1).split("/")[-2:]) if op else opcode
      label = label.replace("jit(decode_fn)/", "").replace("while/body/", "")
      out[name] = (shape.split("{")[0], label)
  return out


def _cache_slots(path: str) -> int:
  """Slots of the cache a dumped decode or resize module takes as input.

  Read off its value-cache parameter ([.., S, H], the `cache['v']` leaves).
  """
  with open(path) as f:
    for line in f:
      if " parameter(" in line and "cache[\\'v\\']" in line:
        dims = re.search(r"= \w+\[([\d,]+)\]", line).group(1).split(",")
        return int(dims[-2])
  raise ValueError(f"no cache['v'] parameter in {path}")


def hlo_modules(dump_dir: str, module: str) -> dict:
  """{input cache slots: instructions} of every dumped optimised `module`.

  A sampler compiles one decode (and resize) program per cache size; a
  size compiled twice keeps its last dump.
  """
  files = sorted(glob.glob(os.path.join(
      dump_dir, f"*.{module}.cpu_after_optimizations.txt")))
  if not files:
    raise FileNotFoundError(f"no optimised HLO of {module!r} in {dump_dir}")
  return {_cache_slots(f): parse_instructions(f) for f in files}


def program_runs(events, module: str) -> list:
  """The thunk events of each run of `module`, runs in the order they began."""
  runs = collections.defaultdict(list)
  for e in events:
    args = e.get("args") or {}
    if args.get("hlo_module") == module and "run_id" in args:
      runs[args["run_id"]].append(e)
  return sorted(runs.values(), key=lambda evs: min(e["ts"] for e in evs))


def _slots_as_s(shape: str, slots: int) -> str:
  """`shape` with every dimension equal to `slots` written as S."""
  return re.sub(rf"(?<=[\[,]){slots}(?=[\],])", "S", shape)


def trace_events(trace_dir: str):
  """Complete ("X") events of the perfetto trace `jax.profiler` wrote."""
  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.json.gz"),
                           recursive=True))
  if not files:
    raise FileNotFoundError(f"no perfetto trace under {trace_dir}")
  with gzip.open(files[-1]) as f:
    return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _dense_weights(cfg, seed: int = 0) -> tuple[list, np.ndarray]:
  """Random fp32 weights of the model's dense matmuls: (per-layer dicts, emb)."""
  rs = np.random.RandomState(seed)
  d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  nq, nkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim

  def w(*shape):
    return rs.randn(*shape).astype(np.float32) * 0.02

  layers = [dict(q=w(d, nq), k=w(d, nkv), v=w(d, nkv), o=w(nq, d), g=w(d, f),
                 u=w(d, f), dn=w(f, d)) for _ in range(cfg.num_layers)]
  return layers, w(v, d)


def _dense_step(h0, layers, emb, tile, silu):
  """One decode step's dense matmuls (q, k, v, o, gate, up, down, LM head).

  Written once for both libraries (`tile` and `silu` are theirs); k and v
  feed the sum so that their dots are not dead code.
  """
  h = h0
  nq = layers[0]["q"].shape[1]
  for p in layers:
    q, k, vv = h @ p["q"], h @ p["k"], h @ p["v"]
    h = h + (q + tile(k + vv, nq // p["k"].shape[1])) @ p["o"]
    h = h + (silu(h @ p["g"]) * (h @ p["u"])) @ p["dn"]
  logits = h @ emb.T
  return h0 + 1e-6 * logits[:, :h0.shape[1]]


def _dense_step_out_major(h0, layers, emb):
  """`_dense_step` (JAX) with the MLP and LM head out-major, as the decode's.

  `layers` carry "g_t", "u_t", "dn_t", the transposed gate, up and down.
  """
  h = h0
  nq = layers[0]["q"].shape[1]
  for p in layers:
    q, k, vv = h @ p["q"], h @ p["k"], h @ p["v"]
    h = h + (q + jnp.tile(k + vv, nq // p["k"].shape[1])) @ p["o"]
    a = (jax.nn.silu(jnp.einsum("FD,MD->FM", p["g_t"], h))
         * jnp.einsum("FD,MD->FM", p["u_t"], h))
    h = h + jax.lax.optimization_barrier(jnp.einsum("DF,FM->DM", p["dn_t"], a)).T
  logits_t = jax.lax.optimization_barrier(jnp.einsum("VD,MD->VM", emb, h))
  return h0 + 1e-6 * logits_t[:h0.shape[1]].T


def _median_cpu(fn, repeats: int) -> tuple[float, np.ndarray]:
  """(median CPU seconds of `fn` after a warm-up call, its output as numpy)."""
  out = np.asarray(fn())
  times = []
  for _ in range(repeats):
    start = time.process_time()
    fn()
    times.append(time.process_time() - start)
  return float(np.median(times)), out


def dense_floor(cfg, batch: int, steps: int, repeats: int = 5,
                out_major: bool = False) -> tuple[float, np.ndarray]:
  """Median CPU seconds of `steps` x the model's dense matmuls alone, jitted.

  Returns them with the chain's output (to check the torch peer against).
  `out_major`: the MLP and LM head as the CPU decode step runs them.
  """
  layers, emb = _dense_weights(cfg)
  if out_major:
    for p in layers:
      p.update(g_t=p.pop("g").T.copy(), u_t=p.pop("u").T.copy(),
               dn_t=p.pop("dn").T.copy())
  layers = jax.tree.map(jnp.asarray, layers)
  emb = jnp.asarray(emb)
  if out_major:
    step = lambda i, x: _dense_step_out_major(x, layers, emb)
  else:
    step = lambda i, x: _dense_step(x, layers, emb,
                                    lambda a, n: jnp.tile(a, n), jax.nn.silu)
  run = jax.jit(lambda x: jax.lax.fori_loop(0, steps, step, x))
  x = jnp.asarray(np.random.RandomState(1).randn(batch, cfg.hidden_size)
                  .astype(np.float32) * 0.02)
  return _median_cpu(lambda: jax.block_until_ready(run(x)), repeats)


def torch_dense_floor(cfg, batch: int, steps: int, repeats: int = 5
                      ) -> tuple[float, np.ndarray]:
  """The same chain of matmuls in torch (eager, its threads as set), CPU s."""
  torch = sampler_bench.torch
  layers, emb = _dense_weights(cfg)
  layers = [{k: torch.from_numpy(v) for k, v in p.items()} for p in layers]
  emb = torch.from_numpy(emb)
  x0 = torch.from_numpy(np.random.RandomState(1).randn(batch, cfg.hidden_size)
                        .astype(np.float32) * 0.02)

  def run():
    x = x0
    with torch.no_grad():
      for _ in range(steps):
        x = _dense_step(x, layers, emb, lambda a, n: a.repeat(1, n),
                        torch.nn.functional.silu)
    return x
  return _median_cpu(run, repeats)


def main(argv=None) -> None:
  """Prints the per-op table of one decode call and the dense-matmul floor."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--threads", type=int, default=1,
                      help="CPUs to pin to (read at import, as sampler_bench)")
  parser.add_argument("--top", type=int, default=20, help="table rows")
  parser.add_argument("--cache_steps", type=int, default=None,
                      help="the Sampler's cache_steps (default: its own, as "
                      "sampler_bench; 1: one decode program over the whole "
                      "cache)")
  args = parser.parse_args(argv)

  model = sampler_bench.jax_model_of(sampler_bench._hf_model(0))  # pylint: disable=protected-access
  rows = sampler_bench.prompt_rows(model.config.vocab_size, args.batch,
                                   args.prompt_len)
  sampler = sampling.Sampler(model, args.batch, args.prompt_len + args.new_tokens,
                             cache_steps=args.cache_steps)
  sampler.generate(sampler.prefill(rows), args.new_tokens)      # compiles
  state = sampler.prefill(rows)
  jax.block_until_ready(state.cache)
  first_slots = kv_cache.cache_capacity(state.cache)

  trace_dir = tempfile.mkdtemp(prefix="decode_profile_trace_")
  jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
  start, start_cpu = time.perf_counter(), time.process_time()
  sampler.generate(state, args.new_tokens)
  wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
  jax.profiler.stop_trace()

  events = trace_events(trace_dir)
  decode_runs = program_runs(events, "jit_decode_fn")
  # The call goes through the sizes in order, from the prefilled state's.
  sizes = [c for c in sampler.cache_capacities if c >= first_slots]
  if not decode_runs or len(decode_runs) > len(sizes):
    raise RuntimeError(f"{len(decode_runs)} decode runs in the trace for the "
                       f"cache sizes {sizes}")
  sizes = sizes[:len(decode_runs)]
  decode_modules = hlo_modules(_DUMP, "jit_decode_fn")
  groups, counts = collections.Counter(), collections.Counter()
  for slots, run in zip(sizes, decode_runs):
    instrs = decode_modules[slots]
    for e in run:
      name = e["name"]
      if name not in instrs or name.startswith("while"):
        continue
      shape, label = instrs[name]
      if len(sizes) > 1:
        shape = _slots_as_s(shape, slots)
      groups[(label, shape)] += e["dur"] / 1e6
      counts[(label, shape)] += 1
  resizes = program_runs(events, "jit_resize_cache_fn")
  for old, new, run in zip(sizes, sizes[1:], resizes):
    key = ("resize (copy into the next size)", f"{old} -> {new} slots")
    groups[key] += sum(e["dur"] for e in run
                       if not e["name"].startswith("while")) / 1e6
    counts[key] = None    # a copy between decode programs, not a step's
  total = sum(groups.values())
  floor, x_jax = dense_floor(model.config, args.batch, args.new_tokens)
  floor_om, x_om = dense_floor(model.config, args.batch, args.new_tokens,
                               out_major=True)
  sampler_bench.torch.set_num_threads(args.threads)
  torch_floor, x_torch = torch_dense_floor(model.config, args.batch,
                                           args.new_tokens)
  chain_diff = float(np.max(np.abs(x_jax - x_torch)))
  om_diff = float(np.max(np.abs(x_om - x_jax)))

  print(f"jax {jax.__version__}; batch {args.batch}, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, greedy; pinned to CPUs "
        f"{sampler_bench._CPUS}")  # pylint: disable=protected-access
  print(f"traced generate call: {wall:.4f} s wall, {cpu:.4f} CPU s; thunks "
        f"summed: {total:.4f} s")
  print(f"decode programs at {', '.join(map(str, sizes))} cache slots "
        f"(cache_steps={args.cache_steps}), {len(resizes)} resizes"
        + ("; S in shapes: the cache's slots" if len(sizes) > 1 else ""))
  print()
  print("| op | output shape | s per call | share | thunks per step |")
  print("|---|---|---|---|---|")
  for (label, shape), sec in groups.most_common(args.top):
    n = counts[(label, shape)]
    per_step = "-" if n is None else f"{n / args.new_tokens:.1f}"
    print(f"| {label} | {shape} | {sec:.4f} | {sec / total:.1%} | {per_step} |")
  # The groups left out, summed (not total minus the shown ones: with none
  # left, that difference can round to -0.0000).
  rest = sum(s for _, s in groups.most_common()[args.top:])
  print(f"| (the other {max(len(groups) - args.top, 0)} groups) | - | {rest:.4f} | "
        f"{rest / total:.1%} | - |")
  dots = sum(s for (label, _), s in groups.items() if "dot_general" in label)
  print()
  print("| peer | s per call |")
  print("|---|---|")
  print(f"| dense matmuls alone, bare jitted loop (CPU s, median of 5) | {floor:.3f} |")
  print(f"| the same matmuls in torch, eager (CPU s, median of 5) | {torch_floor:.3f} |")
  print("| the same matmuls, MLP and LM head out-major as the decode's "
        f"(CPU s, median of 5) | {floor_om:.3f} |")
  print(f"| every dot of the decode programs (profiled thunks) | {dots:.3f} |")
  print(f"| the decode call (CPU s) | {cpu:.3f} |")
  print(f"\nthe jitted and torch matmul chains' outputs differ by at most "
        f"{chain_diff:.1e}, the jitted and out-major ones by at most "
        f"{om_diff:.1e} (the same work on each side)")


if __name__ == "__main__":
  main()
