r"""Dry run of a training config on a fake CPU mesh: memory and shardings.

  python -m paraagent_jax.train --config=configs/paraagent_4b.py --dry_run \
      --fake_devices=64
  python -m paraagent_jax.train \
      --config=configs/paraagent_4b.py:slice=v6e-64 --dry_run --fake_devices=64

Before any JAX backend use, JAX is made to see N CPU devices
(``jax_num_cpu_devices``). Then, with the trainer's own builders
(`paraagent_jax.rundir.model_config`, `trainer.state.abstract_train_state`, the SFT and
GRPO steps of `paraagent_jax.learner`, and the sampler's jitted prefill/decode of
`paraagent_jax.sampling`):

1. the config's mesh is built (the slice's mesh shape; a slice with fewer
   chips than fake devices uses the first ones);
2. the model and optimizer state are built abstractly (``jax.eval_shape``:
   shapes and shardings, no weights), and the rollout KV cache's sharding is
   read from the compiled ``kv_cache.init_cache``;
3. the SFT step, the RL (GRPO) step, the sampler's prefill chunk and its
   decode loop are lowered with abstract arguments and compiled for the CPU,
   whose ``memory_analysis()`` gives each program's temporary buffers
   (activations, logits, gradients);
4. a per-device table of parameters, AdamW moments, KV cache and each
   program's temporaries is printed, with the peak of each phase and a plain
   verdict against v5p (95 GB HBM per chip) and v6e (32 GB).

The temporaries are XLA:CPU's buffer assignment for the same partitioned
program, an estimate of the TPU's (different fusions and layouts): read them
as "the order of magnitude is right", not to the gigabyte.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Callable, Sequence

# Importing JAX does not start its backend; `set_fake_devices` runs before any
# JAX operation. (Nothing imported here may start it: no toolenv, whose BM25
# library runs a JAX op on import.)
from flax import nnx
import jax
from jax._src import xla_bridge
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import ml_collections
import numpy as np

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import rundir
from paraagent_jax import sampling
from paraagent_jax import sharding as shd
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import sft_loss
from paraagent_jax.learner import step as ts
from paraagent_jax.sampling import kv_cache
from paraagent_jax.sampling import programs
from paraagent_jax.trainer import specs
from paraagent_jax.trainer import state as state_lib

GIB = 2 ** 30
# HBM per chip, in 1e9 bytes, of the TPU generations the configs target.
HBM_GB = {"v5p": 95, "v6e": 32}
LARGE_ARRAY_BYTES = 2 ** 20   # arrays below 1 MiB (global) are not listed


def set_fake_devices(n: int) -> None:
  """Makes JAX see ``n`` CPU devices; call before any JAX backend use.

  Raises:
    RuntimeError: a backend is already initialised with another device count.
  """
  if xla_bridge.backends_are_initialized():
    have = jax.devices()
    if len(have) == n and have[0].platform == "cpu":
      return  # E.g. under tests/conftest.py's 8 CPU devices.
    raise RuntimeError(f"--fake_devices={n}: the JAX backend is already "
                       f"initialised with {len(have)} {have[0].platform} "
                       f"devices; set the devices before any JAX use")
  # XLA:CPU's SPMD partitioner warns about every resharding it replicates;
  # thousands of lines at 64 devices (set TF_CPP_MIN_LOG_LEVEL=0 to see them).
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", n)


# ----------------------------------------------------------------------------
# Abstract arrays and their bytes.
# ----------------------------------------------------------------------------


def sds(shape, dtype, sharding):
  """A ShapeDtypeStruct with a sharding (an abstract jit argument)."""
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def bytes_per_device(x) -> int:
  """Bytes of one device's shard of an abstract (or concrete) array."""
  shape = tuple(x.shape)
  shard = x.sharding.shard_shape(shape) if shape else ()
  return int(np.prod(shard, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def tree_bytes_per_device(tree) -> int:
  """Sum of `bytes_per_device` over a pytree's leaves."""
  return sum(bytes_per_device(x) for x in jax.tree.leaves(tree))


def large_arrays(name: str, tree, min_bytes: int = LARGE_ARRAY_BYTES):
  """(path, shape, dtype, PartitionSpec, bytes/device) of the large leaves."""
  rows = []
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    total = int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
    if total < min_bytes:
      continue
    rows.append((name + jax.tree_util.keystr(path), tuple(x.shape),
                 str(np.dtype(x.dtype)), x.sharding.spec, bytes_per_device(x)))
  return rows


# ----------------------------------------------------------------------------
# The programs a run compiles, with abstract arguments.
# ----------------------------------------------------------------------------


def sft_batch(config, mesh):
  """The abstract SFT batch: [batch_size, seq_len], rows over data x fsdp."""
  shape = (config.batch_size, config.seq_len)
  dtypes = {"tokens": jnp.int32, "loss_mask": jnp.float32,
            "attention_mask": jnp.int32}
  sh = ts.data_sharding(dtypes, mesh)
  return {k: sds(shape, d, sh[k]) for k, d in dtypes.items()}


def rl_batch(config, mesh):
  """The abstract `TrajectoryBatch` of one RL iteration, as the rollout packs it.

  B = tasks_per_iter x group_size episodes of max_len tokens; S = P =
  max_turns (`paraact.rollout`'s default); no ``ref_logprobs`` (the rollout
  does not compute them).
  """
  rl = config.rl
  b, t, s = rl.tasks_per_iter * rl.group_size, rl.max_len, rl.max_turns
  f32, i32 = jnp.float32, jnp.int32
  fields = {
      "tokens": ((b, t), i32), "loss_mask": ((b, t), f32),
      "old_logprobs": ((b, t), f32), "step_id": ((b, t), i32),
      "phase_id": ((b, t), i32), "token_kind": ((b, t), i32),
      "attention_mask": ((b, t), i32), "seq_len": ((b,), i32),
      "step_reward": ((b, s), f32), "step_mask": ((b, s), f32),
      "step_phase_type": ((b, s), i32), "phase_reward": ((b, s), f32),
      "phase_mask": ((b, s), f32), "phase_type": ((b, s), i32),
      "traj_reward": ((b,), f32), "group_id": ((b,), i32),
      "truncated": ((b,), jnp.bool_)}
  sh = ts.data_sharding({k: 0 for k in fields}, mesh)
  return batch_lib.TrajectoryBatch(
      **{k: sds(shape, d, sh[k]) for k, (shape, d) in fields.items()})


def compiled_stats(lowered, do_compile: bool) -> dict[str, Any]:
  """Compile time and per-device buffer sizes of a lowered program."""
  if not do_compile:
    return {}
  start = time.perf_counter()
  compiled = lowered.compile()
  out = {"compile_s": time.perf_counter() - start}
  mem = compiled.memory_analysis()
  if mem is not None:
    out.update(args=mem.argument_size_in_bytes, out=mem.output_size_in_bytes,
               alias=mem.alias_size_in_bytes, temp=mem.temp_size_in_bytes)
  return out


# ----------------------------------------------------------------------------
# The dry run.
# ----------------------------------------------------------------------------


def _mesh_for(config, num_devices: int):
  """The config's mesh over the first devices it needs."""
  sizes = dict(config.mesh)
  need = (math.prod(int(v) for v in sizes.values())
          if -1 not in sizes.values() else num_devices)
  devices = jax.devices()
  if need > len(devices):
    raise config_utils.ConfigError(
        f"mesh {sizes} needs {need} devices; --fake_devices={len(devices)}")
  try:
    return shd.make_mesh(sizes, devices=devices[:need])
  except ValueError as e:
    raise config_utils.ConfigError(f"mesh: {e}") from None


def run_dry(config, *, do_compile: bool | Sequence[str] = True,
            out: Callable[[str], None] = print,
            min_array_bytes: int = LARGE_ARRAY_BYTES) -> dict[str, Any]:
  """Builds, lowers (and compiles) a config's programs; prints the tables.

  Args:
    config: a training config (`paraagent_jax.config_utils.train_defaults`).
    do_compile: compile each program for its buffer sizes (else lower
      only); or the names of the programs to compile.
    out: where lines go.
    min_array_bytes: list the sharding of arrays at least this large.

  Returns:
    Bytes per device: ``params``, ``opt_state``, ``kv_cache``, the programs'
    stats under ``programs`` (``sft``, ``rl``, ``prefill``, ``decode``), the
    phase peaks under ``peaks``, ``errors`` and the listed ``arrays``.
  """
  config = ml_collections.ConfigDict(config.to_dict())
  if config.init_from and not (fileio.isdir(config.init_from)
                               and rundir.is_hf_dir(config.init_from)):
    out(f"dry run: init_from={config.init_from} is not an HF directory here; "
        f"the architecture comes from the preset {config.model.preset}")
    config.init_from = ""
  model_cfg = rundir.model_config(config)
  mesh = _mesh_for(config, len(jax.devices()))
  optimizer = optim.make_optimizer(specs.optimizer_config(config))
  graphdef, abstract, shardings, opt_abs, opt_sh = (
      state_lib.abstract_train_state(mesh, optimizer, model_cfg,
                                     specs.run_spec(config).rules))
  state = ckpt_lib.with_shardings(abstract, shardings)
  opt_state = ckpt_lib.with_shardings(opt_abs, opt_sh)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state))
  out(f"dry run: {config.model.preset} ({n_params / 1e9:.2f}B parameters, "
      f"{model_cfg.param_dtype} weights, {model_cfg.dtype} compute, remat "
      f"{model_cfg.remat}) on mesh {dict(mesh.shape)} of {mesh.size} fake CPU "
      f"devices")
  report: dict[str, Any] = {
      "params": tree_bytes_per_device(state),
      "opt_state": tree_bytes_per_device(opt_state), "programs": {},
      "errors": {}, "mesh": dict(mesh.shape), "num_params": n_params}

  out("programs:")
  lower = _lowerer(report, do_compile, out)
  batch, tbatch = _lower_train_steps(lower, config, mesh, graphdef, optimizer,
                                     state, opt_state)
  cache = _lower_sampler(lower, config, mesh, graphdef, state, report)

  m = min_array_bytes
  report["arrays"] = (large_arrays("params", state, m)
                      + large_arrays("adamw", opt_state, m)
                      + large_arrays("kv_cache", cache, m)
                      + large_arrays("sft_batch", batch, m)
                      + large_arrays("rl_batch", tbatch, m))
  print_arrays(report["arrays"], out, m)
  report["activations"] = largest_activations(config, model_cfg, mesh)
  report["peaks"] = phase_peaks(report)
  print_table(report, config, out)
  return report


