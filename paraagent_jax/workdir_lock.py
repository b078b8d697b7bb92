"""One run per workdir: a lock file holding the owner's pid and host.

``train`` takes ``WORKDIR/.lock`` before it writes anything and removes it
when it exits (normally, on an error or on an interrupt). A second command on
the same workdir stops with one line naming the owner, instead of resuming
from checkpoints the first is still writing. A lock left by a process that
is gone (killed, machine rebooted) is stale: on the same host the pid is
checked and the lock is taken over with a note; a lock from another host
cannot be checked from here, so the message says which file to delete.

Only the primary process takes the lock (hosts of one multi-host job share
the workdir); ``PARAAGENT_NO_LOCK=1`` turns the lock off for file systems
without exclusive create.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time

from paraagent_jax import config_utils

LOCK_FILE = ".lock"


class WorkdirLocked(config_utils.ConfigError):
  """Another live run holds the workdir; the message is one line."""


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:    # exists, owned by another user
    return True
  return True


def _read(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}   # half-written or garbage: treated as stale below


def acquire(workdir: str) -> str:
  """Takes ``workdir/.lock``; returns its path ("" if this process already
  holds it). Raises `WorkdirLocked` if a live run holds it."""
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:   # a parent is a file, no permission, read-only disk
    raise config_utils.ConfigError(
        f"workdir {workdir}: cannot create it ({e.strerror or e})") from None
  path = os.path.join(workdir, LOCK_FILE)
  host = socket.gethostname()
  me = {"pid": os.getpid(), "host": host, "since": time.strftime(
      "%Y-%m-%d %H:%M:%S"), "argv": " ".join(sys.argv)}
  for _ in range(3):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      owner = _read(path)
      pid, where = owner.get("pid"), owner.get("host")
      if isinstance(pid, int) and where == host and _alive(pid):
        if pid == os.getpid():
          return ""            # already ours: the outer holder releases it
        raise WorkdirLocked(
            f"workdir {workdir} is in use by pid {pid} on {host} since "
            f"{owner.get('since', '?')} ({owner.get('argv', '')[:120]}); wait "
            f"for it to finish or stop it, then rerun to resume")
      if isinstance(pid, int) and where and where != host:
        raise WorkdirLocked(
            f"workdir {workdir} is locked by pid {pid} on host {where} since "
            f"{owner.get('since', '?')}; if no run is active there, delete "
            f"{path} and rerun")
      print(f"workdir lock: taking over a stale lock ({path}: pid {pid} on "
            f"{where} is not running)", file=sys.stderr, flush=True)
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
      continue
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
    return path
  raise WorkdirLocked(f"workdir {workdir}: could not take {path} (another run "
                      f"keeps creating it)")


def release(path: str) -> None:
  """Removes the lock if this process owns it."""
  if _read(path).get("pid") == os.getpid():
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)


@contextlib.contextmanager
def held(workdir: str, enabled: bool = True):
  """Holds the workdir lock for the ``with`` body (no-op when disabled)."""
  if not enabled or os.environ.get("PARAAGENT_NO_LOCK") == "1":
    yield None
    return
  path = acquire(workdir)
  try:
    yield path
  finally:
    if path:
      release(path)
