"""The one file layer: local paths and ``gs://`` alike, written whole or not at all.

Every read and write of a run directory (workdir, data dir, tokenizer, HF
directory, reports, plots, records, TensorBoard, the lock) goes through
here, so a workdir may be a local folder or a bucket (``gs://bucket/run``,
what a TPU pod's hosts share). A local path uses `os` exactly as before; a
path with a scheme (``gs://``, ``s3://``, ...) goes through `etils.epath`,
the path library Orbax uses, over gcsfs (no TensorFlow needed).

Atomic writes. Every file that a reader (a resumed run, `evaluate`,
`export_hf`, another host, a person) may open while it is written goes
through `atomic_open`: locally the content goes to a temporary file in the
same directory, renamed over the target when complete (``mkstemp`` names,
so writers do not collide); on a bucket the content is uploaded as one
object when complete (a GCS object appears whole or not at all), and
nothing is uploaded if the block raises. `AppendFile` keeps the meaning of
an append-only log (metrics, evaluation records) on a bucket, where objects
cannot be appended to: it rewrites the whole object at each flush.

Listings on a bucket are read fresh (gcsfs caches directory listings per
process; another host's writes would stay invisible).

The lowest layer of the package: the standard library, and etils for
remote paths (imported only when one is used).
"""

from __future__ import annotations

import builtins
import contextlib
import glob as glob_lib
import io
import json
import os
import shutil
import tempfile
import time
from typing import Any, Iterable, Iterator, TextIO


def is_remote(path) -> bool:
  """True for a path with a scheme (``gs://bucket/run``): a bucket, not a disk."""
  return "://" in os.fspath(path)


def _epath(path):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(os.fspath(path))


def _fresh(path) -> None:
  """Drops this process's cached listings (gcsfs) so other hosts' writes show."""
  fs = getattr(_epath(path)._backend, "fs", None)  # pylint: disable=protected-access
  if fs is not None:
    with contextlib.suppress(Exception):
      fs(os.fspath(path)).invalidate_cache()


def check_reachable(path) -> None:
  """Raises `OSError` with one line when a remote path's bucket cannot be
  reached (no network, no credentials, no such bucket); nothing for a local
  path. Entry points call it first, so a wrong bucket costs one line and
  no work (gcsfs would otherwise log a traceback per retry)."""
  path = os.fspath(path)
  if not is_remote(path):
    return
  import logging  # pylint: disable=g-import-not-at-top
  scheme, rest = path.split("://", 1)
  bucket = f"{scheme}://{rest.split('/', 1)[0]}"
  loggers = [logging.getLogger(n) for n in ("gcsfs", "fsspec", "google")]
  levels = [lg.level for lg in loggers]
  for lg in loggers:
    lg.setLevel(logging.CRITICAL)
  try:
    found = exists(bucket)
  except Exception as e:  # pylint: disable=broad-except
    raise OSError(f"{path}: cannot reach {bucket} ({' '.join(str(e).split())[:200]}); "
                  f"check the network and the credentials (gcloud auth "
                  f"application-default login; a TPU VM uses its service "
                  f"account)") from None
  finally:
    for lg, level in zip(loggers, levels):
      lg.setLevel(level)
  if not found:
    raise OSError(f"{path}: no bucket {bucket} (or no access to it)")


def abspath(path) -> str:
  """An absolute local path, or a remote path unchanged (``os.path.abspath``
  would turn ``gs://b/run`` into ``./gs:/b/run``)."""
  path = os.fspath(path)
  if is_remote(path):
    return path.rstrip("/")
  return os.path.abspath(path)


def exists(path) -> bool:
  if not is_remote(path):
    return os.path.exists(path)
  _fresh(path)
  return _epath(path).exists()


def isdir(path) -> bool:
  if not is_remote(path):
    return os.path.isdir(path)
  _fresh(path)
  return _epath(path).is_dir()


def isfile(path) -> bool:
  if not is_remote(path):
    return os.path.isfile(path)
  _fresh(path)
  return _epath(path).is_file()


