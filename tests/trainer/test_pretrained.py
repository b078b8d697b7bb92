"""The shipped policies (`pretrained/demo_sft`, `pretrained/demo_rl`): intact, loadable, checked.

It is the start of the README's run command, so a damaged file must stop the
run with one line, and the directory must be what the demo config expects.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from paraagent_jax import checksums
from paraagent_jax import config_utils
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.data import copy_stats
from paraagent_jax.models import hf_io

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = os.path.join(ROOT, "pretrained", "demo_sft")


def _demo_config(arg=""):
  return config_utils.load_config(os.path.join(ROOT, "configs", "demo.py") + arg)


def test_shipped_directory_is_intact_and_is_the_demo_default():
  assert checksums.verify_checksums(SHIPPED, required=True)
  listed = [ln.split()[1] for ln in open(os.path.join(SHIPPED, "SHA256SUMS"))]
  assert "model.safetensors" in listed and "tokenizer.json" in listed
  assert "README.md" in listed and "config.json" in listed
  cfg = _demo_config()
  assert cfg.init_from == SHIPPED and cfg.data.tokenizer == SHIPPED
  assert tuple(cfg.pipeline.stages) == ("demos", "rl")
  # The demo config's model keys equal the shipped architecture (they are
  # applied as overrides on top of its config.json).
  model = hf_io.load_hf(SHIPPED)
  for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
              "num_kv_heads", "head_dim"):
    assert getattr(model.config, key) == cfg.model[key], key
  readme = open(os.path.join(SHIPPED, "README.md")).read()
  for needed in ("python -m paraagent_jax.train", "Wall time", "held-out", "SHA256SUMS"):
    assert needed in readme


def test_shipped_policy_matches_transformers_and_its_tokenizer_copies():
  tok = tok_lib.load_tokenizer(SHIPPED)
  assert tok.chat_template == tok_lib.CHAT_TEMPLATE
  text = tok_lib.render_messages([
      {"role": "user", "content": "Task: On Vixelist, find the gym 'sierra'."},
      {"role": "assistant", "content": '<explore> plan\n<call>{"name": "search_tools", '
                                       '"arguments": {"query": "Vixelist search gyms"}}</call>\n</step>'}])
  ids = tok(text, add_special_tokens=False)["input_ids"]
  ours = np.asarray(hf_io.load_hf(SHIPPED)(np.asarray([ids])))
  hf = transformers.AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32)
  with torch.no_grad():
    theirs = hf(torch.tensor([ids])).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)
  row = [{"role": "user", "content": "Task: On Vixelist, find the gym 'sierra'."},
         {"role": "assistant", "content": '<call>{"name": "x", "arguments": '
                                          '{"query": "Vixelist sierra"}}</call>'}]
  assert copy_stats.copy_statistic([{"messages": row}], tok)["copy_statistic"] == 1.0


@pytest.fixture()
def damaged(tmp_path):
  d = tmp_path / "demo_sft"
  shutil.copytree(SHIPPED, d)
  path = d / "model.safetensors"
  data = bytearray(path.read_bytes())
  data[-5] ^= 0x01          # one flipped bit in the last tensor's data
  path.write_bytes(bytes(data))
  return str(d)


@pytest.mark.slow
def test_damaged_copy_is_refused_with_one_line(damaged, tmp_path):
  with pytest.raises(ValueError, match="model.safetensors: checksum mismatch"):
    hf_io.load_hf(damaged)
  tok_dir = tmp_path / "tok"
  shutil.copytree(SHIPPED, tok_dir)
  with open(tok_dir / "tokenizer.json", "a") as f:
    f.write(" ")
  with pytest.raises(ValueError, match="tokenizer.json: checksum mismatch"):
    tok_lib.load_tokenizer(str(tok_dir))
  # The run command with that init: one line on stderr, exit code 1.
  out = subprocess.run(
      [sys.executable, "-m", "paraagent_jax.train",
       f"--config=configs/demo.py:stage=rl,init_from={damaged},data.tokenizer={SHIPPED},"
       "rl.iterations=1", f"--workdir={tmp_path / 'w'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 1, out.stderr[-2000:]
  err = [ln for ln in out.stderr.splitlines() if "error" in ln.lower()]
  assert any("checksum mismatch" in ln and "model.safetensors" in ln for ln in err), out.stderr[-2000:]
  assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_smoke_run_rl_updates_and_reports_spread(tmp_path):
  """configs/demo.py:runlocal: RL from the shipped policy has groups with
  reward spread, so the smoke run's update is real (a 20-step model failed
  every episode alike and RL never updated). In a subprocess, so that its
  memory is returned before the next test."""
  from paraagent_jax import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  assert _demo_config(":runlocal").init_from == SHIPPED
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(
      [sys.executable, "-m", "paraagent_jax.train",
       "--config=configs/demo.py:runlocal,stage=rl,rl.iterations=1,rl.eval_tasks=1,progress=False",
       f"--workdir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "spread " in proc.stdout and "no update" not in proc.stdout, proc.stdout
  (row,) = [r for r in metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
            if "train/loss" in r]
  assert row["train/rollout/traj_spread_groups"] > 0, row
  assert row["train/dropped_episode_frac"] < 1.0 and row["train/grad_norm"] > 0, row
  # The workdir loads back (what evaluate --checkpoint and export_hf do): its
  # architecture is the shipped HF directory's, not the config's preset (the
  # loader dropped init_from and built the preset, which failed to restore).
  from paraagent_jax import rundir  # pylint: disable=g-import-not-at-top
  model, step = rundir.load_model(str(tmp_path))
  assert step == 1
  assert model.config.to_hf_dict() == hf_io.load_hf(SHIPPED).config.to_hf_dict()


SHIPPED_RL = os.path.join(ROOT, "pretrained", "demo_rl")


@pytest.mark.slow
def test_shipped_rl_policy_is_intact_is_demo_sft_after_rl_and_matches_transformers():
  """`pretrained/demo_rl`: checksums hold, the architecture and tokenizer are
  demo_sft's, the weights moved (it is the RL stage's output, not a copy), and
  transformers computes the same logits."""
  assert checksums.verify_checksums(SHIPPED_RL, required=True)
  readme = open(os.path.join(SHIPPED_RL, "README.md")).read()
  for needed in ("python -m paraagent_jax.train", "Wall time", "held-out", "SHA256SUMS",
                 "python -m paraagent_jax.evaluate"):
    assert needed in readme
  rl, sft = hf_io.load_hf(SHIPPED_RL), hf_io.load_hf(SHIPPED)
  assert rl.config == sft.config
  for f in ("tokenizer.json", "chat_template.jinja"):
    assert open(os.path.join(SHIPPED_RL, f)).read() == open(os.path.join(SHIPPED, f)).read()
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  w_rl, w_sft = (load_file(os.path.join(d, "model.safetensors")) for d in (SHIPPED_RL, SHIPPED))
  assert w_rl.keys() == w_sft.keys()
  assert max(float(np.abs(w_rl[k] - w_sft[k]).max()) for k in w_rl) > 1e-4
  ids = [[5, 17, 300, 42, 7, 1000, 12]]
  ours = np.asarray(rl(np.asarray(ids)))
  hf = transformers.AutoModelForCausalLM.from_pretrained(SHIPPED_RL, dtype=torch.float32)
  with torch.no_grad():
    theirs = hf(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)
