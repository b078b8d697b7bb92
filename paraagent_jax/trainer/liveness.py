"""A dead process stops the others within a bound, with one line naming it.

On several JAX processes (the hosts of a pod, `paraagent_jax.local_pod` on
this CPU) every step is a collective: when one process dies (kill -9, a lost
host, an out-of-memory kill) the others block in their next collective. JAX
0.10's own detection is the coordination service's heartbeat (process 0
holds it): after ``heartbeat_timeout_seconds`` without one it aborts every
other process with a C++ check failure (a stack trace, exit 134), or a CPU
collective fails with a gloo error; a process stopped without a heartbeat
timeout (on a peer's Python error, its shutdown waiting at a barrier) can wait
for minutes.

`Watchdog` bounds it by ``config.host_timeout_s``: a daemon thread of each
process posts a counter under ``KEY_PREFIX`` in the coordination service's
key-value store every `interval` seconds and reads the others'. The thread
runs while the main thread waits in a collective, a computation or file I/O
(they release the GIL). A process whose counter has not moved for the bound
is gone: the watcher prints one line naming it on stderr and ends its own
process at once with exit status 1 (``os._exit``: the main thread may be
blocked in a collective that never returns, and JAX's exit handlers would
wait at a shutdown barrier for the dead process). If the store itself cannot
be reached for the bound, process 0 (which holds it) is the one gone. The
rerun of the same command on every host resumes from the last complete
checkpoint. JAX's own heartbeat timeout is set above the bound
(`jax_heartbeat_timeout`), a backstop that no longer speaks first.

A process that ends cleanly (done, or interrupted at the step all agreed on)
posts ``done`` (`finished`) and is no longer watched, so a primary host that
seals its last checkpoint for minutes after the others exited is not taken
for dead. A process that exits on an error posts nothing: the others, blocked
in a collective it will never join, stop within the bound.

Only on several processes (`start` is called by
`trainer.state.maybe_initialize_distributed` when ``jax.process_count() > 1``);
the generic mechanism covers every stage (SFT, RL, the pipeline) and entry
point that joins the pod that way.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
from typing import Any, Callable

import jax
from jax._src import distributed

KEY_PREFIX = "paraagent_jax/alive/"
DONE = "done"

_watchdog: "Watchdog | None" = None


def interval(timeout_s: float) -> float:
  """Seconds between heartbeats (and checks): a tenth of the bound, 0.5-10 s."""
  return min(10.0, max(0.5, timeout_s / 10))


def jax_heartbeat_timeout(timeout_s: float) -> int:
  """JAX's heartbeat timeout for a bound: far enough above it that the
  watchdog (which speaks within ``timeout_s + interval``) is first."""
  return int(math.ceil(timeout_s + 3 * interval(timeout_s))) + 10


def _one_line(err: BaseException) -> str:
  text = " ".join(str(err).split())
  return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


class Watchdog:
  """Heartbeats of this process and the watch over the others'.

  Args:
    client: JAX's distributed runtime client (``key_value_set``,
      ``key_value_dir_get``).
    index: this process (``jax.process_index()``).
    count: the processes (``jax.process_count()``).
    timeout_s: the bound.
    prog: the program name that opens the line (``paraagent_jax.train``).
    clock, exit: time and the process exit (tests replace them).
  """

  def __init__(self, client, index: int, count: int, timeout_s: float, prog: str,
               clock: Callable[[], float] = time.monotonic,
               exit: Callable[[int], Any] = os._exit):   # pylint: disable=redefined-builtin
    if timeout_s <= 0:
      raise ValueError(f"host_timeout_s={timeout_s} must be > 0")
    self._client, self.index, self.count = client, int(index), int(count)
    self.timeout_s, self._prog = float(timeout_s), prog
    self._clock, self._exit = clock, exit
    self._beat = 0
    now = clock()
    # Per other process: (last value read, when it changed); a process that
    # never posted counts from the start.
    self._seen = {i: (None, now) for i in range(self.count) if i != self.index}
    self._store_ok = now
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

  def start(self) -> None:
    self.beat()
    self._thread.start()
    # Run before JAX's own exit handler (registered earlier, so run later),
    # which waits at a shutdown barrier: an exiting process stops beating.
    atexit.register(self.stop)

  def stop(self) -> None:
    self._stop.set()

  def finished(self) -> None:
    """Posts ``done``: the others stop watching this process; so does it."""
    self.stop()
    try:
      self._client.key_value_set(f"{KEY_PREFIX}{self.index}", DONE, allow_overwrite=True)
    except Exception:   # pylint: disable=broad-except
      pass   # the store is gone (process 0 exited): nobody is watching

  def beat(self) -> None:
    self._beat += 1
    self._client.key_value_set(f"{KEY_PREFIX}{self.index}", str(self._beat),
                               allow_overwrite=True)

  def check(self) -> str:
    """One round: beat, read the others; returns the line to stop with ("" =
    all alive)."""
    now = self._clock()
    try:
      self.beat()
      values = dict(self._client.key_value_dir_get(KEY_PREFIX))
    except Exception as e:   # pylint: disable=broad-except
      if now - self._store_ok >= self.timeout_s:
        return (f"process 0 of {self.count} (it holds the coordination service) "
                f"cannot be reached for {self.timeout_s:g} s ({_one_line(e)})")
      return ""
    self._store_ok = now
    for i, (old, since) in sorted(self._seen.items()):
      value = values.get(f"{KEY_PREFIX}{i}")
      if value == DONE:
        del self._seen[i]
      elif value != old:
        self._seen[i] = (value, now)
      elif now - since >= self.timeout_s:
        return (f"process {i} of {self.count} sent no heartbeat for "
                f"{self.timeout_s:g} s (killed, crashed or cut off)")
    return ""

  def fail(self, why: str) -> None:
    """The one line on stderr, then this process ends (status 1)."""
    sys.stdout.flush()
    print(f"{self._prog}: error: {why}; stopping process {self.index} too: rerun the "
          "same command on every host to resume from the last complete checkpoint",
          file=sys.stderr, flush=True)
    self._exit(1)

  def _run(self) -> None:
    while not self._stop.wait(interval(self.timeout_s)):
      why = self.check()
      if why and not self._stop.is_set():
        self.fail(why)
        return


def start(timeout_s: float, prog: str) -> Watchdog | None:
  """Starts this process's watchdog (JAX's distributed client must be up);
  None where there is no client (one process)."""
  global _watchdog
  client = distributed.global_state.client
  if client is None or jax.process_count() < 2:
    return None
  _watchdog = Watchdog(client, jax.process_index(), jax.process_count(), timeout_s, prog)
  _watchdog.start()
  return _watchdog


def finished() -> None:
  """This process ends cleanly: stop watching and tell the others (no-op
  without a watchdog)."""
  if _watchdog is not None:
    _watchdog.finished()


def wait_for_verdict() -> None:
  """After a failed collective: gives the watchdog one bound (and a round)
  to name a process that is gone, which ends this process; returns when
  every process is alive (the error is then the collective's own)."""
  w = _watchdog
  if w is None or w._stop.is_set():   # pylint: disable=protected-access
    return
  w._thread.join(w.timeout_s + 2 * interval(w.timeout_s))   # pylint: disable=protected-access
