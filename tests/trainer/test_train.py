"""Tests of the training entry point: exact resume, mesh equivalence, errors.

The subprocess runs use configs/sft_tiny.py (tiny Qwen3 on synthetic copy
data, one CPU device each); the mesh test runs in-process on the 8 CPU
devices of tests/conftest.py.
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

from paraagent_jax.trainer import specs
from paraagent_jax.trainer import state as state_lib
from paraagent_jax.trainer import sft as sft_lib
from paraagent_jax import rundir
from paraagent_jax.trainer import pipeline
from paraagent_jax import config_utils
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import sharding as shd
from paraagent_jax import train
from paraagent_jax.data import synthetic
from paraagent_jax.learner import sft_loss
from paraagent_jax.learner import optimizer as optim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "sft_tiny.py")
STEPS = 120
# keep_ckpts=0 keeps every checkpoint, so a test can start from any of them.
RUN_ARGS = (f"progress=False,tensorboard=False,eval_every=0,total_steps={STEPS},"
            f"ckpt_every=10,log_every=10,keep_ckpts=0")


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  return env


def train_cmd(workdir, extra=""):
  args = RUN_ARGS + ("," + extra if extra else "")
  return [sys.executable, "-m", "paraagent_jax.train",
          f"--config={TINY}:{args}", f"--workdir={workdir}"]


def run_train(workdir, extra="", check=True):
  proc = subprocess.run(train_cmd(workdir, extra), cwd=ROOT, env=_env(),
                        capture_output=True, text=True, timeout=300)
  if check:
    assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def losses(workdir):
  recs = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return {r["step"]: r["train/loss"] for r in recs if "train/loss" in r}


def model_arrays(workdir, step):
  path = os.path.join(workdir, "checkpoints", str(step), "model")
  tree = ocp.StandardCheckpointer().restore(path)
  return jax.tree.leaves(tree)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  """An uninterrupted run of STEPS steps (every 10th step checkpointed)."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  out = run_train(workdir)
  assert "sft: done at step" in out.stdout
  return workdir


def last_stderr_line(proc):
  lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  return lines[-1] if lines else ""


def assert_one_line_error(proc, *fragments):
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = last_stderr_line(proc)
  assert last.startswith("paraagent_jax.train: error: "), proc.stderr[-2000:]
  for frag in fragments:
    assert frag in last, last


