"""SHA256SUMS files: a checkpoint directory that says what its files must be.

A shipped checkpoint (``pretrained/demo_sft``) carries ``SHA256SUMS`` in
``sha256sum`` format ("<hex>  <file>" lines, so ``sha256sum -c SHA256SUMS``
in the directory checks it too). `models.hf_io.load_hf` and
`tokenizer.load_tokenizer` call `verify_checksums` on every directory they
read, so a damaged or changed file stops the run with one line naming it
instead of training from wrong weights or ids. No JAX here.
"""

from __future__ import annotations

import hashlib
import os

CHECKSUM_FILE = "SHA256SUMS"


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def write_checksums(path: str) -> str:
  """Writes ``path/SHA256SUMS`` over every file in the directory (sorted).

  ``sha256sum -c SHA256SUMS`` run in the directory checks it too.
  """
  names = sorted(f for f in os.listdir(path) if f != CHECKSUM_FILE
                 and os.path.isfile(os.path.join(path, f)))
  out = os.path.join(path, CHECKSUM_FILE)
  with open(out + ".tmp", "w") as f:
    f.writelines(f"{_sha256(os.path.join(path, n))}  {n}\n" for n in names)
  os.replace(out + ".tmp", out)
  return out


def verify_checksums(path: str, required: bool = False) -> bool:
  """Checks the files listed in ``path/SHA256SUMS``.

  Returns:
    True when the list exists and every file matches; False when there is
    no list and ``required`` is False.

  Raises:
    ValueError: a listed file is missing or differs (one line naming it), or
      the list is missing while ``required``.
  """
  sums = os.path.join(path, CHECKSUM_FILE)
  if not os.path.isfile(sums):
    if required:
      raise ValueError(f"{path}: no {CHECKSUM_FILE} (cannot check the files)")
    return False
  with open(sums) as f:
    lines = [line.split(None, 1) for line in f if line.strip()]
  for digest, name in lines:
    name = name.strip().lstrip("*")
    target = os.path.join(path, name)
    if not os.path.isfile(target):
      raise ValueError(f"{path}: {name} is listed in {CHECKSUM_FILE} but missing")
    got = _sha256(target)
    if got != digest:
      raise ValueError(f"{target}: checksum mismatch (sha256 {got[:12]}..., "
                       f"{CHECKSUM_FILE} says {digest[:12]}...): the file is "
                       f"damaged or was changed; restore it (git checkout)")
  return True
