r"""A TPU pod rehearsed on this CPU: ``python -m paraagent_jax.local_pod``.

  python -m paraagent_jax.local_pod --processes=2 --devices_per_process=2 -- \
      paraagent_jax.train --config=configs/demo.py:runlocal --workdir=/tmp/pod

Runs ``python -m MODULE ARGS...`` (everything after ``--``, passed through
untouched) as N processes with M CPU devices each, joined by
``jax.distributed`` on localhost: in each process ``jax.process_count() == N``,
``jax.process_index() == i``, ``jax.local_device_count() == M`` and
``jax.device_count() == N * M``, as on the hosts of a pod slice.

Each process gets, on top of this environment:

  JAX_PLATFORMS=cpu
  JAX_NUM_CPU_DEVICES=M        the ``jax_num_cpu_devices`` flag, read from the
                               environment when JAX is imported
  JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT   a free port; read by
                               ``jax.distributed.initialize()`` itself
  JAX_NUM_PROCESSES=N, JAX_PROCESS_ID=i    not read by JAX (0.10); read by
                               `trainer.state.maybe_initialize_distributed`,
                               which the entry points call
  PYTHONUNBUFFERED=1

The module must call ``jax.distributed.initialize`` the way the entry points
do (`maybe_initialize_distributed`, whose "auto" mode starts it when
``JAX_COORDINATOR_ADDRESS`` is set). ``train --dry_run`` never does: it is a
single-process tool and sets its own device count (``--fake_devices``, else
what the config's mesh needs), which overrides M; so a ``--fake_devices``
other than M in the command is refused.

Output: every line a process writes (stdout and stderr, merged) is printed
as it arrives, prefixed with the process index: ``[1] ...``. The launcher's
own lines go to stderr, prefixed ``paraagent_jax.local_pod:``.

Exit status: 0 if every process exited 0; otherwise the first non-zero status
in process order (a process killed by signal S counts as 128 + S), leaving
out the processes the launcher killed itself (below).

Signals: SIGTERM and SIGINT are forwarded to every process (as a spot TPU's
notice reaches every host); the launcher then waits for them. The processes
run in their own process groups, so a terminal's Ctrl-C reaches them once,
through the launcher. Backstop: once a process has failed (non-zero or
killed), the others get ``--grace_s`` seconds to finish; then one line names
the failed process and those still running, they are killed (SIGKILL, with
their process groups) and the launcher exits with the failed one's status.

Flags use argparse, not absl: the launcher is standard library only (it
imports no JAX: it has no devices, and starts at once), and everything after
``--`` is split off before parsing, so the module's own absl flags reach it
as written.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import NoReturn, Sequence

PROG = "paraagent_jax.local_pod"


def fail(message: str) -> NoReturn:
  """A usage error: one line on stderr, exit status 2."""
  print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


class _Parser(argparse.ArgumentParser):
  """argparse with its errors on one line (no usage block)."""

  def error(self, message: str) -> NoReturn:
    fail(message)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """The launcher's flags, and the module's command (module first)."""
  parser = _Parser(prog=f"python -m {PROG}", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter,
                   usage="%(prog)s [--processes=N] [--devices_per_process=M] "
                         "[--grace_s=S] -- MODULE [ARGS...]")
  parser.add_argument("--processes", type=int, default=2, metavar="N",
                      help="JAX processes (hosts) (default: 2)")
  parser.add_argument("--devices_per_process", type=int, default=2, metavar="M",
                      help="CPU devices per process (default: 2)")
  parser.add_argument("--grace_s", type=float, default=120, metavar="S",
                      help="seconds the others may run on after a process "
                           "failed, then they are killed (default: 120)")
  argv = list(argv)
  cut = argv.index("--") if "--" in argv else len(argv)
  args = parser.parse_args(argv[:cut])
  command = argv[cut + 1:]
  if cut == len(argv):
    fail("no '--': give the module after it: -- MODULE [ARGS...]")
  if not command or command[0].startswith("-"):
    fail("no module after '--': -- MODULE [ARGS...]")
  if args.processes < 1 or args.devices_per_process < 1:
    fail("--processes and --devices_per_process must be at least 1")
  if args.grace_s < 0:
    fail("--grace_s must be at least 0")
  fake = _fake_devices(command[1:])
  if fake is not None and fake != str(args.devices_per_process):
    fail(f"--fake_devices={fake} in the command would override "
         f"--devices_per_process={args.devices_per_process}; give the same "
         "number or leave one out")
  return args, command


def _fake_devices(args: Sequence[str]) -> str | None:
  """The value of an entry point's ``--fake_devices`` in ``args``, if any."""
  for i, arg in enumerate(args):
    m = re.fullmatch(r"--?fake_devices(?:=(.*))?", arg)
    if m:
      return m.group(1) if m.group(1) is not None else (
          args[i + 1] if i + 1 < len(args) else "")
  return None