def makedirs(path) -> None:
  """Creates ``path`` and its parents (nothing to do on a bucket, where a
  folder exists once an object is under it)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def listdir(path) -> list[str]:
  """The names (not paths) of the entries of directory ``path``."""
  if not is_remote(path):
    return os.listdir(path)
  _fresh(path)
  return [p.name for p in _epath(path).iterdir()]


def glob(pattern: str) -> list[str]:
  """The paths that match ``pattern`` (``*`` in the last part only on a bucket)."""
  if not is_remote(pattern):
    return glob_lib.glob(pattern)
  parent, name = os.path.split(pattern)
  _fresh(parent)
  return [os.path.join(parent, p.name) for p in _epath(parent).glob(name)]


def getsize(path) -> int:
  if not is_remote(path):
    return os.path.getsize(path)
  return _epath(path).stat().length


def remove(path) -> None:
  """Deletes one file; a missing one is an error (`FileNotFoundError`)."""
  if not is_remote(path):
    os.remove(path)
  else:
    _epath(path).unlink()


def rmtree(path) -> None:
  if not is_remote(path):
    shutil.rmtree(path)
  else:
    _epath(path).rmtree()


def rename(src, dst) -> None:
  """Moves a file or a directory (``os.replace`` locally; on a bucket a copy
  of every object, then a delete: not atomic there)."""
  if not is_remote(src) and not is_remote(dst):
    os.replace(src, dst)
  else:
    _epath(src).rename(_epath(dst))


def walk(path) -> Iterator[tuple[str, list[str], list[str]]]:
  """``os.walk`` for both kinds of path (top-down)."""
  if not is_remote(path):
    yield from os.walk(path)
    return
  _fresh(path)
  dirs, files = [], []
  for p in sorted(_epath(path).iterdir()):
    (dirs if p.is_dir() else files).append(p.name)
  yield os.fspath(path), dirs, files
  for d in dirs:
    yield from walk(os.path.join(os.fspath(path), d))


def open(path, mode: str = "r", encoding: str | None = None):  # pylint: disable=redefined-builtin
  """``open`` for both kinds of path. Writing a remote file this way is not
  atomic: writers use `atomic_open` or `AppendFile`."""
  if not is_remote(path):
    if "b" not in mode and encoding is None:
      encoding = "utf-8"
    return builtins.open(path, mode, encoding=encoding)
  if "a" in mode:
    raise ValueError(f"{path}: objects in a bucket cannot be appended to; "
                     f"use fileio.AppendFile")
  if "r" in mode:
    _fresh(path)
  f = _epath(path).open(mode.replace("t", ""))
  return f


def read_text(path) -> str:
  with open(path) as f:
    return f.read()


def read_json(path) -> Any:
  with open(path) as f:
    return json.load(f)


def copy(src, dst) -> None:
  """Copies one file (either side local or remote)."""
  with open(src, "rb") as fin, atomic_open(dst, binary=True) as fout:
    shutil.copyfileobj(fin, fout)


@contextlib.contextmanager
def atomic_open(path, encoding: str = "utf-8", binary: bool = False
                ) -> Iterator[TextIO]:
  """A file that appears at ``path`` only once the block completes.

  Creates the parent directory. On an exception nothing is written and
  ``path`` is untouched.
  """
  path = os.fspath(path)
  if is_remote(path):
    buf = io.BytesIO() if binary else io.StringIO()
    yield buf
    data = buf.getvalue()
    with _epath(path).open("wb") as f:      # one upload: the object whole
      f.write(data if binary else data.encode(encoding))
    return
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with (os.fdopen(fd, "wb") if binary else
          os.fdopen(fd, "w", encoding=encoding)) as f:
      yield f
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; readers may be other users.
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def write_text_atomic(path, text: str) -> str:
  """Writes ``text`` to ``path`` atomically; returns ``path``."""
  with atomic_open(path) as f:
    f.write(text)
  return path


def write_bytes_atomic(path, data: bytes) -> str:
  """Writes ``data`` to ``path`` atomically; returns ``path``."""
  with atomic_open(path, binary=True) as f:
    f.write(data)
  return path


def write_json_atomic(path, obj: Any, **dump_kwargs) -> str:
  """Writes one JSON document atomically (``indent=1, default=str`` unless
  ``dump_kwargs`` say otherwise); returns ``path``."""
  kwargs = {"indent": 1, "default": str} | dump_kwargs
  with atomic_open(path) as f:
    json.dump(obj, f, **kwargs)
  return path


def write_jsonl_atomic(path, records: Iterable[Any], **dump_kwargs) -> int:
  """Writes one JSON document per line atomically; returns the line count."""
  n = 0
  with atomic_open(path) as f:
    for r in records:
      f.write(json.dumps(r, **dump_kwargs) + "\n")
      n += 1
  return n


def create_exclusive(path, text: str) -> bool:
  """Creates ``path`` with ``text`` only if it does not exist; False if it did.

  Locally ``O_CREAT | O_EXCL``; on GCS an upload with
  ``ifGenerationMatch=0`` (google-cloud-storage, which gcsfs brings), which
  the store refuses if any object has the name: one creator wins.
  """
  path = os.fspath(path)
  if not is_remote(path):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return True
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  if not path.startswith("gs://"):
    raise ValueError(f"{path}: an exclusive create needs a local path or gs://")
  bucket, _, name = path[len("gs://"):].partition("/")
  blob = storage.Client().bucket(bucket).blob(name)
  try:
    blob.upload_from_string(text.encode(), if_generation_match=0)
  except exceptions.PreconditionFailed:
    return False
  return True


class AppendFile:
  """An append-only text log (one JSON line per record) that readers may
  read at any time.

  Locally a file opened for append, flushed per write. On a bucket, where
  an object cannot grow, the lines are kept in memory (with what the object
  held before) and the whole object is rewritten at `flush`, at most every
  ``flush_every_s`` seconds from `write` and always at `close`: a reader sees
  the object of the last flush, whole; a kill loses at most the lines since.
  """

  def __init__(self, path, flush_every_s: float = 10.0):
    self.path = os.fspath(path)
    self._remote = is_remote(self.path)
    self._every = flush_every_s
    if not self._remote:
      makedirs(os.path.dirname(os.path.abspath(self.path)))
      self._f = builtins.open(self.path, "a", encoding="utf-8")
      return
    self._lines = [read_text(self.path)] if exists(self.path) else []
    self._dirty, self._last = False, time.monotonic()

  def write(self, text: str) -> None:
    if not self._remote:
      self._f.write(text)
      self._f.flush()
      return
    self._lines.append(text)
    self._dirty = True
    if time.monotonic() - self._last >= self._every:
      self.flush()

  def flush(self) -> None:
    if not self._remote:
      self._f.flush()
    elif self._dirty:
      write_text_atomic(self.path, "".join(self._lines))
      self._dirty, self._last = False, time.monotonic()

  def close(self) -> None:
    if not self._remote:
      self._f.close()
    else:
      self.flush()

  def __enter__(self) -> "AppendFile":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
