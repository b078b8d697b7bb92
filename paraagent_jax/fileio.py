"""Files written whole or not at all: the one place the project writes atomically.

Every file that a reader (a resumed run, `evaluate`, `export_hf`, a person)
may open while it is being written goes through `atomic_open`: the content
goes to a temporary file in the same directory, which is renamed over the
target only when it is complete, so a kill leaves the old file or the new
one, never half of one. Temporary names are unique (``mkstemp``), so threads
and processes writing the same file do not collide.

The lowest layer of the package: the standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterable, Iterator, TextIO


@contextlib.contextmanager
def atomic_open(path: str, encoding: str = "utf-8") -> Iterator[TextIO]:
  """A text file that appears at ``path`` only once the block completes.

  Creates the parent directory. On an exception the temporary file is
  removed and ``path`` is untouched.
  """
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "w", encoding=encoding) as f:
      yield f
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; readers may be other users.
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def write_text_atomic(path: str, text: str) -> str:
  """Writes ``text`` to ``path`` atomically; returns ``path``."""
  with atomic_open(path) as f:
    f.write(text)
  return path


def write_json_atomic(path: str, obj: Any, **dump_kwargs) -> str:
  """Writes one JSON document atomically (``indent=1, default=str`` unless
  ``dump_kwargs`` say otherwise); returns ``path``."""
  kwargs = {"indent": 1, "default": str} | dump_kwargs
  with atomic_open(path) as f:
    json.dump(obj, f, **kwargs)
  return path


def write_jsonl_atomic(path: str, records: Iterable[Any], **dump_kwargs) -> int:
  """Writes one JSON document per line atomically; returns the line count."""
  n = 0
  with atomic_open(path) as f:
    for r in records:
      f.write(json.dumps(r, **dump_kwargs) + "\n")
      n += 1
  return n