def free_port() -> int:
  """A localhost port nobody listens on (now)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def child_env(index: int, processes: int, devices: int, port: int) -> dict[str, str]:
  """This environment plus what makes process ``index`` join the pod."""
  return dict(os.environ,
              JAX_PLATFORMS="cpu",
              JAX_NUM_CPU_DEVICES=str(devices),
              JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
              JAX_NUM_PROCESSES=str(processes),
              JAX_PROCESS_ID=str(index),
              PYTHONUNBUFFERED="1")


def status(returncode: int) -> int:
  """A shell's exit status: 128 + S for a process killed by signal S."""
  return 128 - returncode if returncode < 0 else returncode


_print_lock = threading.Lock()


def _relay(index: int, pipe) -> None:
  """Prints the lines of one process's output, prefixed, as they arrive."""
  for raw in iter(pipe.readline, b""):
    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    with _print_lock:
      sys.stdout.write(f"[{index}] {line}\n")
      sys.stdout.flush()
  pipe.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  """Sends ``sig`` to a process's group (itself and what it started)."""
  try:
    os.killpg(proc.pid, sig)
  except ProcessLookupError:
    pass


def run(command: Sequence[str], processes: int, devices: int, grace_s: float) -> int:
  """Runs the pod to its end; returns the launcher's exit status."""
  procs: list[subprocess.Popen] = []

  def forward(signum, frame):
    del frame
    for p in procs:
      if p.poll() is None:
        _signal_group(p, signum)

  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, forward)
  port = free_port()
  print(f"{PROG}: {processes} processes x {devices} CPU devices, coordinator "
        f"127.0.0.1:{port}: python -m {' '.join(command)}", file=sys.stderr, flush=True)
  readers = []
  for i in range(processes):
    p = subprocess.Popen([sys.executable, "-m", *command],
                         env=child_env(i, processes, devices, port),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    procs.append(p)
    readers.append(threading.Thread(target=_relay, args=(i, p.stdout), daemon=True))
    readers[-1].start()

  killed: set[int] = set()
  failed_at = None
  while any(p.poll() is None for p in procs):
    time.sleep(0.1)
    failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
    if failed and failed_at is None:
      failed_at = time.monotonic()
    if failed_at is not None and time.monotonic() - failed_at >= grace_s:
      running = [i for i, p in enumerate(procs) if p.poll() is None]
      if running:
        first = failed[0]
        print(f"{PROG}: process {first} exited {status(procs[first].returncode)}; "
              f"killing processes {', '.join(map(str, running))}, still running "
              f"{grace_s:g} s later", file=sys.stderr, flush=True)
        for i in running:
          _signal_group(procs[i], signal.SIGKILL)
          killed.add(i)
  for p in procs:
    p.wait()
  for t in readers:   # a leftover grandchild may hold a pipe open: don't wait on it
    t.join(timeout=5)
  codes = [status(p.returncode) for i, p in enumerate(procs) if i not in killed]
  return next((c for c in codes if c), 0)


def main(argv: Sequence[str]) -> int:
  args, command = parse(argv)
  return run(command, args.processes, args.devices_per_process, args.grace_s)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
