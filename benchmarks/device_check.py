"""The Python half of `benchmarks/device_check.sh`: attention parity and MFU.

``attention``: the logits of a random Qwen3 (the 0.6B shape with ``--layers``
layers) through each ``model.attention`` implementation of the platform
against the "reference" einsum path, on a batch with a right-padded row
(only real positions are compared). fp32 models run under full-fp32 matmuls
(``jax.default_matmul_precision("highest")``; a GPU would otherwise use TF32)
and must agree within ``--fp32_tol``. bf16 models are compared with the fp32
reference: a path passes when its error is at most ``--bf16_factor`` times the
bf16 reference path's own error plus ``--bf16_floor``, i.e. it may not be
worse than the einsum path at the same precision. cuDNN is bf16/fp16 only.
``tokamax`` (opt-in package) is checked when it is installed, and named as
skipped when not (`requirements-tokamax.txt`).

``train``: one SFT step and one RL (GRPO) step of a Qwen3 preset with random
weights (`train_step_bench.build_model`, the learner's step builders on a
1x1x1 mesh, a `batch.synthetic_batch`), compiled by a first call and timed
over ``--reps`` calls. Prints tokens/s (all row slots; real tokens apart) and
model FLOPs utilisation against the device's peak dense bf16 FLOP/s
(`PEAK_BF16`): MFU = 6 * N * tokens/s / peak, N = the parameters that do
matmul work per token (the layers and the LM head; not the embedding lookup).
The "+attn" column adds causal attention's 6 * L * n_heads * head_dim * T
FLOPs per token (forward and backward, half of the full T x T scores).

Every result line starts with ``SUMMARY`` (collected by the shell script).
A failed check exits 1.

  python benchmarks/device_check.py attention --layers=4 --seq=1024
  python benchmarks/device_check.py train --preset=qwen3-0.6b --batch=8 --seq=2048
  python benchmarks/device_check.py attention --preset=tiny --seq=64   # CPU smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flax import nnx  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

import train_step_bench
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import sft_loss
from paraagent_jax.learner import step as ts
from paraagent_jax.models import attention as attn
from paraagent_jax.models import qwen3

# Peak dense bf16 FLOP/s (no sparsity) by a substring of `device_kind`, from
# the vendors' data sheets; the first match wins (PCIe before the SXM default).
PEAK_BF16 = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100", 989e12),      # SXM / HBM3
    ("A100", 312e12),
)


def peak_flops(device_kind: str) -> float | None:
  """Peak dense bf16 FLOP/s of a device, or None when it is not in the table."""
  for key, flops in PEAK_BF16:
    if key.lower() in device_kind.lower():
      return flops
  return None


def implementations(platform: str) -> list[str]:
  """The non-reference `model.attention` values worth checking on `platform`."""
  names = ["auto", "chunked", "xla"]
  if platform == "gpu":
    names.append("cudnn")
  if platform == "tpu":
    names.append("splash")
  if importlib.util.find_spec("tokamax") is not None:
    names.append("tokamax")
  return names


# Custom-call targets of the attention kernels in a lowered (StableHLO) program:
# Pallas Mosaic on GPU / TPU, Pallas Triton, cuDNN's fused attention.
KERNEL_MARKERS = (("mosaic", ("mosaic_gpu", "tpu_custom_call")),
                  ("triton", ("xla.gpu.triton",)),
                  ("cudnn", ("cudnn",)))


def kernels_in_hlo(text: str) -> str:
  """The attention kernels a lowered program calls, from its StableHLO text.

  tokamax picks its kernel itself (Mosaic, Triton, cuDNN or XLA); the custom
  calls say which one it took, "xla" when there is none. The lowered text,
  not the compiled one: XLA's GPU compiler adds Triton fusions of its own.
  """
  found = [name for name, markers in KERNEL_MARKERS
           if any(m in text for m in markers)]
  return "+".join(found) or "xla"


def _logits_fn(cfg):
  """A jitted ``(state, ids, mask) -> logits`` of a model with config `cfg`."""
  graphdef = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))))[0]
  return jax.jit(lambda state, ids, mask: nnx.merge(graphdef, state)(ids, mask))


def attention_main(args) -> int:
  """Logits of every implementation vs the reference path; 1 on a failure."""
  platform = jax.default_backend()
  base = qwen3.Qwen3Config.preset(args.preset)
  base = base.replace(num_layers=args.layers or base.num_layers,
                      attention_chunk=min(base.attention_chunk, args.seq))
  state = nnx.split(qwen3.Qwen3(base, rngs=nnx.Rngs(0)))[1]   # fp32 params
  rs = np.random.RandomState(0)
  ids = jnp.asarray(rs.randint(0, base.vocab_size, (args.batch, args.seq)), jnp.int32)
  lengths = np.full((args.batch,), args.seq)
  lengths[1::2] = (3 * args.seq) // 4          # every other row right-padded
  real = np.arange(args.seq)[None] < lengths[:, None]
  mask = jnp.asarray(real, jnp.int32)
  real = jnp.asarray(real)

  def logits(impl, dtype):
    cfg = base.replace(attention=impl, dtype=dtype)
    if dtype == "float32":
      with jax.default_matmul_precision("highest"):
        return _logits_fn(cfg)(state, ids, mask)
    return _logits_fn(cfg)(state, ids, mask)

  def max_diff(a, b):
    return float(jnp.max(jnp.where(real[..., None], jnp.abs(a - b), 0.0)))

  print(f"attention parity on {platform} ({jax.devices()[0].device_kind}): "
        f"qwen3 {args.preset} shape, {base.num_layers} layers, batch {args.batch} x "
        f"{args.seq} tokens (odd rows right-padded to {(3 * args.seq) // 4}), "
        f"random weights; max |logits - reference| over real positions")
  ref32 = logits("reference", "float32")
  ref16 = logits("reference", "bfloat16")
  bf16_ref_err = max_diff(ref16, ref32)
  bf16_tol = args.bf16_factor * bf16_ref_err + args.bf16_floor
  print(f"logits scale: max |reference fp32| = {float(jnp.max(jnp.abs(ref32))):.3f}; "
        f"bf16 reference vs fp32 reference: {bf16_ref_err:.3e}")
  if "tokamax" not in implementations(platform):
    print("tokamax is not installed: attention='tokamax' skipped "
          "(pip install -r requirements-tokamax.txt)")
  print(f"| {'attention':10s} | {'dtype':8s} | resolves to | max abs diff | tolerance | ok |")
  print(f"|{'-' * 12}|{'-' * 10}|-------------|--------------|-----------|----|")
  failures, summary = [], []
  for impl in implementations(platform):
    for dtype in ("float32", "bfloat16"):
      if impl == "cudnn" and dtype == "float32":
        continue                                  # cuDNN attention: bf16/fp16 only
      resolved = attn.resolve(impl, dtype, seq_len=args.seq)
      if impl == "tokamax":
        try:
          with jax.default_matmul_precision(
              "highest" if dtype == "float32" else "default"):
            lowered = _logits_fn(base.replace(attention=impl, dtype=dtype)).lower(
                state, ids, mask)
          resolved = f"tokamax:{kernels_in_hlo(lowered.as_text())}"
        except Exception:  # pylint: disable=broad-except
          pass                                    # the logits call reports it
      try:
        out = logits(impl, dtype)
      except Exception as e:  # pylint: disable=broad-except
        print(f"| {impl:10s} | {dtype:8s} | {resolved:11s} | ERROR: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:200]} |")
        failures.append(f"{impl}/{dtype} raised {type(e).__name__}")
        continue
      diff, tol = ((max_diff(out, ref32), args.fp32_tol) if dtype == "float32"
                   else (max_diff(out, ref32), bf16_tol))
      ok = bool(np.isfinite(diff)) and diff <= tol
      print(f"| {impl:10s} | {dtype:8s} | {resolved:11s} | {diff:12.3e} | {tol:9.2e} | "
            f"{'ok' if ok else 'NO'} |")
      summary.append(f"SUMMARY attention {impl:8s} {dtype:8s} (-> {resolved}): max abs "
                     f"diff {diff:.3e} (tol {tol:.2e}) {'ok' if ok else 'FAIL'}")
      if not ok:
        failures.append(f"{impl}/{dtype} diff {diff:.3e} > {tol:.2e}")
  print("\n".join(summary))
  if failures:
    print("ATTENTION PARITY FAILED: " + "; ".join(failures))
    return 1
  print("attention parity: all implementations within tolerance")
  return 0


def flops_per_token(cfg, n_params: int, seq: int) -> tuple[float, float]:
  """Training FLOPs per token: (6 * matmul params, causal attention scores)."""
  matmul_params = n_params - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size)
  attention = 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq
  return 6.0 * matmul_params, attention


def train_main(args) -> int:
  """Times an SFT and an RL step; prints tokens/s and MFU."""
  overrides = dict(dtype=args.dtype, attention=args.attention,
                   scan_layers=bool(args.scan_layers), remat=args.remat)
  if args.layers:
    overrides["num_layers"] = args.layers
  model, desc = train_step_bench.build_model(0, args.preset, **overrides)
  cfg = model.config
  graphdef, state0 = nnx.split(model)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state0))
  del model, state0
  dev = jax.devices()[0]
  peak = peak_flops(dev.device_kind)
  dense, att = flops_per_token(cfg, n_params, args.seq)
  batch = batch_lib.synthetic_batch(
      0, batch_size=args.batch, seq_len=args.seq, num_steps=16, num_phases=8,
      group_size=4, vocab_size=cfg.vocab_size)
  sft_batch = {"tokens": batch.tokens, "loss_mask": batch.loss_mask,
               "attention_mask": batch.attention_mask}
  slots = args.batch * args.seq
  real = int(np.asarray(batch.attention_mask).sum())
  mesh = train_step_bench._mesh()  # pylint: disable=protected-access
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-5))
  steps = {
      "SFT": (sft_loss.make_sft_train_step(graphdef, optimizer, mesh,
                                           num_micro_batches=args.micro), sft_batch),
      "RL (GRPO)": (grpo.make_train_step(graphdef, optimizer, grpo.GRPOConfig(
          beta=0.04, clip_eps_high=0.28, num_micro_batches=args.micro), mesh), batch),
  }
  print(f"model: {desc}; {n_params / 1e6:.1f}M parameters")
  print(f"device: {dev.device_kind} ({jax.default_backend()}); peak dense bf16 "
        f"{'unknown' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}; batch "
        f"{args.batch} x {args.seq} token slots ({real / slots:.0%} real), "
        f"micro-batches {args.micro}, {args.reps} timed steps after a compiling one")
  print("| step      | compile s | median s | slot tokens/s | real tokens/s | "
        "MFU 6N | MFU 6N+attn |")
  print("|-----------|-----------|----------|---------------|---------------|"
        "--------|-------------|")
  summary = []
  for name, (step, data) in steps.items():
    # A fresh state per step (the steps donate theirs), one at a time in memory.
    state, opt_state = ts.shard_train_state(
        nnx.split(train_step_bench.build_model(0, args.preset, **overrides)[0])[1],
        optimizer, mesh)
    t0 = time.perf_counter()
    state, opt_state, m = step(state, opt_state, data, jax.random.key(0))
    jax.block_until_ready((state, m))
    compile_s = time.perf_counter() - t0
    times = []
    for rep in range(args.reps):
      t0 = time.perf_counter()
      state, opt_state, m = step(state, opt_state, data, jax.random.key(rep + 1))
      jax.block_until_ready((state, m))
      times.append(time.perf_counter() - t0)
    loss = float(m["loss"])
    del state, opt_state
    med = statistics.median(times)
    tps = slots / med
    mfu = "n/a" if peak is None else f"{dense * tps / peak:.1%}"
    mfu_att = "n/a" if peak is None else f"{(dense + att) * tps / peak:.1%}"
    print(f"| {name:9s} | {compile_s:9.1f} | {med:8.3f} | {tps:13,.0f} | "
          f"{real / med:13,.0f} | {mfu:>6s} | {mfu_att:>11s} |")
    summary.append(f"SUMMARY train {name}: {tps:,.0f} tokens/s ({real / med:,.0f} "
                   f"real), MFU {mfu} (6N) / {mfu_att} (6N+attn), step {med:.3f} s, "
                   f"compile {compile_s:.0f} s, loss {loss:.4f}")
    if not np.isfinite(loss):
      print(f"TRAIN STEP FAILED: {name} loss is {loss}")
      return 1
  print("\n".join(summary))
  print(f"FLOPs per token: 6N = {dense / 1e9:.2f} GFLOP (N = {dense / 6e6:.1f}M: layers "
        f"+ LM head, no embedding lookup); causal attention adds {att / 1e9:.2f} GFLOP")
  return 0


def main(argv=None) -> int:
  """Parses the subcommand and runs it."""
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  a = sub.add_parser("attention", help="logits of each implementation vs reference")
  a.add_argument("--preset", default="qwen3-0.6b")
  a.add_argument("--layers", type=int, default=4, help="0: the preset's")
  a.add_argument("--batch", type=int, default=2)
  a.add_argument("--seq", type=int, default=1024)
  a.add_argument("--fp32_tol", type=float, default=1e-4)
  a.add_argument("--bf16_factor", type=float, default=2.0)
  a.add_argument("--bf16_floor", type=float, default=1e-3)
  t = sub.add_parser("train", help="SFT and RL step: tokens/s and MFU")
  t.add_argument("--preset", default="qwen3-0.6b")
  t.add_argument("--layers", type=int, default=0, help="0: the preset's")
  t.add_argument("--batch", type=int, default=8)
  t.add_argument("--seq", type=int, default=2048)
  t.add_argument("--reps", type=int, default=3)
  t.add_argument("--micro", type=int, default=1)
  t.add_argument("--dtype", default="bfloat16", help="compute dtype")
  t.add_argument("--attention", default="auto")
  t.add_argument("--remat", default="none", choices=("none", "full", "dots"))
  t.add_argument("--scan_layers", type=int, default=1, help="1: scan (faster compile)")
  args = ap.parse_args(argv)
  return attention_main(args) if args.cmd == "attention" else train_main(args)


if __name__ == "__main__":
  sys.exit(main())