@pytest.mark.slow
def test_resume_from_a_mid_run_checkpoint_is_exact(reference_run, tmp_path):
  # "Killed right after step 50 was saved": only that checkpoint survives.
  workdir = str(tmp_path / "resumed")
  os.makedirs(os.path.join(workdir, "checkpoints"))
  shutil.copytree(os.path.join(reference_run, "checkpoints", "50"),
                  os.path.join(workdir, "checkpoints", "50"))
  out = run_train(workdir)
  assert "resumed at step 50/" in out.stdout
  ref, got = losses(reference_run), losses(workdir)
  assert min(got) == 60  # Nothing before the checkpoint was recomputed.
  for step in got:
    assert got[step] == ref[step], step  # Bit-exact, not approximately.
  for a, b in zip(model_arrays(reference_run, STEPS),
                  model_arrays(workdir, STEPS)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_sigkill_and_rerun_ends_with_the_same_loss(reference_run, tmp_path):
  workdir = str(tmp_path / "killed")
  first_ckpt = os.path.join(workdir, "checkpoints", "10")
  proc = subprocess.Popen(train_cmd(workdir), cwd=ROOT, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 240
  while not os.path.isdir(first_ckpt) and proc.poll() is None:
    assert time.monotonic() < deadline, "no checkpoint appeared"
    time.sleep(0.02)
  time.sleep(np.random.default_rng().uniform(0.0, 0.3))
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  out = run_train(workdir)
  resumed = int(out.stdout.split("resumed at step ")[1].split("/")[0])
  print(f"killed run resumed at step {resumed}")
  assert 10 <= resumed <= STEPS
  ref, got = losses(reference_run), losses(workdir)
  assert got[STEPS] == ref[STEPS]
  for a, b in zip(model_arrays(reference_run, STEPS),
                  model_arrays(workdir, STEPS)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_sigint_saves_the_step_and_rerun_ends_with_the_same_loss(reference_run, tmp_path):
  """Ctrl-C: the step under way finishes and is saved, one line, exit 130;
  rerunning resumes from exactly that step and ends where an uninterrupted
  run does."""
  workdir = str(tmp_path / "interrupted")
  proc = subprocess.Popen(train_cmd(workdir), cwd=ROOT, env=_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  deadline = time.monotonic() + 240
  while not os.path.isdir(os.path.join(workdir, "checkpoints", "10")):
    assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
    time.sleep(0.02)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=240)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1, err[-3000:]
  step = int(lines[0].split("interrupted at step ")[1].split(";")[0])
  assert lines[0] == (f"paraagent_jax.train: interrupted at step {step}; rerun the "
                      f"same command to resume from step {step}")
  assert 10 <= step < STEPS, "the interrupt landed after the run ended"
  assert "stopping after the current step" in out
  assert os.path.isdir(os.path.join(workdir, "checkpoints", str(step)))
  assert not os.path.exists(os.path.join(workdir, ".lock"))
  rerun = run_train(workdir)
  assert f"resumed at step {step}/" in rerun.stdout
  assert losses(workdir)[STEPS] == losses(reference_run)[STEPS]
  for a, b in zip(model_arrays(reference_run, STEPS), model_arrays(workdir, STEPS)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_corrupt_checkpoint_stops_with_one_line(reference_run, tmp_path):
  workdir = str(tmp_path / "corrupt")
  dst = os.path.join(workdir, "checkpoints", "30")
  shutil.copytree(os.path.join(reference_run, "checkpoints", "30"), dst)
  for root, _, files in os.walk(os.path.join(dst, "model")):
    for f in files:
      with open(os.path.join(root, f), "wb") as fh:
        fh.write(b"not a checkpoint")
  proc = run_train(workdir, check=False)
  assert_one_line_error(proc, "no readable checkpoint", "step 30")


@pytest.mark.slow
def test_truncated_checkpoint_file_one_line_for_evaluate_export_and_train_falls_back(
    reference_run, tmp_path):
  """One data file of the newest step cut short (a full disk, a bad copy)."""
  from paraagent_jax import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "truncated")
  for step in (100, 110):
    shutil.copytree(os.path.join(reference_run, "checkpoints", str(step)),
                    os.path.join(workdir, "checkpoints", str(step)))
  shutil.copy(os.path.join(reference_run, "config.json"), workdir)
  step_dir = os.path.join(workdir, "checkpoints", "110")
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "model"))
           for f in fs]
  target = max(files, key=os.path.getsize)
  with open(target, "r+b") as fh:
    fh.truncate(os.path.getsize(target) // 2)
  name = os.path.relpath(target, step_dir)
  # evaluate needs a tokenizer before it reads weights; any will do here.
  tok_lib.train_bpe_tokenizer(["a tiny text"] * 4, vocab_size=300,
                              out_dir=os.path.join(workdir, "tokenizer"))
  for cmd in (["paraagent_jax.evaluate", f"--workdir={tmp_path / 'eval'}",
               f"--checkpoint={workdir}"],
              ["paraagent_jax.export_hf", f"--workdir={workdir}",
               f"--out={tmp_path / 'hf'}"]):
    proc = subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) <= 3, proc.stderr[-3000:]
    assert "step 110" in lines[-1] and name in lines[-1] and "truncated" in lines[-1], lines
  # Neither command moved or deleted anything.
  assert os.path.isfile(target) and not os.path.exists(tmp_path / "hf")
  # train resumes from the newest intact step, says which one it skipped and
  # why, and ends exactly like the uninterrupted run.
  proc = run_train(workdir)
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "step 110 unreadable" in proc.stdout and "truncated" in proc.stdout, proc.stdout
  assert "resumed at step 100/" in proc.stdout
  assert os.path.isfile(os.path.join(workdir, "checkpoints", "corrupt-110", name))
  ref, got = losses(reference_run), losses(workdir)
  assert got[STEPS] == ref[STEPS]


def test_tokamax_attention_without_the_package_fails_first(tmp_path):
  """attention=tokamax is checked before any work, with how to install it."""
  shadow = tmp_path / "shadow"
  shadow.mkdir()
  (shadow / "tokamax.py").write_text("raise ImportError('no tokamax here')\n")
  env = dict(_env(), PYTHONPATH=f"{shadow}{os.pathsep}{ROOT}")
  cmd = train_cmd(tmp_path / "run") + ["--config.model.attention=tokamax"]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "pip install tokamax" in proc.stderr
  assert not (tmp_path / "run").exists()


