"""The RL stage on 2 processes x 2 CPU devices (`paraagent_jax.local_pod`)
against 1 process x 4 devices: the same config and global batch.

Both runs start from the shipped SFT policy (its groups have reward spread,
so the advantages and the update are not trivially zero) with a small
budget: 2 tasks x 4 samples, 3 turns, 2 iterations, 2 held-out tasks. On two
processes each rolls out one task's group (its own environments, its own
sampler on its 2 devices) and the learner's batch is one global array; the
sampler draws each row's random numbers as in the whole batch, so the
episodes, and with them the advantages, are those of one process.
"""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import jax
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import multihost
from paraagent_jax import sharding as shd
from paraagent_jax.learner import step as ts
from paraagent_jax.trainer import hosts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = ["--config=configs/demo.py:runlocal,stage=rl",
          "--config.rl.tasks_per_iter=2", "--config.rl.group_size=4",
          "--config.rl.max_turns=3", "--config.rl.max_turn_tokens=96",
          "--config.rl.max_len=1536", "--config.rl.length_buckets=1024",
          "--config.rl.num_micro_batches=2", "--config.rl.eval_tasks=2",
          "--config.tensorboard=False"]


def _run(args, workdir, env=None, timeout=600):
  env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
  env.pop("XLA_FLAGS", None)
  start = time.monotonic()
  p = subprocess.run([sys.executable, "-m", *args, *CONFIG, f"--workdir={workdir}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
  return p.stdout, time.monotonic() - start


def _train_records(workdir):
  recs = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return [r for r in recs if "train/loss" in r]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
  one, pod = str(tmp_path / "one"), str(tmp_path / "pod")
  _, t_one = _run(["paraagent_jax.train"], one, {"JAX_NUM_CPU_DEVICES": "4"})
  out, t_pod = _run(["paraagent_jax.local_pod", "--processes=2", "--devices_per_process=2",
                     "--", "paraagent_jax.train"], pod)
  print(f"1 x 4 devices {t_one:.0f} s, 2 x 2 devices {t_pod:.0f} s")
  a, b = _train_records(one), _train_records(pod)
  assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
  # Not trivially equal: the shipped policy's groups have reward spread.
  assert max(r["train/adv/token_std"] for r in a) > 0.1, a
  print("max |adv diff| %.2g, max |loss diff| %.2g" % (
      max(abs(ra[k] - rb[k]) for ra, rb in zip(a, b) for k in ra if k.startswith("train/adv/")),
      max(abs(ra["train/loss"] - rb["train/loss"]) for ra, rb in zip(a, b))))
  for ra, rb in zip(a, b):
    adv = sorted(k for k in ra if k.startswith("train/adv/"))
    assert adv and adv == sorted(k for k in rb if k.startswith("train/adv/"))
    for k in adv:
      assert rb[k] == pytest.approx(ra[k], abs=1e-6), k
    for k in ("train/loss", "train/pg_loss"):
      assert rb[k] == pytest.approx(ra[k], abs=1e-5), k
    # The same episodes: success, rewards, lengths and the group spread.
    for k in ("success", "traj_reward", "phase_reward", "step_reward", "episode_tokens",
              "traj_spread_groups", "steps"):
      assert rb[f"train/rollout/{k}"] == pytest.approx(ra[f"train/rollout/{k}"],
                                                       abs=1e-6), k
    # Each process rolled out its own half of the 8 episodes (counted by
    # the processes, gathered, written by process 0).
    assert rb["train/rollout/episodes_process0"] == 4.0, rb
    assert rb["train/rollout/episodes_process1"] == 4.0, rb
    assert not any(k.startswith("train/rollout/episodes_process") for k in ra)
  # The held-out evaluation split over the processes: the same records.
  recs = [metrics_lib.read_jsonl(os.path.join(d, "eval_after.jsonl")) for d in (one, pod)]
  assert len(recs[1]) == 2
  assert ([(r["task_id"], r["success"], r["turns"]) for r in recs[0]]
          == [(r["task_id"], r["success"], r["turns"]) for r in recs[1]])
  # Written once: one metrics file (one record per iteration), one report,
  # one checkpoint tree.
  assert glob.glob(os.path.join(pod, "**", "metrics.jsonl"), recursive=True) == [
      os.path.join(pod, "metrics.jsonl")]
  with open(os.path.join(pod, "metrics.jsonl")) as f:
    assert len([json.loads(l) for l in f if '"train/loss"' in l]) == 2
  assert glob.glob(os.path.join(pod, "**", "rl_report.md"), recursive=True) == [
      os.path.join(pod, "rl_report.md")]
  assert glob.glob(os.path.join(pod, "**", "checkpoints"), recursive=True) == [
      os.path.join(pod, "checkpoints")]
  assert sorted(os.listdir(os.path.join(pod, "checkpoints"))) == sorted(
      os.listdir(os.path.join(one, "checkpoints"))) == ["1", "2"]
  # Both processes printed the same iteration lines.
  lines = [l for l in out.splitlines() if " rl: it " in l]
  assert sorted(l[:3] for l in lines) == ["[0]", "[0]", "[1]", "[1]"], lines
  for it in (1, 2):
    assert len({l[4:l.rindex("(")] for l in lines if f" it {it}/" in l}) == 1, lines


def test_helpers_on_one_process():
  """On one process the helpers run no collective and change nothing."""
  obj = {"a": [1, 2.5], "b": None}
  assert multihost.allgather_json(obj) == [obj] and multihost.allgather_json(obj)[0] is obj
  assert multihost.any_process(True) and not multihost.any_process(False)
  multihost.barrier("nothing to wait for")
  mesh = shd.make_mesh({"data": 2, "fsdp": -1})
  sharding = ts.data_sharding(0, mesh)
  assert multihost.process_rows(sharding, 16) == (0, 16)
  x = jax.device_put(np.arange(16), sharding)
  np.testing.assert_array_equal(multihost.host_value(x), np.arange(16))
  local = hosts.local_mesh(mesh)
  assert dict(local.shape) == {"data": 1, "fsdp": jax.local_device_count(), "tensor": 1}


@pytest.mark.slow
def test_kill9_of_one_process_during_rl_and_the_rerun(tmp_path):
  """kill -9 of process 1 during RL: process 0 exits non-zero within the
  liveness bound with one line naming process 1; the rerun resumes from the
  last complete checkpoint and finishes."""
  from tests.trainer.test_pod_sft import _lines, dead_process_line, kill_process_1_when  # pylint: disable=g-import-not-at-top
  from paraagent_jax import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  bound = 15
  workdir = str(tmp_path / "pod")
  command = [sys.executable, "-m", "paraagent_jax.local_pod", "--processes=2",
             "--devices_per_process=2", "--", "paraagent_jax.train", *CONFIG,
             "--config.rl.iterations=3", f"--config.host_timeout_s={bound}",
             f"--workdir={workdir}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  pod = subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
  out, err, took = kill_process_1_when(
      pod, lambda: ckpt_lib.saved_steps(os.path.join(workdir, "checkpoints")),
      "checkpoint 1")
  print(f"kill -9 of process 1 in RL: the pod exited {pod.returncode} after {took:.1f} s")
  assert pod.returncode != 0, out[-3000:] + err[-3000:]
  assert took < bound + 20, took
  said = [l for l in _lines(out, 0) if "error" in l.lower()]
  assert said == [dead_process_line(bound)], out[-3000:]
  last = ckpt_lib.saved_steps(os.path.join(workdir, "checkpoints"))[-1]
  assert 1 <= last < 3

  again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
  assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
  assert f"resumed at iteration {last}/3" in again.stdout, again.stdout[-3000:]
  assert [r["step"] for r in _train_records(workdir)] == [1, 2, 3]
