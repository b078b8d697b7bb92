"""`paraagent_jax.local_pod`: N processes x M CPU devices joined by jax.distributed.

Each test runs the real launcher as a subprocess on a small probe module
written into tmp_path (on PYTHONPATH with the repository), which picks what to
do from its first argument.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROG = "paraagent_jax.local_pod"

PROBE = textwrap.dedent("""
    import os, signal, sys, time
    mode, index = sys.argv[1], int(os.environ["JAX_PROCESS_ID"])
    if mode == "sum":
      import jax
      import numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from paraagent_jax.trainer import state
      state.maybe_initialize_distributed("auto")
      print("COUNTS", jax.process_index(), jax.process_count(),
            jax.local_device_count(), jax.device_count())
      mesh = Mesh(np.array(jax.devices()), ("d",))
      local = np.arange(2 * jax.local_device_count() * 3,
                        dtype=np.float32).reshape(-1, 3) + 100 * index
      x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
      total = jax.jit(lambda a: (a * a).sum(), out_shardings=NamedSharding(mesh, P()))(x)
      print("SUM", float(total))
      print("to stderr", file=sys.stderr)
    elif mode == "exit":            # exit CODE0 CODE1; "kill": SIGKILL itself
      code = sys.argv[2 + index]
      if code == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
      sys.exit(int(code))
    elif mode == "sigterm":
      def stop(signum, frame):
        print("got", signal.Signals(signum).name, flush=True)
        sys.exit(130)
      signal.signal(signal.SIGTERM, stop)
      print("ready", flush=True)
      time.sleep(600)
    elif mode == "hang":            # process 1 fails at once, 0 never ends
      print("pid", os.getpid())
      if index == 1:
        sys.exit(1)
      time.sleep(10 ** 6)
""")


def _env(tmp_path):
  (tmp_path / "pod_probe.py").write_text(PROBE)
  return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))


def _pod(tmp_path, *args, timeout=120):
  return subprocess.run([sys.executable, "-m", PROG, *args], cwd=ROOT, env=_env(tmp_path),
                        capture_output=True, text=True, timeout=timeout)


def _lines(out, index):
  prefix = f"[{index}] "
  return [l[len(prefix):] for l in out.splitlines() if l.startswith(prefix)]


@pytest.mark.slow
def test_two_processes_of_two_devices_sum_a_global_array(tmp_path):
  p = _pod(tmp_path, "--processes=2", "--devices_per_process=2", "--", "pod_probe", "sum")
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  lines = p.stdout.splitlines()
  assert lines and all(l.startswith(("[0] ", "[1] ")) for l in lines), lines
  rows = np.concatenate([np.arange(12, dtype=np.float64).reshape(4, 3) + 100 * i
                         for i in range(2)])
  for i in range(2):
    mine = _lines(p.stdout, i)
    assert f"COUNTS {i} 2 2 4" in mine, mine
    total = float([l for l in mine if l.startswith("SUM ")][0].split()[1])
    np.testing.assert_allclose(total, float((rows * rows).sum()), rtol=1e-6)
    assert "to stderr" in mine   # stderr is merged and prefixed too


def test_exit_status_is_the_first_failure_in_process_order(tmp_path):
  p = _pod(tmp_path, "--", "pod_probe", "exit", "0", "3")
  assert p.returncode == 3, p.stderr
  p = _pod(tmp_path, "--", "pod_probe", "exit", "kill", "3")
  assert p.returncode == 128 + signal.SIGKILL, p.stderr
  p = _pod(tmp_path, "--processes=3", "--", "pod_probe", "exit", "0", "0", "0")
  assert p.returncode == 0, p.stderr


def test_sigterm_reaches_every_process(tmp_path):
  pod = subprocess.Popen([sys.executable, "-m", PROG, "--", "pod_probe", "sigterm"],
                         cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
  lines = []
  reader = threading.Thread(target=lambda: lines.extend(iter(pod.stdout.readline, "")),
                            daemon=True)
  reader.start()
  deadline = time.monotonic() + 30
  while sum(l.endswith("ready\n") for l in lines) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
  try:
    assert sum(l.endswith("ready\n") for l in lines) == 2, lines
    pod.send_signal(signal.SIGTERM)
    assert pod.wait(timeout=30) == 130
  finally:
    pod.kill()
  reader.join(5)
  assert sorted(l for l in lines if "got" in l) == ["[0] got SIGTERM\n",
                                                     "[1] got SIGTERM\n"], lines


@pytest.mark.slow
def test_backstop_kills_the_rest_after_grace(tmp_path):
  start = time.monotonic()
  p = _pod(tmp_path, "--grace_s=5", "--", "pod_probe", "hang", timeout=90)
  assert p.returncode == 1, p.stdout + p.stderr
  assert time.monotonic() - start < 60
  said = [l for l in p.stderr.splitlines() if "killing" in l]
  assert said == [f"{PROG}: process 1 exited 1; killing processes 0, still running "
                  "5 s later"], p.stderr
  pid = int([l for l in _lines(p.stdout, 0) if l.startswith("pid ")][0].split()[1])
  try:
    os.kill(pid, 0)
    alive = True
  except ProcessLookupError:
    alive = False
  assert not alive


def test_usage_errors_are_one_line_and_exit_2(tmp_path):
  for args in (["pod_probe"], ["--processes=2"], ["--"], ["--", "--flag"],
               ["--processes=0", "--", "pod_probe"], ["--processes=x", "--", "m"],
               ["--devices_per_process=2", "--", "paraagent_jax.train", "--dry_run",
                "--fake_devices=64"]):
    p = _pod(tmp_path, *args)
    assert p.returncode == 2, (args, p.stderr)
    assert p.stdout == "" and len(p.stderr.splitlines()) == 1, (args, p.stderr)
    assert p.stderr.startswith(f"{PROG}: error: "), (args, p.stderr)


def test_help_and_no_jax_in_the_launcher(tmp_path):
  p = _pod(tmp_path, "--help")
  assert p.returncode == 0
  for word in ("--processes", "--devices_per_process", "--grace_s", "JAX_NUM_PROCESSES",
               "SIGTERM", "128 + S"):
    assert word in p.stdout, word
  p = subprocess.run([sys.executable, "-c", f"import sys, {PROG}; print('jax' in sys.modules)"],
                     cwd=ROOT, capture_output=True, text=True, check=True)
  assert p.stdout.strip() == "False"


@pytest.mark.slow
def test_evaluate_and_export_run_on_process_0_alone(tmp_path):
  """`evaluate` and `export_hf` are not split across processes: under the
  launcher process 0 does the work as one process (an Orbax restore on it
  alone would wait for the others if it joined them) and the others say so
  in one line; one report, the records of one run."""
  out = subprocess.run(
      [sys.executable, "-m", "paraagent_jax.local_pod", "--processes=2",
       "--devices_per_process=1", "--", "paraagent_jax.evaluate",
       "--config=configs/evaluate.py:runlocal,num_per_kind=1,strategies=paraact",
       f"--workdir={tmp_path / 'eval'}"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
      text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert ("[1] paraagent_jax.evaluate: process 1: the evaluation runs on process 0 "
          "alone; nothing to do here") in out.stdout, out.stdout[-2000:]
  assert "[0] evaluate: report" in out.stdout
  assert (tmp_path / "eval" / "report.json").is_file()
  (records,) = (tmp_path / "eval" / "records").iterdir()
  assert len(records.read_text().splitlines()) == 5   # 5 kinds x 1 task, once
