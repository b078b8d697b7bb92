"""Kill/resume of the RL stage and the NaN stop of SFT and RL.

The RL runs are real ``python -m paraagent_jax.train`` subprocesses on a
tiny random Qwen3 (one CPU device each). They share a JAX compilation cache
in a temporary directory, so only the first one pays for compiling. The
model never solves a task, so GRPO's advantages are zero; an entropy bonus
gives every iteration a gradient that depends on the sampled tokens, so the
final parameters change whenever an iteration's sampling seed, batch or
starting parameters do.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import toolenv
from paraagent_jax.trainer import sft as sft_lib
from paraagent_jax.trainer import rl as rl_lib
from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.paraact import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "sft_tiny.py")
ITERATIONS = 4
# Evaluations before RL (iteration 0), at iteration 2 and at the end.
EVAL_STEPS = [0, 2, 4]


def rl_args(tok_dir, **extra):
  args = {
      "stage": "rl", "model.vocab_size": 0, "progress": False,
      "tensorboard": False, "keep_ckpts": 0,
      "optimizer.learning_rate": 1e-2, "optimizer.warmup_steps": 0,
      "rl.tokenizer": tok_dir, "rl.iterations": ITERATIONS,
      "rl.tasks_per_iter": 2, "rl.group_size": 2, "rl.max_turns": 2,
      "rl.max_turn_tokens": 12, "rl.max_len": 512, "rl.max_obs_tokens": 64,
      "rl.eval_tasks": 4, "rl.eval_every": 2, "rl.ckpt_every": 1,
      "rl.grpo.entropy_coef": 0.01, "rl.grpo.drop_no_spread_groups": False,
      # Plain GRPO: the ablation switch is carried end to end here too.
      "rl.grpo.levels": "traj"}
  args.update(extra)
  return ",".join(f"{k}={v}" for k, v in args.items())


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("tok"))
  cat = toolenv.load_catalog("procedural", seed=0)
  tasks = toolenv.TaskGenerator(cat, seed=0).generate(40, split="train")
  texts = [protocol.system_prompt()] + [t.instruction for t in tasks]
  texts += [protocol.render_step(s) for t in tasks
            for s in toolenv.oracle.solve(t)]
  tok_lib.train_bpe_tokenizer(texts, vocab_size=700, out_dir=d)
  return d


@pytest.fixture(scope="module")
def env():
  # The run's compilation cache (tests/conftest.py) comes with os.environ.
  e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  e.pop("XLA_FLAGS", None)  # One device, like a plain command line.
  return e


def cmd(tok_dir, workdir, **extra):
  return [sys.executable, "-m", "paraagent_jax.train",
          f"--config={TINY}:{rl_args(tok_dir, **extra)}",
          f"--workdir={workdir}"]


def run(env, command, check=True):
  proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=2400)
  if check:
    assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def model_leaves(workdir, step):
  path = os.path.join(workdir, "checkpoints", str(step), "model")
  return jax.tree.leaves(ocp.StandardCheckpointer().restore(path))


def records(workdir):
  """metrics.jsonl without the wall-clock timings."""
  recs = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return [{k: v for k, v in r.items() if not k.startswith("train/time/")}
          for r in recs]


def checkpoint_meta(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "meta",
                         "metadata")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def reference(tok_dir, env, tmp_path_factory):
  """An uninterrupted run (it also fills the compilation cache)."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  out = run(env, cmd(tok_dir, workdir))
  assert "scratch at iteration 0/4" in out.stdout
  # The ablation setting reached the run: printed, in its metadata.
  assert "levels ('traj',)" in out.stdout
  with open(os.path.join(workdir, "rl_run.json")) as f:
    assert json.load(f)["levels"] == ["traj"]
  return workdir


@pytest.mark.slow
def test_sigint_saves_the_iteration_and_rerun_ends_like_an_uninterrupted_run(
    tok_dir, env, reference, tmp_path):
  """Ctrl-C in RL: the iteration under way finishes and is saved, one line,
  exit 130; the rerun resumes from it and ends bit for bit like the reference."""
  workdir = str(tmp_path / "interrupted")
  proc = subprocess.Popen(cmd(tok_dir, workdir), cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  deadline = time.monotonic() + 2400
  while not os.path.isdir(os.path.join(workdir, "checkpoints", "1")):
    assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
    time.sleep(0.02)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=2400)
  lines = [l for l in err.splitlines() if l.strip()]
  assert proc.returncode == 130 and len(lines) == 1, err[-3000:]
  it = int(lines[0].split("interrupted at rl iteration ")[1].split(";")[0])
  assert lines[0].endswith(f"rerun the same command to resume from iteration {it}")
  assert 1 <= it < ITERATIONS, "the interrupt landed after the run ended"
  assert ckpt_lib.Checkpointer(workdir).all_steps()[-1] == it
  out = run(env, cmd(tok_dir, workdir))
  assert f"resumed at iteration {it}/" in out.stdout
  for a, b in zip(model_leaves(reference, ITERATIONS), model_leaves(workdir, ITERATIONS)):
    np.testing.assert_array_equal(a, b)
  assert records(workdir) == records(reference)


