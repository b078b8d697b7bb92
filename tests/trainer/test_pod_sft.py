"""The SFT stage as several processes (issue 47): per-host data, one set of
files, SIGTERM to one process, kill -9 of one process.

The pod runs are real ``python -m paraagent_jax.local_pod`` launches of
``paraagent_jax.train`` (2 processes x 2 CPU devices, joined by
jax.distributed on localhost) on a tiny Qwen3 trained on 40 hand-written
demonstrations (the ``demonstrations`` source: TFDS dataset and tokenizer
built on first use, by process 0), batch 4: an epoch is 10 steps, a run of
20 steps two epochs. ``debug.rows_log`` makes each process record the ids
of the rows it trained on, per step. The runs share a JAX compilation cache.

The watchdog's own logic (`liveness.Watchdog`) is tested without a pod, on a
fake key-value store and clock.
"""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from paraagent_jax import interrupts
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import multihost
from paraagent_jax.trainer import liveness
from paraagent_jax.trainer import state as state_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 20
DEMOS = 40          # train demonstrations: an epoch is DEMOS / 4 = 10 steps
BATCH = 4
TIMEOUT_S = 15      # host_timeout_s of the kill -9 test

# configs/sft_tiny.py with the demonstrations source (a group of other keys,
# which command-line overrides cannot add); the rest is overridden (RUN).
CONFIG = textwrap.dedent("""
    import importlib.util
    from paraagent_jax import config_utils

    def get_config(arg=None):
      spec = importlib.util.spec_from_file_location("sft_tiny", {tiny!r})
      tiny = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(tiny)
      c = tiny.get_config()
      c.model.vocab_size = 0            # the tokenizer's
      c.data = config_utils.demonstration_defaults()
      c.data.source = "demonstrations"
      c.data.data_dir = {data_dir!r}
      c.data.tokenizer_vocab_size = 400
      return c
""")
RUN = {"batch_size": BATCH, "seq_len": 128, "total_steps": STEPS, "log_every": 1,
       "eval_every": 10, "eval_batches": 1, "ckpt_every": 4, "keep_ckpts": 0,
       "progress": False, "tensorboard": False}


def _demonstration(split, i):
  city = f"city{i}"
  return {
      "id": f"{split}-{i:03d}", "task_id": f"task-{split}-{i}", "kind": "single",
      "split": split, "strategy": "paraact", "success": True, "turns": 2, "calls": 1,
      "roles": ["explorer", "answerer"],
      "messages": [
          {"role": "system", "content": "You are a ParaAct agent."},
          {"role": "user", "content": f"How warm is it in {city} today?"},
          {"role": "assistant", "content":
           f'<explore> look up\n<call>{{"name": "search_tools", "arguments": '
           f'{{"query": "temperature {city}"}}}}</call>\n</step>'},
          {"role": "tool", "content": f'[{{"name": "temp_{i}"}}]'},
          {"role": "assistant", "content": f"<answer> {i % 30} C </answer>"}]}


