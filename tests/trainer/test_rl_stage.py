"""The RL stage end to end on a tiny random model (in-process, 8 CPU devices)."""

import dataclasses
import json
import os

import ml_collections
import pytest

import toolenv
from paraagent_jax.trainer import rl_tasks
from paraagent_jax.trainer import rl_report
from paraagent_jax.trainer import rl as rl_lib
from paraagent_jax.trainer import specs
from paraagent_jax.evaluation import heldout
from paraagent_jax import config_utils
from paraagent_jax import rundir
from paraagent_jax import metrics as metrics_lib
from paraagent_jax.evaluation import paired
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


@pytest.mark.slow
def test_rl_runs_logs_levels_and_checkpoints(tok_dir, tmp_path, config_readers):
  d = str(tmp_path)
  cfg = rl_config(tok_dir, task_sampling="pass_rate", length_buckets="256,512")
  out = rl_lib.run_rl(cfg, d)
  # The whole run (evaluations, the GRPO iteration, checkpoint, report) read
  # its config only at the door: below `specs.rl_spec` nothing reads it.
  assert config_readers["paraagent_jax/trainer/specs.py:rl_spec"] > 0   # reads are seen
  assert not outside_doors(config_readers), sorted(outside_doors(config_readers))
  assert "success" in out and 0.0 <= out["success"] <= 1.0
  recs = metrics_lib.read_jsonl(os.path.join(d, "metrics.jsonl"))
  train = [r for r in recs if "train/rollout/success" in r]
  assert [r["step"] for r in train] == [1]
  for r in train:
    for key in ("traj_reward", "phase_reward", "step_reward"):
      assert f"train/rollout/{key}" in r
    assert "train/loss" in r and "train/grad_norm" in r
    # Per-kind rollout success: what "pass_rate" task sampling reads.
    n = sum(v for k, v in r.items() if k.startswith("train/rollout/n_"))
    assert n == 4 * 2, r
    assert 0.0 <= r["train/rollout/traj_spread_groups"] <= 1.0
    # The update ran on length-sorted micro-batches, each padded to a length
    # bucket (the 2-turn episodes hold ~300-500 tokens, not max_len 768).
    assert r["train/padded_tokens"] < 8 * 768
    # Parse failures and failure causes of the sampled episodes, and the
    # sampler/trainer log-prob gap at the first pass: ~0 on the CPU in fp32
    # (same parameters; only summation order differs between the KV-cache
    # decode and the trainer's forward pass).
    assert 0 <= r["train/rollout/parse_failures"] <= r["train/rollout/steps"]
    assert sum(v for k, v in r.items() if k.startswith("train/rollout/cause/")) <= 1.0
    assert 0.0 <= r["train/rollout/logp_gap_mean"] <= r["train/rollout/logp_gap_max"] < 1e-3
  assert os.path.exists(os.path.join(d, "rl_curve.png"))
  assert os.listdir(os.path.join(d, "checkpoints")) == ["1"]
  # Per-task evaluations before/after on the same tasks, paired; the curve.
  before, after = (paired.read_per_task(os.path.join(d, f)) for f in
                   (rl_report.EVAL_BEFORE_FILE, rl_report.EVAL_AFTER_FILE))
  assert sorted(before) == sorted(after) and len(before) == 2
  with open(os.path.join(d, rl_report.PAIRED_FILE)) as f:
    pr = json.load(f)
  assert pr["tasks"] == 2 and pr["success_after"] == out["success"]
  assert pr["success_before"] == recs[0]["eval/success"] and recs[0]["step"] == 0
  curve = metrics_lib.read_jsonl(os.path.join(d, "rl_curve.jsonl"))
  assert [c["iteration"] for c in curve] == [0, 1]
  assert curve[1]["success"] == train[0]["train/rollout/success"]
  assert curve[1]["eval_success"] == out["success"] and "step_reward" in curve[1]
  report = open(os.path.join(d, "rl_report.md")).read()
  assert "| success |" in report and "paired tasks" in report
  assert "calls / execute step (policy / oracle)" in report
  assert "Failed episodes per cause, before RL -> after RL" in report
  assert "Ran on: " in report
  for rec in recs_after_all(d):
    assert ("cause" in rec) and (rec["cause"] is None) == rec["success"]
  # One solved and one failed transcript per kind where they exist, each
  # starting with the task and showing what the policy wrote.
  recs_after = metrics_lib.read_jsonl(os.path.join(d, rl_report.EVAL_AFTER_FILE))
  assert all(r["transcript"][0]["role"] == "task" for r in recs_after)
  assert "held-out transcript per kind" in report
  for outcome, want in ((": failed\n[task]", False), (": solved\n[task]", True)):
    kinds = {r["kind"] for r in recs_after if r["success"] == want}
    assert report.count(outcome) == len(kinds), (outcome, kinds)
  assert "[assistant] " in report
  # Every evaluation's per-task records; `evaluate --step` reads a checkpoint
  # of the run by its step, with the step in the policy's name.
  assert os.path.exists(os.path.join(d, "eval_it1.jsonl"))
  from paraagent_jax import evaluate  # pylint: disable=g-import-not-at-top
  ec = config_utils.load_config("configs/evaluate.py:runlocal")
  ec.num_per_kind, ec.strategies, ec.kinds = 1, "paraact", "single"
  ev = str(tmp_path / "ev")
  rundir.write_config(cfg, d)          # as the pipeline does for each stage
  assert os.path.exists(os.path.join(d, "machine.json"))
  evaluate.run(ec, ev, checkpoint=d, step=1)
  assert os.listdir(os.path.join(ev, "records")) == [
      f"toolenv-procedural-{os.path.basename(d)}@1-paraact.jsonl"]
  with pytest.raises(config_utils.ConfigError, match="step"):
    evaluate.run(ec, str(tmp_path / "ev2"), checkpoint=d, step=7)
  # Kill/resume and the NaN stop: tests/trainer/test_stage_robustness.py.


