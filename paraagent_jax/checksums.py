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
import json
import os

from paraagent_jax import fileio

CHECKSUM_FILE = "SHA256SUMS"


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with fileio.open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def write_checksums(path: str) -> str:
  """Writes ``path/SHA256SUMS`` over every file in the directory (sorted).

  ``sha256sum -c SHA256SUMS`` run in the directory checks it too.
  """
  names = sorted(f for f in fileio.listdir(path) if f != CHECKSUM_FILE
                 and fileio.isfile(os.path.join(path, f)))
  out = os.path.join(path, CHECKSUM_FILE)
  return fileio.write_text_atomic(
      out, "".join(f"{_sha256(os.path.join(path, n))}  {n}\n" for n in names))


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
  if not fileio.isfile(sums):
    if required:
      raise ValueError(f"{path}: no {CHECKSUM_FILE} (cannot check the files)")
    return False
  with fileio.open(sums) as f:
    lines = [line.split(None, 1) for line in f if line.strip()]
  for digest, name in lines:
    name = name.strip().lstrip("*")
    target = os.path.join(path, name)
    if not fileio.isfile(target):
      raise ValueError(f"{path}: {name} is listed in {CHECKSUM_FILE} but missing")
    got = _sha256(target)
    if got != digest:
      raise ValueError(f"{target}: checksum mismatch (sha256 {got[:12]}..., "
                       f"{CHECKSUM_FILE} says {digest[:12]}...): the file is "
                       f"damaged or was changed; restore it (git checkout)")
  return True


# A training checkpoint step (an Orbax directory tree) gets its own list:
# ``checksums.json`` inside the step directory, written once Orbax has
# finished the step, with every file's size and (below HASH_LIMIT_BYTES in
# all) its SHA-256. A truncated or rewritten file is then named before Orbax
# is asked to read it, instead of surfacing as TensorStore errors.
TREE_MANIFEST = "checksums.json"
HASH_LIMIT_BYTES = 4 << 30   # larger steps (billion-parameter runs): sizes only


def _tree_files(path: str) -> list[str]:
  out = []
  for root, _, files in fileio.walk(path):
    for f in files:
      rel = os.path.relpath(os.path.join(root, f), path)  # a string op: also gs://
      if rel != TREE_MANIFEST and not rel.endswith(".tmp"):
        out.append(rel.replace(os.sep, "/"))
  return sorted(out)


def write_tree_manifest(path: str, hash_limit: int = HASH_LIMIT_BYTES) -> str:
  """Writes ``path/checksums.json``: size and SHA-256 of every file below.

  Hashes are left out (sizes only) when the files total over ``hash_limit``
  bytes, so that sealing a multi-GB step does not stall training.
  """
  names = _tree_files(path)
  sizes = {n: fileio.getsize(os.path.join(path, n)) for n in names}
  hashed = sum(sizes.values()) <= hash_limit
  files = {n: {"size": sizes[n]} | (
      {"sha256": _sha256(os.path.join(path, n))} if hashed else {}) for n in names}
  out = os.path.join(path, TREE_MANIFEST)
  return fileio.write_json_atomic(out, {"files": files}, indent=0, sort_keys=True,
                                  default=None)


def verify_tree_manifest(path: str) -> bool:
  """Checks ``path/checksums.json`` if there is one.

  Returns:
    True when the manifest exists and every file matches; False when there
    is no manifest (a step saved before manifests, or one whose save did
    not finish sealing).

  Raises:
    ValueError: a listed file is missing, has another size or another hash
      (one line naming the file).
  """
  manifest = os.path.join(path, TREE_MANIFEST)
  if not fileio.isfile(manifest):
    return False
  try:
    with fileio.open(manifest) as f:
      files = json.load(f)["files"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{manifest} is unreadable ({type(e).__name__})") from None
  for name, want in sorted(files.items()):
    target = os.path.join(path, name)
    if not fileio.isfile(target):
      raise ValueError(f"{name} is missing")
    size = fileio.getsize(target)
    if size != want["size"]:
      raise ValueError(f"{name} has {size} bytes, {want['size']} when saved "
                       f"({'truncated' if size < want['size'] else 'changed'})")
    if "sha256" in want and _sha256(target) != want["sha256"]:
      raise ValueError(f"{name} differs from what was saved (sha256)")
  return True