def _lowerer(report, do_compile: bool | Sequence[str],
             out: Callable[[str], None]):
  """`lower(name, fn)`: lowers (and compiles) the program `fn` returns;
  records its stats in ``report["programs"]`` or its error in
  ``report["errors"]``."""

  def lower(name, fn):
    start = time.perf_counter()
    try:
      lowered = fn()
    except (ValueError, TypeError) as e:
      report["errors"][name] = " ".join(str(e).split())
      out(f"  {name:8} FAILS to lower: {report['errors'][name]}")
      return
    stats = {"lower_s": time.perf_counter() - start}
    compile_it = (do_compile if isinstance(do_compile, bool)
                  else name in do_compile)
    stats.update(compiled_stats(lowered, compile_it))
    report["programs"][name] = stats
    extra = (f", compiled in {stats['compile_s']:.1f}s, temp "
             f"{stats.get('temp', 0) / GIB:.2f} GiB/device"
             if "compile_s" in stats else "")
    out(f"  {name:8} lowered in {stats['lower_s']:.1f}s{extra}")

  return lower


def _replicated(mesh, shape, dtype):
  """An abstract array of `shape` replicated over `mesh`."""
  return sds(shape, dtype, NamedSharding(mesh, PartitionSpec()))


def _lower_train_steps(lower, config, mesh, graphdef, optimizer, state,
                       opt_state):
  """Lowers the SFT and RL steps as the trainer builds and calls them;
  returns their abstract batches."""
  rng = _replicated(mesh, (2,), jnp.uint32)    # jax.random.PRNGKey
  # SFT: the step run_sft builds (make_sft_train_step over the same loss).
  state_lib.check_batch_divides(config.batch_size, config.num_micro_batches, mesh)
  sft = ts.build_train_step(graphdef, optimizer, sft_loss.SFT_LOSS_FNS, mesh,
                            num_micro_batches=config.num_micro_batches)
  batch = sft_batch(config, mesh)
  lower("sft", lambda: sft.jitted(state, opt_state, batch).lower(
      state, opt_state, batch, rng, None))

  # RL: the step run_rl builds, called as it calls it (with its frozen
  # reference state when the KL term is on).
  rl_step = grpo.make_train_step(graphdef, optimizer, specs.grpo_config(config), mesh)
  tbatch = rl_batch(config, mesh)
  ref = state if config.rl.grpo.beta > 0 else None
  lower("rl" if ref is None else "rl+ref",
        lambda: rl_step.jitted(state, opt_state, tbatch, ref).lower(
            state, opt_state, tbatch, rng, ref))
  return batch, tbatch


