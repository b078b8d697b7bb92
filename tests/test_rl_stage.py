"""The RL stage end to end on a tiny random model (in-process, 8 CPU devices)."""

import os

import pytest

import toolenv
from paraagent_jax import config_utils
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import rl_stage
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.paraact import protocol


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("tok"))
  cat = toolenv.load_catalog("procedural", seed=0)
  tasks = toolenv.TaskGenerator(cat, seed=0).generate(40, split="train")
  texts = [protocol.system_prompt()] + [t.instruction for t in tasks]
  texts += [protocol.render_step(s) for t in tasks for s in toolenv.oracle.solve(t)]
  tok_lib.train_bpe_tokenizer(texts, vocab_size=700, out_dir=d)
  return d


def rl_config(tok_dir, **rl):
  c = config_utils.load_config("configs/sft_tiny.py")
  c.stage = "rl"
  c.model.vocab_size = 0
  c.progress = False
  c.tensorboard = False
  c.ckpt_every = 1
  c.optimizer.learning_rate = 1e-3
  c.rl.tokenizer = tok_dir
  c.rl.iterations = 1
  c.rl.tasks_per_iter = 4
  c.rl.group_size = 2
  c.rl.max_turns = 2
  c.rl.max_turn_tokens = 12
  c.rl.max_len = 768
  c.rl.max_obs_tokens = 64
  c.rl.eval_tasks = 2
  c.rl.eval_every = 1
  for k, v in rl.items():
    c.rl[k] = v
  return c


def test_rl_runs_logs_levels_and_checkpoints(tok_dir, tmp_path):
  d = str(tmp_path)
  out = rl_stage.run_rl(rl_config(tok_dir), d)
  assert "success" in out and 0.0 <= out["success"] <= 1.0
  recs = metrics_lib.read_jsonl(os.path.join(d, "metrics.jsonl"))
  train = [r for r in recs if "train/rollout/success" in r]
  assert [r["step"] for r in train] == [1]
  for r in train:
    for key in ("traj_reward", "phase_reward", "step_reward"):
      assert f"train/rollout/{key}" in r
    assert "train/loss" in r and "train/grad_norm" in r
  assert os.path.exists(os.path.join(d, "rl_curve.png"))
  assert os.listdir(os.path.join(d, "checkpoints")) == ["1"]
  # Kill/resume and the NaN stop: tests/test_stage_robustness.py.


def test_missing_tokenizer_is_a_config_error(tmp_path):
  c = rl_config(str(tmp_path / "nope"))
  with pytest.raises(config_utils.ConfigError, match="tokenizer"):
    rl_stage.run_rl(c, str(tmp_path / "w"))