def recs_after_all(d):
  return metrics_lib.read_jsonl(os.path.join(d, rl_report.EVAL_AFTER_FILE))


def test_kind_weights_hand_worked():
  hist = [{"train/rollout/success": 0.5, "train/rollout/success_single": 0.5,
           "train/rollout/n_single": 8.0, "train/rollout/success_chain": 0.0,
           "train/rollout/n_chain": 8.0},
          {"eval/success": 0.0},                       # not a rollout record
          {"train/rollout/success": 1.0, "train/rollout/success_single": 1.0,
           "train/rollout/n_single": 2.0}]
  w = rl_tasks.kind_weights(hist, ["single", "chain", "fanout"], group_size=4,
                            window=5, floor=0.05)
  # single: 4 + 2 successes of 10 -> p = 7/12; chain: 0 of 8 -> p = 1/10;
  # fanout unseen -> p = 1/2.
  p = 7 / 12
  assert w["single"] == pytest.approx(1 - p**4 - (1 - p)**4)
  assert w["chain"] == pytest.approx(1 - 0.1**4 - 0.9**4)
  assert w["fanout"] == pytest.approx(1 - 2 * 0.5**4)
  # Only the last `window` rollout records count; the floor holds.
  w1 = rl_tasks.kind_weights(hist, ["single", "chain"], 4, window=1, floor=0.0)
  assert w1["single"] == pytest.approx(1 - 0.75**4 - 0.25**4)   # 2 of 2
  assert w1["chain"] == pytest.approx(1 - 2 * 0.5**4)             # unseen in it
  assert rl_tasks.kind_weights(hist, ["chain"], 4, 5, floor=0.5)["chain"] == 0.5


@pytest.mark.slow
def test_sample_tasks_follows_weights_and_is_deterministic():
  gen = toolenv.TaskGenerator(toolenv.load_catalog("procedural", seed=0), seed=0)
  kinds = ["single", "chain"]
  rr = rl_tasks.TaskSpec(kinds=tuple(kinds), per_iteration=4)
  assert [t.kind for t in rl_tasks.sample_tasks(gen, 1, rr, [])] == [
      "single", "chain", "single", "chain"]
  rr = dataclasses.replace(rr, sampling="pass_rate", floor=0.0, per_iteration=8)
  # single always succeeded (p -> 1, no spread), chain half the time.
  hist = [{"train/rollout/success": 1.0, "train/rollout/success_single": 1.0,
           "train/rollout/n_single": 400.0, "train/rollout/success_chain": 0.5,
           "train/rollout/n_chain": 400.0}]
  a = rl_tasks.sample_tasks(gen, 3, rr, hist)
  b = rl_tasks.sample_tasks(gen, 3, rr, hist)
  assert [t.id for t in a] == [t.id for t in b]
  assert sum(t.kind == "chain" for t in a) >= 7
  assert len({t.id for t in a}) == 8
  # The spec is checked at the stage's door, with the key's name.
  c = config_utils.load_config("configs/sft_tiny.py")
  c.rl.task_sampling = "hardest"
  with pytest.raises(config_utils.ConfigError, match="task_sampling"):
    specs.task_spec(c)