def _task(split, i):
  return {"id": f"t-{split}-{i}", "kind": "single", "split": split,
          "instruction": f"How warm is it in city{i}?",
          "nodes": [{"id": 0, "tool": f"temp_{i}", "arguments": {"c": i}}],
          "answers": [{"label": "t", "value": str(i % 30)}], "max_turns": 4}


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  data = tmp_path_factory.mktemp("demos")
  for split, n in (("train", DEMOS), ("test", 8)):
    for name, row in (("demonstrations", _demonstration), ("tasks", _task)):
      with open(data / f"{name}_{split}.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row(split, i)) + "\n" for i in range(n))
  path = tmp_path_factory.mktemp("config") / "pod_sft.py"
  path.write_text(CONFIG.format(tiny=os.path.join(ROOT, "configs", "sft_tiny.py"),
                                data_dir=str(data)))
  return str(path)


@pytest.fixture(scope="module")
def env():
  # The run's compilation cache (tests/conftest.py) comes with os.environ.
  e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  e.pop("XLA_FLAGS", None)
  return e


def train_args(config_file, workdir, **extra):
  overrides = {**RUN, "debug.rows_log": os.path.join(workdir, "rows"), **extra}
  return ["paraagent_jax.train",
          f"--config={config_file}:" + ",".join(f"{k}={v}" for k, v in overrides.items()),
          f"--workdir={workdir}"]


def pod_cmd(config_file, workdir, **extra):
  return [sys.executable, "-m", "paraagent_jax.local_pod", "--processes=2",
          "--devices_per_process=2", "--grace_s=300", "--",
          *train_args(config_file, workdir, **extra)]


def run(env, command, **env_changes):
  proc = subprocess.run(command, cwd=ROOT, env=dict(env, **env_changes),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


def losses(workdir):
  return {r["step"]: r["train/loss"]
          for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if "train/loss" in r}


def rows_by_step(workdir):
  """{(step, process): row ids}; a step logged again (after a kill) keeps
  its last line, the one of the run that went on."""
  out = {}
  for p in range(2):
    path = os.path.join(workdir, "rows", f"rows_{p}.jsonl")
    for rec in metrics_lib.read_jsonl(path) if os.path.exists(path) else []:
      assert rec["process"] == p
      out[(rec["step"], p)] = rec["rows"]
  return out


def assert_epochs_read_once(rows):
  """Every demonstration once per epoch (10 steps), the two processes' rows
  disjoint, nothing else read."""
  assert sorted({s for s, _ in rows}) == list(range(1, STEPS + 1))
  every = sorted(f"train-{i:03d}" for i in range(DEMOS))
  for epoch in range(STEPS * BATCH // DEMOS):
    steps = range(epoch * 10 + 1, epoch * 10 + 11)
    read = [r for s in steps for p in range(2) for r in rows[(s, p)]]
    assert sorted(read) == every, f"epoch {epoch}: {sorted(read)}"
  for s in range(1, STEPS + 1):
    assert len(rows[(s, 0)]) == len(rows[(s, 1)]) == BATCH // 2
    assert not set(rows[(s, 0)]) & set(rows[(s, 1)])


def checkpoint_steps(workdir):
  root = os.path.join(workdir, "checkpoints")
  return sorted(int(d) for d in os.listdir(root) if d.isdigit()) if os.path.isdir(root) else []


@pytest.fixture(scope="module")
def reference(config_file, env, tmp_path_factory):
  """An uninterrupted 2 x 2 run (it builds the dataset and the tokenizer,
  and fills the compilation cache)."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  out = run(env, pod_cmd(config_file, workdir))
  assert "[0] sft: scratch at step 0/20" in out.stdout
  return workdir


def _process(launcher: subprocess.Popen, index: int) -> psutil.Process:
  """The pod's process ``index`` (a child of the launcher)."""
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    for child in psutil.Process(launcher.pid).children():
      try:
        if child.environ().get("JAX_PROCESS_ID") == str(index):
          return child
      except psutil.NoSuchProcess:
        continue
    time.sleep(0.1)
  raise AssertionError(f"no process {index} under the launcher")


def _wait_for(launcher, ready, what):
  deadline = time.monotonic() + 300
  while not ready():
    assert launcher.poll() is None, f"the pod ended before {what}"
    assert time.monotonic() < deadline, f"no {what}"
    time.sleep(0.05)


def _logged_step(workdir, step):
  def ready():
    path = os.path.join(workdir, "metrics.jsonl")
    return os.path.exists(path) and any(
        r["step"] >= step for r in metrics_lib.read_jsonl(path))
  return ready


def kill_process_1_when(pod, ready, what):
  """kill -9 of the pod's process 1 once ``ready()``; (stdout, stderr,
  seconds from the kill until the launcher exited)."""
  try:
    victim = _process(pod, 1)
    _wait_for(pod, ready, what)
    victim.kill()
    killed = time.monotonic()
    out, err = pod.communicate(timeout=300)
    return out, err, time.monotonic() - killed
  finally:
    pod.kill()


def dead_process_line(bound) -> str:
  """What process 0 says when process 1 stopped sending heartbeats."""
  return (f"paraagent_jax.train: error: process 1 of 2 sent no heartbeat for {bound} s "
          "(killed, crashed or cut off); stopping process 0 too: rerun the same command on "
          "every host to resume from the last complete checkpoint")


def _lines(out, index):
  prefix = f"[{index}] "
  return [l[len(prefix):] for l in out.splitlines() if l.startswith(prefix)]


@pytest.mark.slow
def test_two_processes_train_like_one_with_one_set_of_files(
    config_file, env, reference, tmp_path):
  """2 processes x 2 devices against 1 x 4: the same losses, each process
  reads its half of every global batch, one metrics file and one checkpoint
  tree (written by both processes' shards)."""
  one = str(tmp_path / "one")
  run(env, [sys.executable, "-m", *train_args(config_file, one)], JAX_NUM_CPU_DEVICES="4")
  pod, single = losses(reference), losses(one)
  assert sorted(pod) == sorted(single) == list(range(1, STEPS + 1))
  diff = max(abs(pod[s] - single[s]) for s in pod)
  print(f"max |loss difference| over {STEPS} steps: {diff:.3g}")
  assert diff <= 1e-5

  rows, rows_one = rows_by_step(reference), rows_by_step(one)
  assert_epochs_read_once(rows)
  for s in range(1, STEPS + 1):
    assert rows[(s, 0)] + rows[(s, 1)] == rows_one[(s, 0)]

  files = sorted(os.path.relpath(os.path.join(d, f), reference)
                 for d, _, fs in os.walk(reference) for f in fs
                 if not os.path.relpath(d, reference).startswith(("checkpoints", "rows")))
  assert files == ["config.json", "machine.json", "metrics.jsonl"], files
  assert checkpoint_steps(reference) == [4, 8, 12, 16, 20]
  assert set(os.listdir(os.path.join(reference, "checkpoints"))) == {"4", "8", "12", "16", "20"}
  model = os.path.join(reference, "checkpoints", "20", "model")
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(os.listdir(model))
  # The metrics file has one record per step and evaluation, not one per process.
  steps = [r["step"] for r in metrics_lib.read_jsonl(os.path.join(reference, "metrics.jsonl"))]
  assert steps == sorted(list(range(1, STEPS + 1)) + [10, 20])


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_one_saved_step(
    config_file, env, reference, tmp_path):
  """SIGTERM to process 1 only: both processes stop after the same step,
  save it, exit 130 with one line each; the rerun resumes there and ends
  like the uninterrupted run, having read every row of each epoch once."""
  workdir = str(tmp_path / "sigterm")
  pod = subprocess.Popen(pod_cmd(config_file, workdir), cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    victim = _process(pod, 1)
    _wait_for(pod, _logged_step(workdir, 5), "step 5")
    victim.send_signal(signal.SIGTERM)
    out, err = pod.communicate(timeout=300)
  finally:
    pod.kill()
  assert pod.returncode == 130, out[-3000:] + err[-3000:]
  said = [[l for l in _lines(out, i) if l.startswith("paraagent_jax.train:")]
          for i in range(2)]
  assert len(said[0]) == len(said[1]) == 1, said
  assert said[0] == said[1], said
  step = int(said[0][0].split("interrupted at step ")[1].split(";")[0])
  assert said[0][0].endswith(f"rerun the same command to resume from step {step}")
  assert 5 <= step < STEPS, "the signal landed after the run ended"
  assert checkpoint_steps(workdir)[-1] == step
  assert any("SIGTERM: stopping after the current step" in l for l in _lines(out, 1))

  again = run(env, pod_cmd(config_file, workdir))
  assert f"[0] sft: resumed at step {step}/20" in again.stdout
  assert losses(workdir) == losses(reference)
  print(f"SIGTERM to process 1: both exited 130 at step {step}; rerun's final loss "
        f"{losses(workdir)[STEPS]:.7f} (reference {losses(reference)[STEPS]:.7f})")
  rows = rows_by_step(workdir)
  assert_epochs_read_once(rows)
  # Nothing was read twice: no step was logged by both runs.
  lines = sum(len(metrics_lib.read_jsonl(os.path.join(workdir, "rows", f"rows_{p}.jsonl")))
              for p in range(2))
  assert lines == 2 * STEPS


@pytest.mark.slow
def test_kill9_of_one_process_stops_the_other_within_the_bound(
    config_file, env, reference, tmp_path):
  """kill -9 of process 1: process 0 stops within host_timeout_s with one
  line naming process 1 (exit 1); the rerun resumes from the last complete
  checkpoint and ends like the uninterrupted run."""
  workdir = str(tmp_path / "kill9")
  pod = subprocess.Popen(pod_cmd(config_file, workdir, host_timeout_s=TIMEOUT_S), cwd=ROOT,
                         env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  out, err, took = kill_process_1_when(
      pod, lambda: 4 in checkpoint_steps(workdir) and _logged_step(workdir, 6)(),
      "checkpoint 4 and step 6")
  assert pod.returncode == 1, out[-3000:] + err[-3000:]   # process 0's status
  print(f"kill -9 of process 1: process 0 exited 1 after {took:.1f} s "
        f"(host_timeout_s={TIMEOUT_S})")
  assert took < TIMEOUT_S + 15, took
  said = [l for l in _lines(out, 0) if "error" in l.lower()]
  assert said == [dead_process_line(TIMEOUT_S)], out[-3000:]
  last = checkpoint_steps(workdir)[-1]
  assert 4 <= last < STEPS

  again = run(env, pod_cmd(config_file, workdir, host_timeout_s=TIMEOUT_S))
  assert f"[0] sft: resumed at step {last}/20" in again.stdout
  assert losses(workdir) == losses(reference)
  assert_epochs_read_once(rows_by_step(workdir))


# ----------------------------------------------------------------------------
# The watchdog's logic, without a pod.
# ----------------------------------------------------------------------------


class FakeStore:
  """The distributed client's key-value calls the watchdog makes."""

  def __init__(self):
    self.values, self.down = {}, False

  def key_value_set(self, key, value, allow_overwrite=False):
    assert allow_overwrite
    if self.down:
      raise RuntimeError("UNAVAILABLE: Socket closed")
    self.values[key] = value

  def key_value_dir_get(self, prefix):
    if self.down:
      raise RuntimeError("UNAVAILABLE: Socket closed")
    return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


class Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def _watchdogs(store, clock, count=3):
  return [liveness.Watchdog(store, i, count, TIMEOUT_S, "prog", clock=clock)
          for i in range(count)]


def test_watchdog_names_the_process_that_stopped_beating():
  store, clock = FakeStore(), Clock()
  dogs = _watchdogs(store, clock)
  for _ in range(5):                       # all alive: nothing to say
    clock.now += TIMEOUT_S / 2
    assert [d.check() for d in dogs] == ["", "", ""]
  clock.now += 1                            # process 2 stops beating
  assert dogs[0].check() == dogs[1].check() == ""
  clock.now += TIMEOUT_S - 1                # the last beat was seen just above
  assert dogs[0].check() == ""
  clock.now += 1
  want = f"process 2 of 3 sent no heartbeat for {TIMEOUT_S} s (killed, crashed or cut off)"
  assert dogs[0].check() == dogs[1].check() == want


def test_watchdog_leaves_a_finished_process_alone():
  store, clock = FakeStore(), Clock()
  dogs = _watchdogs(store, clock, count=2)
  assert [d.check() for d in dogs] == ["", ""]
  dogs[1].finished()                        # done: no more beats, never missed
  for _ in range(10):
    clock.now += TIMEOUT_S
    assert dogs[0].check() == ""


def test_watchdog_names_process_0_when_the_store_is_gone():
  store, clock = FakeStore(), Clock()
  dog = _watchdogs(store, clock, count=2)[1]
  assert dog.check() == ""
  store.down = True
  clock.now += TIMEOUT_S - 1
  assert dog.check() == ""
  clock.now += 1
  assert dog.check().startswith(
      f"process 0 of 2 (it holds the coordination service) cannot be reached for "
      f"{TIMEOUT_S} s (RuntimeError: UNAVAILABLE: Socket closed)")


def test_watchdog_fails_with_one_line_and_status_1(monkeypatch):
  codes, err = [], io.StringIO()
  monkeypatch.setattr(sys, "stderr", err)
  dog = liveness.Watchdog(FakeStore(), 0, 2, TIMEOUT_S, "paraagent_jax.train",
                          exit=codes.append)
  dog.fail("process 1 of 2 sent no heartbeat")
  assert codes == [1]
  assert err.getvalue().count("\n") == 1
  assert err.getvalue().startswith("paraagent_jax.train: error: process 1 of 2 sent no "
                                   "heartbeat; stopping process 0 too: rerun")
  with pytest.raises(ValueError, match="host_timeout_s=0"):
    liveness.Watchdog(FakeStore(), 0, 2, 0, "p")


def test_jax_heartbeat_timeout_is_above_the_bound():
  for bound in (1, 15, 120, 600):
    assert liveness.jax_heartbeat_timeout(bound) > bound + liveness.interval(bound)


def test_one_process_stops_on_its_own_request_without_collectives():
  interrupts.clear()
  try:
    assert not state_lib.stop_requested()
    interrupts.request("SIGTERM")
    assert state_lib.stop_requested()
  finally:
    interrupts.clear()
  with multihost.primary_first("nothing to wait for"):   # no barrier on one process
    pass