def _lower_sampler(lower, config, mesh, graphdef, state, report):
  """Lowers the rollout's prefill and decode programs (the Sampler that
  JaxPolicy builds, over all episodes of an iteration, worst case: the whole
  cache attended to); records the KV cache's bytes and returns it."""
  rl = config.rl
  rows = rl.tasks_per_iter * rl.group_size
  model = nnx.merge(graphdef, state)
  sampler = sampling.Sampler(model, rows, rl.max_len, min_chunk=32,
                             max_chunk=512)
  cache_fn = jax.jit(lambda: kv_cache.init_cache(model, rows, rl.max_len))
  cache_compiled = cache_fn.lower().compile()
  cache = jax.tree.map(lambda a, s: sds(a.shape, a.dtype, s),
                       jax.eval_shape(cache_fn), cache_compiled.output_shardings)
  report["kv_cache"] = tree_bytes_per_device(cache)
  logits = _replicated(mesh, (rows, model.config.vocab_size), jnp.float32)
  ids = _replicated(mesh, (rows, sampler.max_chunk), jnp.int32)
  per_row = _replicated(mesh, (rows,), jnp.int32)
  lower("prefill", lambda: programs.APPEND_JIT.lower(
      graphdef, state, cache, logits, ids, per_row))
  n_buf = max(sampler.min_decode, 1 << max(0, rl.max_turn_tokens - 1).bit_length())
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = _replicated(mesh, key.shape, key.dtype)
  stops = _replicated(mesh, (2, 2), jnp.int32)
  stop_mask = _replicated(mesh, (2, 2), jnp.bool_)
  scalar = _replicated(mesh, (), jnp.float32)
  loop = jax.tree.map(
      lambda a: _replicated(mesh, np.shape(a), a.dtype),
      programs.decode_loop_init(np.zeros(rows, np.int32), n_buf, 2, 0))
  lower("decode", lambda: programs.DECODE_JIT.lower(
      graphdef, state, cache, logits, key, loop, per_row, stops, stop_mask,
      scalar, scalar, greedy=False, top_k=int(rl.top_k),
      use_top_p=float(rl.top_p) < 1.0, pad_id=0))
  return cache