@pytest.mark.slow
def test_behaviour_by_kind_and_oracle_hand_worked():
  recs = [{"kind": "single", "turns": 3, "calls_per_step": [1]},
          {"kind": "single", "turns": 5, "calls_per_step": [1, 2]},
          {"kind": "parallel", "turns": 4, "calls_per_step": []}]
  assert heldout.behaviour_by_kind(recs) == {"single": (4.0, 4 / 3), "parallel": (4.0, 0.0)}
  gen = toolenv.TaskGenerator(toolenv.load_catalog("procedural", seed=0), seed=0)
  task = gen.task(0, "test", "parallel")
  (rec,) = heldout.oracle_records([task])
  # ParaAct oracle of a parallel task: one explore step, one execute step
  # with every call, the answer.
  assert rec["turns"] == 3 and rec["calls_per_step"] == [len(task.nodes)]
  lines = heldout.behaviour_table(recs, [rec])
  assert lines[2].startswith("| parallel | 4.00 | 3.00 | 0.00 |")
  assert lines[3].startswith("| single | 4.00 | nan |")


def test_traj_spread_fraction():
  r = [0, 0, 1, 0,   1, 1, 1, 1,   0, 0, 0, 0]
  assert rl_lib.traj_spread_fraction(r, 4) == pytest.approx(1 / 3)
  assert rl_lib.traj_spread_fraction([1.02, 1.0], 2) == 1.0   # efficiency bonus


def test_no_update_is_said():
  assert "no update" in rl_lib.no_update_note({"dropped_episode_frac": 1.0})
  assert rl_lib.no_update_note({"dropped_episode_frac": 0.5}) == ""
  assert rl_lib.no_update_note({}) == ""


def test_length_buckets_are_checked():
  def cfg(spec):
    return ml_collections.ConfigDict({"length_buckets": spec, "max_len": 2048})
  assert specs.length_buckets(cfg("1024, 1536")) == (1024, 1536, 2048)
  assert specs.length_buckets(cfg("")) == ()
  for bad in ("1024,x", "0,512", "-5"):
    with pytest.raises(config_utils.ConfigError, match="length_buckets"):
      specs.length_buckets(cfg(bad))


def test_missing_tokenizer_is_a_config_error(tmp_path):
  c = rl_config(str(tmp_path / "nope"))
  with pytest.raises(config_utils.ConfigError, match="tokenizer"):
    rl_lib.run_rl(c, str(tmp_path / "w"))


@pytest.mark.slow
def test_kl_reference_is_the_starting_policy_even_after_resume(tok_dir, tmp_path):
  """beta > 0: the frozen reference is where RL started, not where it resumed."""
  d = str(tmp_path)
  c = rl_config(tok_dir, iterations=1, eval_every=0)
  c.rl.grpo.beta = 0.1
  # A random tiny policy gets equal rewards (zero advantages) and runs out of
  # tokens: keep its groups and truncated episodes, and let the entropy bonus
  # move its parameters in iteration 1.
  c.rl.grpo.entropy_coef = 1.0
  c.rl.grpo.drop_no_spread_groups = False
  c.rl.grpo.mask_truncated = False
  c.optimizer.learning_rate = 0.05
  c.optimizer.warmup_steps = 0            # (warmup's first step has lr 0)
  rl_lib.run_rl(c, d)
  c.rl.iterations = 2
  rl_lib.run_rl(c, d)                     # resumes at iteration 1
  recs = metrics_lib.read_jsonl(os.path.join(d, "metrics.jsonl"))
  kl = {r["step"]: r["train/kl"] for r in recs if "train/kl" in r}
  # Iteration 1's single pass runs at the reference parameters themselves:
  # k3 KL exactly 0. After one update (and a restart) the policy has moved
  # away from it, so a reference rebuilt from the resumed state would give 0.
  assert kl[1] == pytest.approx(0.0, abs=1e-7)
  assert kl[2] > 1e-6, kl


