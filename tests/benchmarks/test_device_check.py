"""benchmarks/device_check.sh: without a GPU it says so and exits 0; its steps run.

The GPU figures themselves need a GPU. Here the script's plumbing is checked on the
CPU: the no-GPU exit, shellcheck, and (DEVICE_CHECK_ANY_BACKEND=1, tiny shapes) that
each step runs, a failing attention check fails the script, and the summary table
collects the figures.
"""

from importlib import metadata
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from paraagent_jax.models import attention as attn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join("benchmarks", "device_check.sh")
# Tiny shapes: the tiny preset for attention and the train steps, a short sampler run.
TINY = dict(ATTENTION_ARGS="--preset=tiny --layers=0 --batch=2 --seq=64",
            TRAIN_ARGS="--preset=tiny --batch=4 --seq=64 --reps=1",
            SAMPLER_ARGS="--batches=2 --prompt_len=8 --new_tokens=4 --repeats=1")


def _run(timeout=300, **env):
  full_env = dict(os.environ, PYTHON=sys.executable, **env)
  return subprocess.run(["bash", SCRIPT], cwd=ROOT, env=full_env, capture_output=True,
                        text=True, timeout=timeout)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="this machine has a GPU")
def test_without_gpu_says_so_and_exits_0():
  res = _run(timeout=120)
  assert res.returncode == 0, res.stdout + res.stderr
  backend = jax.default_backend()
  assert res.stdout.splitlines()[0] == f"no GPU: jax backend is {backend}; nothing to check"
  assert "==" not in res.stdout          # no step ran


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
  res = subprocess.run(["shellcheck", SCRIPT], cwd=ROOT, capture_output=True, text=True)
  assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
def test_steps_run_and_summary_collects_figures(tmp_path):
  res = _run(DEVICE_CHECK_ANY_BACKEND="1", DEVICE_CHECK_LOGS=str(tmp_path), **TINY)
  out = res.stdout
  assert res.returncode == 0, out + res.stderr
  summary = out[out.index("== device_check summary"):]
  # The versions the steps import, read from the installed metadata.
  versions = next(l for l in out.splitlines() if l.startswith("device_check: versions:"))
  assert f"flax {metadata.version('flax')}," in versions
  assert f"jaxlib {metadata.version('jaxlib')}," in versions
  assert (tmp_path / "versions.log").read_text().strip() == versions
  for step in ("attention", "train", "sampler"):
    assert f"| {step} | ok |" in summary
    assert (tmp_path / f"{step}.log").exists()
  assert f"tokamax {metadata.version('tokamax')}" in versions
  # cuDNN is a GPU path: on the CPU the check covers auto, chunked, xla and the
  # installed tokamax (requirements-test.txt), fp32 and bf16.
  for impl in ("auto", "chunked", "xla", "tokamax"):
    assert summary.count(f"attention {impl} ") == 2
  assert "train SFT:" in summary and "train RL (GRPO):" in summary
  assert "MFU n/a" in summary               # no peak FLOP/s for a CPU
  assert "device_check: all steps passed" in out


@pytest.mark.slow
def test_a_failed_check_fails_the_script(tmp_path):
  # A negative tolerance: every fp32 comparison fails, whatever the numbers.
  res = _run(DEVICE_CHECK_ANY_BACKEND="1", DEVICE_CHECK_LOGS=str(tmp_path),
             DEVICE_CHECK_STEPS="attention",
             ATTENTION_ARGS=TINY["ATTENTION_ARGS"] + " --fp32_tol=-1")
  assert res.returncode == 1, res.stdout + res.stderr
  assert "| attention | FAIL (exit 1) |" in res.stdout
  assert "ATTENTION PARITY FAILED" in res.stdout
  assert "| train |" not in res.stdout      # DEVICE_CHECK_STEPS selected one step


def _device_check_module():
  """benchmarks/device_check.py as a module (benchmarks/ is not a package)."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  import device_check  # pylint: disable=g-import-not-at-top
  return device_check


def test_tokamax_is_checked_only_when_installed(monkeypatch):
  device_check = _device_check_module()
  assert device_check.implementations("gpu") == ["auto", "chunked", "xla", "cudnn",
                                                 "tokamax"]
  real = device_check.importlib.util.find_spec
  monkeypatch.setattr(device_check.importlib.util, "find_spec",
                      lambda name: None if name == "tokamax" else real(name))
  assert device_check.implementations("gpu") == ["auto", "chunked", "xla", "cudnn"]
  assert device_check.implementations("tpu") == ["auto", "chunked", "xla", "splash"]


def test_kernels_in_hlo_names_the_custom_calls():
  device_check = _device_check_module()
  # Hand-written lines in the form of each kernel's custom call in StableHLO.
  assert device_check.kernels_in_hlo(
      '%0 = stablehlo.custom_call @mosaic_gpu(%arg0)') == "mosaic"
  assert device_check.kernels_in_hlo(
      '%0 = stablehlo.custom_call @tpu_custom_call(%arg0)') == "mosaic"
  assert device_check.kernels_in_hlo(
      '%0 = stablehlo.custom_call @__gpu$xla.gpu.triton(%a)') == "triton"
  assert device_check.kernels_in_hlo(
      '%0 = stablehlo.custom_call @__cudnn$fmhaSoftmax(%a) %1 = '
      'stablehlo.custom_call @__gpu$xla.gpu.triton(%b)') == "triton+cudnn"
  # A real program on this CPU: tokamax takes its XLA path, no custom call.
  q = jnp.ones((1, 16, 2, 8))
  text = jax.jit(lambda q: attn.self_attention(
      q, q, q, attention_mask=None, segment_ids=None, impl="tokamax",
      block=8)).lower(q).as_text()
  assert device_check.kernels_in_hlo(text) == "xla"