def test_pipeline_sft2_needs_sft_and_known_keys(tmp_path):
  c = tiny_config()
  c.pipeline.stages = ("sft2",)
  with pytest.raises(config_utils.ConfigError, match="sft2 must follow sft"):
    pipeline.run_pipeline(c, str(tmp_path))
  cfg = tiny_config()
  config_utils.merge_nested(cfg, {"optimizer": {"learning_rate": 0.5}, "total_steps": 3}, "x")
  assert cfg.optimizer.learning_rate == 0.5 and cfg.total_steps == 3
  with pytest.raises(config_utils.ConfigError, match="x.optimizer.lr: not a config key"):
    config_utils.merge_nested(cfg, {"optimizer": {"lr": 0.5}}, "x")


@pytest.mark.slow
def test_wrong_key_and_missing_hf_dir_stop_with_one_line(tmp_path):
  proc = run_train(str(tmp_path / "a"), "optimizer.learnig_rate=1.0",
                   check=False)
  assert_one_line_error(proc, "unknown config key 'optimizer.learnig_rate'",
                        "optimizer.learning_rate")
  proc = run_train(str(tmp_path / "b"), f"init_from={tmp_path}/no_such_hf",
                   check=False)
  assert_one_line_error(proc, "init_from=", "no such directory")
  proc = run_train(str(tmp_path / "c"), "batch_size=x", check=False)
  assert_one_line_error(proc, "batch_size='x': expected an int")


def tiny_config(**changes):
  c = config_utils.load_config(TINY + ":" + RUN_ARGS)
  for k, v in changes.items():
    config_utils.set_override(c, k, str(v))
  return c


@pytest.mark.slow
def test_nan_stops_with_step_metric_and_last_good_checkpoint(tmp_path):
  c = tiny_config(**{"optimizer.learning_rate": 1e30,
                     "optimizer.max_grad_norm": 0.0,
                     "optimizer.warmup_steps": 0, "ckpt_every": 1,
                     "log_every": 1, "total_steps": 6})
  with pytest.raises(metrics_lib.NonFiniteError) as e:
    sft_lib.run_sft(c, str(tmp_path))
  msg = str(e.value)
  assert "at step 2" in msg and "NaN/Inf in 'grad_norm'" in msg
  assert msg.endswith(os.path.join(str(tmp_path), "checkpoints", "1")
                      + " (not overwritten)")


def one_step(mesh, workdir):
  c = tiny_config()
  spec = specs.sft_spec(c)
  data = sft_lib.make_sft_data(spec, "train")
  model_cfg = spec.model.qwen3_config(data.vocab_size)
  optimizer = optim.make_optimizer(spec.optimizer)
  t = state_lib.build_train_state(spec.run, mesh, optimizer, model_cfg, workdir)
  t.checkpointer.close()
  step = sft_loss.make_sft_train_step(t.graphdef, optimizer, mesh)
  state, _, out = step(t.state, t.opt_state, state_lib.device_batch(next(data),
                                                                mesh),
                       jax.random.PRNGKey(0))
  return float(out["loss"]), state


@pytest.mark.slow
def test_one_step_on_a_2x2x2_mesh_matches_one_device(tmp_path):
  assert jax.device_count() == 8
  one = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1},
                      devices=jax.devices()[:1])
  eight = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  loss1, state1 = one_step(one, str(tmp_path / "one"))
  loss8, state8 = one_step(eight, str(tmp_path / "eight"))
  # The 8-device state really is split (else the test proves nothing).
  embed = state8["embed_tokens"][...]
  assert not embed.sharding.is_fully_replicated
  np.testing.assert_allclose(loss8, loss1, rtol=1e-6)
  # First-step loss of a fresh model is about log(vocab).
  assert abs(loss1 - np.log(64)) < 0.5
  for a, b in zip(jax.tree.leaves(state1), jax.tree.leaves(state8)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5,
                               atol=1e-6)


