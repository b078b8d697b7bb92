"""Ctrl-C and SIGTERM that stop a run cleanly, between steps.

`graceful` (used by ``train``'s entry point) turns the first SIGINT or
SIGTERM into a request: the training loops finish the step under way, save
a checkpoint of it and raise `Interrupted`, which the entry point reports as
one line ("interrupted at step N; rerun the same command to resume from step
N") with exit code 130. A signal never lands inside XLA compilation or a
checkpoint write, where a ``KeyboardInterrupt`` can leave a half-written
file or crash the process. A second Ctrl-C stops at once
(``KeyboardInterrupt``; the run resumes from its last checkpoint).
"""

from __future__ import annotations

import contextlib
import signal
import threading

_requested: str = ""


class Interrupted(Exception):
  """A loop stopped at a request; ``str(e)`` is the one-line report."""

  def __init__(self, where: str, resume: str):
    self.where, self.resume = where, resume
    super().__init__(f"interrupted {where}; rerun the same command to {resume}")


def requested() -> str:
  """The name of the signal that asked the run to stop ("" if none)."""
  return _requested


def request(name: str = "SIGINT") -> None:
  """Asks the running loop to stop after its current step (tests use it)."""
  global _requested
  _requested = name


def clear() -> None:
  global _requested
  _requested = ""


def _handler(signum, frame):
  del frame
  if _requested:
    raise KeyboardInterrupt   # second signal: stop now
  request(signal.Signals(signum).name)
  # On stdout: stderr gets the one closing line (`Interrupted`).
  print(f"\n{signal.Signals(signum).name}: stopping after the current step "
        f"and saving it (Ctrl-C again to stop now)", flush=True)


@contextlib.contextmanager
def graceful():
  """Installs the handlers for the ``with`` body (main thread only)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  old = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
  clear()
  try:
    yield
  finally:
    for s, h in old.items():
      signal.signal(s, h)
    clear()