@pytest.mark.slow
def test_sigkill_mid_run_and_rerun_ends_exactly_like_an_uninterrupted_run(
    tok_dir, env, reference, tmp_path):
  workdir = str(tmp_path / "killed")
  first = os.path.join(workdir, "checkpoints", "1")
  rng = np.random.default_rng()
  longest = 1.0           # seconds after the first checkpoint
  for _ in range(6):
    shutil.rmtree(workdir, ignore_errors=True)
    proc = subprocess.Popen(cmd(tok_dir, workdir), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 2400
    while not os.path.isdir(first) and proc.poll() is None:
      assert time.monotonic() < deadline, "no checkpoint appeared"
      time.sleep(0.02)
    # Anywhere in iteration 2 or later: mid-rollout, mid-step, mid-save.
    time.sleep(rng.uniform(0.0, longest))
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before the kill"
    if ckpt_lib.Checkpointer(workdir).all_steps()[-1] < ITERATIONS:
      break
    # The kill landed after the last save (the run was finishing): the
    # iterations were quicker than `longest`; kill sooner.
    longest /= 4
  else:
    pytest.fail("every kill landed after the last checkpoint")

  out = run(env, cmd(tok_dir, workdir))
  resumed = int(out.stdout.split("resumed at iteration ")[1].split("/")[0])
  print(f"killed run resumed at iteration {resumed}")
  assert 1 <= resumed < ITERATIONS
  # Only the iterations after the checkpoint ran again.
  ran = [int(line.split()[2].split("/")[0]) for line in out.stdout.splitlines()
         if line.startswith("rl: it ")]
  assert ran == list(range(resumed + 1, ITERATIONS + 1))

  # Same parameters, bit for bit, and the update really moved them.
  ref_final = model_leaves(reference, ITERATIONS)
  for a, b in zip(ref_final, model_leaves(workdir, ITERATIONS)):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in
             zip(model_leaves(reference, 1), ref_final))
  # The curve: every iteration once, the same values, the same evaluations.
  got, ref = records(workdir), records(reference)
  assert [r["step"] for r in got if "train/loss" in r] == [1, 2, 3, 4]
  assert [r["step"] for r in got if "eval/success" in r] == EVAL_STEPS
  assert got == ref
  with open(os.path.join(workdir, "rl_eval.json")) as f, open(
      os.path.join(reference, "rl_eval.json")) as g:
    assert json.load(f) == json.load(g)
  # No half-written step: every listed step is complete, no temp dirs left.
  ckpt_dir = os.path.join(workdir, "checkpoints")
  assert ckpt_lib.Checkpointer(workdir).all_steps() == [1, 2, 3, 4]
  assert sorted(os.listdir(ckpt_dir)) == ["1", "2", "3", "4"]
  meta = checkpoint_meta(workdir, ITERATIONS)
  assert meta["data"]["iteration"] == ITERATIONS
  assert meta["data"]["meta"]["levels"] == ["traj"]
  assert meta["data"]["history"] == metrics_lib.read_jsonl(
      os.path.join(workdir, "metrics.jsonl"))

  # Training on past the end (rl.iterations=5) with a NaN injected at the
  # new step: a one-line stop naming step, metric and the last good
  # checkpoint, which is neither overwritten nor followed by a new one.
  proc = run(env, cmd(tok_dir, workdir, **{"rl.iterations": 5,
                                           "debug.nan_at_step": 5}),
             check=False)
  assert "resumed at iteration 4/5" in proc.stdout
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  good = os.path.join(workdir, "checkpoints", "4")
  assert proc.stderr.strip().splitlines()[-1] == (
      f"paraagent_jax.train: error: NaN/Inf in 'loss' at step 5 "
      f"(rl iteration 5, pass 1/1); last good checkpoint: {good} "
      f"(not overwritten)")
  assert sorted(os.listdir(ckpt_dir)) == ["1", "2", "3", "4"]
  assert records(workdir) == ref  # Nothing of the NaN iteration logged.
  for a, b in zip(ref_final, model_leaves(workdir, ITERATIONS)):
    np.testing.assert_array_equal(a, b)


def test_resume_refuses_other_levels_and_rebuilds_the_curve(tmp_path):
  history = [{"step": 0, "eval/success": 0.25},
             {"step": 1, "train/loss": 0.5},
             {"step": 2, "train/loss": 0.25}, {"step": 2, "eval/success": 0.5}]
  state = {"iteration": 2, "meta": {"levels": ["traj"]}, "history": history}
  # metrics.jsonl written past the checkpoint (a kill after logging
  # iteration 3), with a line cut short: replaced by the checkpoint's.
  path = tmp_path / "metrics.jsonl"
  path.write_text(json.dumps({"step": 3, "train/loss": 9.0}) + "\n{\"step\": 4")
  it, got = rl_lib.resume_history(("traj",), state, str(tmp_path))
  assert it == 2 and got == history
  assert metrics_lib.read_jsonl(str(path)) == history
  assert rl_lib.last_eval(got) == {"success": 0.5}
  assert rl_lib.last_eval(got[:2]) == {"success": 0.25}
  with pytest.raises(config_utils.ConfigError,
                     match="trained with rl.grpo.levels=traj; this config "
                           "says traj,phase,step"):
    rl_lib.resume_history(("traj", "phase", "step"), state, str(tmp_path))
  # A checkpoint from before the history was stored keeps the file's
  # records up to its iteration.
  path.write_text("".join(json.dumps(r) + "\n" for r in history))
  assert rl_lib.resume_history(("traj",), {"iteration": 1},
                                 str(tmp_path)) == (1, history[:2])
  assert metrics_lib.read_jsonl(str(path)) == history[:2]
  # A fresh run (no checkpoint) starts with an empty curve.
  assert rl_lib.resume_history(("traj",), None, str(tmp_path)) == (0, [])
  assert metrics_lib.read_jsonl(str(path)) == []