def test_synthetic_data_resumes_exactly_and_masks_the_copy():
  d = synthetic.SyntheticSFTData(batch_size=4, seq_len=32, vocab_size=64)
  next(d)
  saved = json.loads(json.dumps(d.state()))
  b2 = next(d)
  e = synthetic.SyntheticSFTData(batch_size=4, seq_len=32, vocab_size=64)
  e.restore(saved)
  np.testing.assert_array_equal(next(e)["tokens"], b2["tokens"])
  toks, mask = b2["tokens"][0], b2["loss_mask"][0]
  sep = int(np.where(toks == synthetic.SEP)[0][0])
  n = sep - 1
  np.testing.assert_array_equal(toks[sep + 1:sep + 1 + n], toks[1:sep])
  assert mask[:sep + 1].sum() == 0 and mask.sum() == n + 1
  with pytest.raises(ValueError, match="another seed"):
    synthetic.SyntheticSFTData(batch_size=4, seq_len=32, vocab_size=64,
                               seed=1).restore(saved)


def test_metrics_jsonl_is_truncated_on_resume(tmp_path):
  w = metrics_lib.MetricsWriter(str(tmp_path), total_steps=10,
                                tensorboard=True, progress=False)
  for s in (2, 4, 6):
    w.write(s, {"loss": float(s)})
  w.close()
  w = metrics_lib.MetricsWriter(str(tmp_path), total_steps=10, start_step=4,
                                tensorboard=False, progress=False)
  w.write(6, {"loss": 60.0})
  w.close()
  recs = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [(r["step"], r["train/loss"]) for r in recs] == [
      (2, 2.0), (4, 4.0), (6, 60.0)]
  assert os.listdir(tmp_path / "tb")


def test_rl_stage_without_tokenizer_and_unknown_stage(tmp_path):
  c = tiny_config(stage="rl")
  with pytest.raises(config_utils.ConfigError, match="tokenizer"):
    train.run(c, str(tmp_path))
  c = tiny_config(stage="dpo")
  with pytest.raises(config_utils.ConfigError, match="expected one of sft"):
    train.run(c, str(tmp_path))


@pytest.mark.slow
def test_pipeline_runs_stages_in_subdirs_and_hands_sft_to_rl(tmp_path,
                                                            monkeypatch):
  seen = {}

  def fake_rl(config, workdir):
    seen["init_from"], seen["workdir"] = config.init_from, workdir
    return {"ok": 1}

  monkeypatch.setitem(pipeline.STAGES, "rl", fake_rl)
  c = tiny_config(stage="pipeline", total_steps=4, ckpt_every=2)
  config_utils.set_override(c, "pipeline.stages", "('sft','rl')")
  out = train.run(c, str(tmp_path))
  assert set(out) == {"sft", "rl"} and np.isfinite(out["sft"]["loss"])
  assert seen == {"init_from": str(tmp_path / "sft"),
                  "workdir": str(tmp_path / "rl")}
  assert os.path.isdir(tmp_path / "sft" / "checkpoints" / "4")
  # RL's init_from is a valid Orbax source for the trainer.
  assert rundir.check_init_from(seen["init_from"]) == "orbax"
  # Rerunning skips finished stages.
  seen.clear()
  assert train.run(c, str(tmp_path)) == {}
  assert not seen


@pytest.mark.slow
def test_init_from_orbax_starts_from_those_weights(reference_run, tmp_path):
  c = tiny_config(total_steps=1, log_every=1, init_from=reference_run)
  out = sft_lib.run_sft(c, str(tmp_path))
  scratch = losses(reference_run)[10]
  # The reference run's weights already learned something: lower loss.
  assert out["loss"] < scratch - 0.05
  # A directory that holds neither kind of checkpoint is refused clearly.
  os.makedirs(tmp_path / "empty")
  with pytest.raises(config_utils.ConfigError, match="neither an HF"):
    rundir.check_init_from(str(tmp_path / "empty"))


@pytest.mark.slow
def test_only_the_stage_door_reads_the_sft_config(tmp_path, config_readers):
  """A whole SFT run (steps, validation, checkpoints): below `specs.sft_spec`
  nothing reads the config (the data source gets its group as a mapping)."""
  from test_rl_stage import outside_doors  # pylint: disable=g-import-not-at-top
  sft_lib.run_sft(tiny_config(total_steps=2, eval_every=1, log_every=1), str(tmp_path))
  assert config_readers["paraagent_jax/trainer/specs.py:sft_spec"] > 0
  assert not outside_doors(config_readers), sorted(outside_doors(config_readers))