def largest_activations(config, model_cfg, mesh) -> dict[str, int]:
  """Bytes per device of the biggest single activations, counted by hand.

  Attention scores are fp32 [B, N, T, S] per layer with the dense paths
  (`model.attention` "reference" or "xla") and one [B, N, block, block] tile
  with the chunked/splash kernels; the loss's fp32 logits are [B, T, V], or
  [B, logits_chunk, V] with chunked log-probs. B is a micro-batch's rows on
  one device, N the heads on one device.
  """
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  tp = mesh.shape["tensor"]
  heads = (model_cfg.num_heads // tp if model_cfg.num_heads % tp == 0
           else model_cfg.num_heads)
  vocab = (model_cfg.vocab_size // tp if model_cfg.vocab_size % tp == 0
           else model_cfg.vocab_size)
  dense = model_cfg.attention in ("reference", "xla")
  rl = config.rl
  out = {}
  rl_micro = specs.rl_micro_batches(config)
  for name, rows, t, m in (
      ("sft", config.batch_size, config.seq_len, config.num_micro_batches),
      ("rl", rl.tasks_per_iter * rl.group_size, rl.max_len, rl_micro)):
    per = max(rows // (max(int(m), 1) * dp), 1)
    q = k = t if dense else min(model_cfg.attention_chunk, t)
    what = "1 layer" if dense else f"1 tile of {q}"
    out[f"{name} attention scores ({what})"] = 4 * per * heads * q * k
    lt = model_cfg.logits_chunk or t
    out[f"{name} logits ({min(lt, t)} positions)"] = 4 * per * min(lt, t) * vocab
  rows = max(rl.tasks_per_iter * rl.group_size // dp, 1)
  block = min(model_cfg.attention_chunk, rl.max_len)
  out[f"prefill attention scores (chunk 512 x {block} slots)"] = (
      4 * rows * heads * 512 * block)
  return out


def phase_peaks(report) -> dict[str, int]:
  """Bytes per device at the peak of each phase of a run.

  SFT holds params + AdamW + the step's temporaries. The rollout adds the KV
  cache and the sampler's temporaries. The RL step runs after the rollout has
  released the cache (`paraact.policies.JaxPolicy.release`).
  """
  base = report["params"] + report["opt_state"]
  progs = report["programs"]
  temp = lambda name: progs.get(name, {}).get("temp", 0)
  peaks = {"sft": base + temp("sft"),
           "rollout": base + report["kv_cache"] + max(temp("prefill"),
                                                      temp("decode"))}
  rl_name = "rl" if "rl" in progs else "rl+ref"
  if rl_name in progs:
    ref = report["params"] if rl_name == "rl+ref" else 0
    peaks["rl_step"] = base + ref + temp(rl_name)
  return peaks


def print_arrays(rows, out, min_bytes: int = LARGE_ARRAY_BYTES) -> None:
  """The sharding of every large array."""
  out(f"arrays of at least {min_bytes / 2 ** 20:g} MiB:")
  out(f"  {'array':58} {'shape':28} {'dtype':8} {'PartitionSpec':34} "
      f"{'MiB/device':>10}")
  for path, shape, dtype, spec, nbytes in rows:
    out(f"  {path[:58]:58} {str(shape):28} {dtype:8} {str(spec):34} "
        f"{nbytes / 2 ** 20:10.1f}")


def print_table(report, config, out) -> None:
  """The per-device memory table and the HBM verdicts."""
  gib = lambda b: f"{b / GIB:8.2f} {b:>16,d} B"
  progs = report["programs"]
  out("memory per device (GiB):")
  out(f"  params (fp32 master)      {gib(report['params'])}")
  out(f"  AdamW state               {gib(report['opt_state'])}")
  rl = config.rl
  out(f"  KV cache                  {gib(report['kv_cache'])}   "
      f"({rl.tasks_per_iter * rl.group_size} rollouts x {rl.max_len} slots)")
  for name, stats in progs.items():
    if "temp" in stats:
      out(f"  {name + ' temporaries':25} {gib(stats['temp'])}   (XLA:CPU)")
  for name, err in report["errors"].items():
    out(f"  {name}: does not lower: {err}")
  out("largest single activations per device (fp32, counted from shapes):")
  for name, b in report.get("activations", {}).items():
    out(f"  {name:44} {b / GIB:8.2f} GiB")
  peaks = report["peaks"]
  if not any("temp" in s for s in progs.values()):
    out("  (not compiled: activations not counted)")
  for name, b in peaks.items():
    out(f"  peak {name:20} {gib(b)}")
  worst = max(peaks, key=peaks.get)
  slice_name = config.get("slice", "")
  for chip, hbm in HBM_GB.items():
    fits = peaks[worst] <= hbm * 1e9
    mark = (" (this config's slice)" if slice_name.startswith(chip)
            else " on this mesh")
    if fits:
      out(f"  {chip} ({hbm} GB HBM){mark}: FITS, worst phase {worst} "
          f"{peaks[worst] / 1e9:.1f} GB")
    else:
      over = [f"{k} {v / 1e9:.1f} GB" for k, v in peaks.items() if v > hbm * 1e9]
      out(f"  {chip} ({hbm} GB HBM){mark}: does NOT fit: {', '.join(over)} "
          f"> {hbm} GB")
  if report["errors"]:
    out("  the run would fail: " + "; ".join(report["errors"]))


def main(config, fake_devices: int = 0) -> int:
  """``train --dry_run`` entry point on a loaded config; returns the exit code
  (0 ok, 1 error)."""
  try:
    sizes = dict(config.mesh)
    n = fake_devices or (math.prod(int(v) for v in sizes.values())
                         if -1 not in sizes.values() else 8)
    set_fake_devices(n)
    report = run_dry(config)
  except (config_utils.ConfigError, RuntimeError) as e:
    print(f"paraagent_jax.train: error: {' '.join(str(e).split())}",
          file=sys.stderr)
    return 1
  return 1 if report["errors"] else 0
