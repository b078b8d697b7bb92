"""`--dry_run`: abstract state on a (2,2,2) mesh of the 8 test CPU devices.

Bytes per device are checked against a count made here by hand from the tiny
preset's shapes and the sharding each array should get (`DIVISOR` below:
how many ways each parameter is split on data=2 x fsdp=2 x tensor=2), not
from the code's own rules machinery.
"""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from paraagent_jax import config_utils
from paraagent_jax import dry_run

# Slow as a whole: every test needs the dry run's compiled programs (a module fixture).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = ("configs/paraagent_4b.py:runlocal,mesh.data=2,mesh.fsdp=2,"
        "mesh.tensor=2,batch_size=8")

# The tiny preset: vocab 512, hidden 64, mlp 128, 2 layers, 4 heads, 2 kv
# heads, head_dim 16, tied embeddings.
V, D, F, L, N, K, H = 512, 64, 128, 2, 4, 2, 16
# Parameter -> (shape, ways split): matrices over fsdp (embed) x tensor
# (vocab / heads / kv heads / mlp) = 4 ways; norms replicated.
PARAMS = {"embed_tokens": ((V, D), 4), "norm": ((D,), 1)}
for i in range(L):
  PARAMS.update({
      f"{i}.q_proj": ((D, N, H), 4), f"{i}.k_proj": ((D, K, H), 4),
      f"{i}.v_proj": ((D, K, H), 4), f"{i}.o_proj": ((N, H, D), 4),
      f"{i}.gate_proj": ((D, F), 4), f"{i}.up_proj": ((D, F), 4),
      f"{i}.down_proj": ((F, D), 4), f"{i}.attn_norm": ((D,), 1),
      f"{i}.mlp_norm": ((D,), 1), f"{i}.q_norm": ((H,), 1),
      f"{i}.k_norm": ((H,), 1)})
PARAM_BYTES = sum(4 * int(np.prod(s)) // d for s, d in PARAMS.values())
# Rollout cache: [L, B=8 rollouts, S=1024, K, H] f32, batch over data x fsdp
# (4), kv heads over tensor (2); k and v.
KV_BYTES = 2 * 4 * L * (8 // 4) * 1024 * (K // 2) * H


@pytest.fixture(scope="module")
def dry():
  config = config_utils.load_config(os.path.join(ROOT, SPEC))
  lines = []
  report = dry_run.run_dry(config, do_compile=("sft",), out=lines.append,
                           min_array_bytes=0)
  return report, "\n".join(lines)


def printed_bytes(text, label):
  m = re.search(rf"^  {re.escape(label)}\s+[\d.]+\s+([\d,]+) B", text, re.M)
  assert m, f"no {label!r} line in:\n{text}"
  return int(m.group(1).replace(",", ""))


def test_bytes_per_device_match_a_hand_count(dry):
  report, text = dry
  assert PARAM_BYTES == 108032        # worked out once by hand, as a check
  assert report["params"] == PARAM_BYTES
  assert printed_bytes(text, "params (fp32 master)") == PARAM_BYTES
  # AdamW mu and nu mirror the params; the rest are step counters.
  opt = printed_bytes(text, "AdamW state")
  assert 2 * PARAM_BYTES <= opt <= 2 * PARAM_BYTES + 64
  # The cache's lengths vector ([8] int32) may come on top of K and V.
  kv = printed_bytes(text, "KV cache")
  assert KV_BYTES <= kv <= KV_BYTES + 32


def test_shardings_of_the_arrays(dry):
  report, text = dry
  specs = {path: spec for path, _, _, spec, _ in report["arrays"]}
  p = jax.sharding.PartitionSpec
  assert specs["params['embed_tokens'].value"] == p("tensor", "fsdp")
  assert specs["params['layers'][0]['q_proj'].value"] == p("fsdp", "tensor",
                                                           None)
  assert specs["params['layers'][1]['down_proj'].value"] == p("tensor", "fsdp")
  # An unscanned model keeps one cache array per layer (a scanned one a
  # stacked [L, ...]; the model owns the layout): values [B, K, S, H], keys
  # [B, K, H, S] (slots last); rows over data x fsdp, kv heads over tensor,
  # slots whole.
  shapes = {path: shape for path, shape, _, _, _ in report["arrays"]}
  assert f"kv_cache['k'][{L - 1}]" in shapes and f"kv_cache['k'][{L}]" not in shapes
  for name, want in (("k", (8, K, H, 1024)), ("v", (8, K, 1024, H))):
    for i in range(L):
      path = f"kv_cache['{name}'][{i}]"
      shape, spec = shapes[path], tuple(specs[path])
      spec += (None,) * (len(shape) - len(spec))
      assert shape == want, (path, shape)
      assert spec == (("data", "fsdp"), "tensor", None, None), (path, spec)
  assert specs["rl_batch.tokens"] == p(("data", "fsdp"))
  assert "P('tensor', 'fsdp')" in text   # printed, not only returned


def test_programs_lower_and_sft_compiles(dry):
  report, text = dry
  assert not report["errors"], report["errors"]
  assert set(report["programs"]) == {"sft", "rl", "prefill", "decode"}
  sft = report["programs"]["sft"]
  assert sft["temp"] > 0 and sft["args"] >= PARAM_BYTES
  assert "compile_s" not in report["programs"]["rl"]
  # A tiny model fits both chips; the verdict says so.
  assert "v5p (95 GB HBM) (this config's slice): FITS" in text
  assert "v6e (32 GB HBM) on this mesh: FITS" in text
  # Peaks add up: SFT = params + AdamW + its temporaries.
  assert report["peaks"]["sft"] == (report["params"] + report["opt_state"]
                                    + sft["temp"])


def test_kl_runs_with_the_frozen_reference_and_counts_it():
  spec = SPEC + ",rl.grpo.beta=0.01"
  config = config_utils.load_config(os.path.join(ROOT, spec))
  lines = []
  report = dry_run.run_dry(config, do_compile=False, out=lines.append)
  # run_rl passes the frozen starting policy: the step lowers with it, and
  # the RL peak holds a second copy of the parameters (and no KV cache: the
  # rollout releases it before the update).
  assert not report["errors"], report["errors"]
  assert "rl+ref" in report["programs"] and "rl" not in report["programs"]
  temp = report["programs"]["rl+ref"].get("temp", 0)   # 0 when not compiled
  assert report["peaks"]["rl_step"] == (report["params"] * 2 + report["opt_state"]
                                        + temp)
  assert not any("the run would fail" in line for line in lines)


def test_fake_devices_after_backend_start():
  dry_run.set_fake_devices(8)              # conftest's 8: nothing to do
  with pytest.raises(RuntimeError, match="already initialised"):
    dry_run.set_fake_devices(4)


def test_cli_errors_are_one_line():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "paraagent_jax.train", "--dry_run",
       "--config=configs/paraagent_4b.py:slice=v9"], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "paraagent_jax.train: error: slice='v9'")