def test_rollout_seeds_depend_on_key_and_iteration_only():
  key = jax.random.PRNGKey(0)
  seeds = [rl_lib.iteration_seed(key, it) for it in range(1, 6)]
  assert len(set(seeds)) == 5
  assert seeds == [rl_lib.iteration_seed(jax.random.PRNGKey(0), it)
                   for it in range(1, 6)]
  assert rl_lib.iteration_seed(jax.random.PRNGKey(1), 1) != seeds[0]


@pytest.mark.slow
def test_sft_nan_stops_naming_step_metric_and_last_good_checkpoint(tmp_path):
  base = ("progress=False,tensorboard=False,eval_every=0,total_steps=8,"
          "ckpt_every=3,log_every=4,keep_ckpts=0")
  workdir = str(tmp_path)
  c = config_utils.load_config(f"{TINY}:{base},debug.nan_at_step=5")
  with pytest.raises(metrics_lib.NonFiniteError) as e:
    sft_lib.run_sft(c, workdir)
  # Step 5 is neither a logging nor a saving step: the per-step check
  # names it exactly (not the next logging step, 8).
  good = os.path.join(workdir, "checkpoints", "3")
  assert str(e.value) == (f"NaN/Inf in 'loss' at step 5; last good "
                          f"checkpoint: {good} (not overwritten)")
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["3"]
  leaves = model_leaves(workdir, 3)
  assert all(np.isfinite(x).all() for x in leaves)
  # Without the hook the same workdir resumes from it and finishes.
  out = sft_lib.run_sft(config_utils.load_config(f"{TINY}:{base}"), workdir)
  assert np.isfinite(out["loss"])
  assert ckpt_lib.Checkpointer(workdir).all_steps() == [3, 6, 8]


def test_check_finite_names_loss_first_and_says_when_nothing_was_saved():
  with pytest.raises(metrics_lib.NonFiniteError) as e:
    metrics_lib.check_finite(7, {"a": float("inf"), "loss": float("nan"),
                                 "b": 1.0}, lambda: None, context="x")
  assert str(e.value) == ("NaN/Inf in 'loss' at step 7 (x); last good "
                          "checkpoint: none (no checkpoint was written yet)")
  with pytest.raises(metrics_lib.NonFiniteError, match="in 'grad_norm' at"):
    metrics_lib.check_finite(1, {"grad_norm": float("-inf"), "loss": 2.0},
                             "/c/1")
  metrics_lib.check_finite(1, {"loss": 2.0}, None)  # Finite: no error.


@pytest.mark.slow
def test_sigkill_on_a_bucket_and_rerun_ends_like_the_local_run(
    tok_dir, env, reference, gcs_bucket, tmp_path):
  """The kill/resume above with ``--workdir=gs://...`` (a GCS emulator):
  the rerun resumes from the bucket's last complete checkpoint and ends
  with the same parameters and metrics as the local uninterrupted run; no
  local ``gs:`` folder appears."""
  from paraagent_jax import fileio
  from tests.gcs_emulator import emulator_env
  genv = emulator_env(env)
  workdir = f"{gcs_bucket}/run"
  proc = subprocess.Popen(cmd(tok_dir, workdir), cwd=str(tmp_path), env=genv,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 2400
  while ckpt_lib.saved_steps(f"{workdir}/checkpoints") == [] and proc.poll() is None:
    assert time.monotonic() < deadline, "no checkpoint appeared"
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL, "the run ended before the kill"
  saved = ckpt_lib.Checkpointer(workdir).all_steps()
  assert not saved or saved[-1] < ITERATIONS, saved

  out = run(genv, cmd(tok_dir, workdir))
  if saved:      # else the kill came before the first save was complete
    assert f"resumed at iteration {saved[-1]}/{ITERATIONS}" in out.stdout
  for a, b in zip(model_leaves(reference, ITERATIONS),
                  model_leaves(workdir, ITERATIONS)):
    np.testing.assert_array_equal(a, b)
  assert records(workdir) == records(reference)
  assert fileio.read_json(f"{workdir}/rl_eval.json") == fileio.read_json(
      os.path.join(reference, "rl_eval.json"))
  assert not os.path.exists(tmp_path / "gs:")
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