def test_rl_optimizer_has_its_own_rate_and_schedule_length(tok_dir):
  c = rl_config(tok_dir, iterations=30)
  c.total_steps = 1400                      # the SFT stage's length
  c.optimizer.learning_rate, c.optimizer.warmup_steps = 3e-3, 20
  o = specs.rl_optimizer_config(c)
  # Without overrides: SFT's rate and warmup, but RL's own number of steps.
  assert (o.learning_rate, o.warmup_steps, o.total_steps) == (3e-3, 20, 30)
  c.rl.learning_rate, c.rl.warmup_steps, c.rl.schedule, c.rl.passes = 2e-4, 0, "constant", 2
  o = specs.rl_optimizer_config(c)
  assert (o.learning_rate, o.warmup_steps, o.total_steps, o.schedule) == (2e-4, 0, 60, "constant")
  c.rl.schedule = "exponential"
  with pytest.raises(config_utils.ConfigError, match="optimizer \\(rl\\)"):
    specs.rl_optimizer_config(c)


def test_learning_curve_running_mean_and_png(tmp_path):
  assert rl_report._running_mean([1, 0, 1, 0, 1, 1], 3) == pytest.approx(
      [1.0, 0.5, 2 / 3, 1 / 3, 2 / 3, 2 / 3])
  # 30 iterations (the thin line + running mean branch) and an evaluation.
  rows = [{"step": i, "train/rollout/success": (i % 3) / 3, "train/rollout/traj_reward": 0.1,
           "train/rollout/phase_reward": 0.5, "train/rollout/step_reward": 0.2}
          for i in range(1, 31)] + [{"step": 30, "eval/success": 0.4}]
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  path = rl_report.save_curve(str(tmp_path))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_train_catalog_seed_trains_on_other_providers(tok_dir, tmp_path, monkeypatch):
  """rl.train_catalog_seed: training tasks (and their env) from another
  catalog seed, held-out evaluation still on catalog_seed's test split."""
  seen = []
  real = rl_tasks.sample_tasks

  def spy(gen, *a, **kw):
    out = real(gen, *a, **kw)
    seen.append((gen.catalog.info.get("seed"), out))
    return out

  monkeypatch.setattr(rl_lib.rl_tasks, "sample_tasks", spy)
  d = str(tmp_path)
  rl_lib.run_rl(rl_config(tok_dir, train_catalog_seed=1, eval_every=0), d)
  (seed, tasks), = seen
  assert seed == 1
  cat0 = toolenv.load_catalog("procedural", seed=0)
  cat1 = toolenv.load_catalog("procedural", seed=1)
  tools = {tool for t in tasks for tool in t.gold_tools}
  assert all(cat1.get(x) is not None for x in tools)
  assert any(cat0.get(x) is None for x in tools)        # names seed 0 does not have
  with open(os.path.join(d, rl_report.RUN_META_FILE)) as f:
    assert json.load(f)["train_catalog_seed"] == 1
  after = metrics_lib.read_jsonl(os.path.join(d, rl_report.EVAL_AFTER_FILE))
  gen0 = toolenv.TaskGenerator(cat0, seed=0)
  want = rl_tasks.draw_tasks(gen0, "test", 0, 2, config_utils.KINDS.split(","))
  assert [t.instruction in r["transcript"][0]["text"] for r, t in zip(after, want)] == [
      True, True]


# The functions that may read a ConfigDict during a stage: the stage's door,
# the spec builders and the config machinery (issue 46: every layer below
# takes typed arguments).
DOORS = ("paraagent_jax/trainer/rl.py:run_rl", "paraagent_jax/trainer/sft.py:run_sft",
         "paraagent_jax/trainer/sft.py:ensure_demonstrations",
         "paraagent_jax/trainer/specs.py:", "paraagent_jax/config_utils.py:",
         "paraagent_jax/rundir.py:model_spec", "paraagent_jax/rundir.py:tokenizer_dir")


def outside_doors(readers) -> set[str]:
  """The package functions among ``readers`` that are not doors (tests may read)."""
  return {r for r in readers if r.startswith(("paraagent_jax/", "toolenv/"))
          and not any(r == d or (d.endswith(":") and r.startswith(d)) for d in DOORS)}
