"""The file layer (paraagent_jax/fileio.py) against a real GCS emulator.

Each function is checked on a bucket and, where the meaning must match, on a
local folder too: the same calls give the same answers on both.
"""

import os

import pytest

from paraagent_jax import fileio


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
  if request.param == "local":
    return str(tmp_path / "run")
  return request.getfixturevalue("gcs_bucket") + "/run"


def test_write_read_list_remove_on_both(root):
  assert not fileio.exists(root)
  fileio.write_json_atomic(f"{root}/a/x.json", {"k": 1})
  fileio.write_text_atomic(f"{root}/a/y.txt", "hello")
  fileio.write_bytes_atomic(f"{root}/b.bin", b"\x00\x01")
  assert fileio.read_json(f"{root}/a/x.json") == {"k": 1}
  assert fileio.read_text(f"{root}/a/y.txt") == "hello"
  assert fileio.isdir(f"{root}/a") and not fileio.isfile(f"{root}/a")
  assert fileio.isfile(f"{root}/b.bin") and fileio.getsize(f"{root}/b.bin") == 2
  assert sorted(fileio.listdir(root)) == ["a", "b.bin"]
  assert sorted(os.path.basename(p) for p in fileio.glob(f"{root}/a/*.json")) == ["x.json"]
  walked = {os.path.relpath(os.path.join(d, f), root)
            for d, _, files in fileio.walk(root) for f in files}
  assert walked == {"a/x.json", "a/y.txt", "b.bin"}
  fileio.copy(f"{root}/a/y.txt", f"{root}/c/y2.txt")
  assert fileio.read_text(f"{root}/c/y2.txt") == "hello"
  fileio.remove(f"{root}/a/y.txt")
  assert not fileio.exists(f"{root}/a/y.txt")
  fileio.rmtree(f"{root}/a")
  assert not fileio.exists(f"{root}/a/x.json")


def test_a_failed_atomic_write_leaves_the_old_file(root):
  fileio.write_text_atomic(f"{root}/f.txt", "old")
  with pytest.raises(RuntimeError):
    with fileio.atomic_open(f"{root}/f.txt") as f:
      f.write("half of the new")
      raise RuntimeError("killed mid-write")
  assert fileio.read_text(f"{root}/f.txt") == "old"
  assert fileio.listdir(root) == ["f.txt"]     # no temporary left behind


def test_create_exclusive_has_one_winner(root):
  fileio.makedirs(root)
  assert fileio.create_exclusive(f"{root}/.lock", "first")
  assert not fileio.create_exclusive(f"{root}/.lock", "second")
  assert fileio.read_text(f"{root}/.lock") == "first"


def test_append_file_keeps_earlier_lines_and_flushes_whole(root):
  with fileio.AppendFile(f"{root}/m.jsonl", flush_every_s=0) as f:
    f.write("1\n")
    assert fileio.read_text(f"{root}/m.jsonl") == "1\n"
  with fileio.AppendFile(f"{root}/m.jsonl", flush_every_s=3600) as f:
    f.write("2\n")
  assert fileio.read_text(f"{root}/m.jsonl") == "1\n2\n"


def test_abspath_keeps_a_bucket_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert fileio.abspath("gs://b/run/") == "gs://b/run"
  assert fileio.abspath("run") == str(tmp_path / "run")
  assert not os.path.exists(tmp_path / "gs:")


def test_a_fresh_listing_shows_another_clients_write(gcs_bucket):
  # Another host writes after this process listed the folder: gcsfs would
  # answer from its cache; the file layer must not.
  from google.cloud import storage
  fileio.write_text_atomic(f"{gcs_bucket}/d/a.txt", "a")
  assert fileio.listdir(f"{gcs_bucket}/d") == ["a.txt"]
  bucket = storage.Client(project="test").bucket(gcs_bucket[len("gs://"):])
  bucket.blob("d/b.txt").upload_from_string("b")
  assert sorted(fileio.listdir(f"{gcs_bucket}/d")) == ["a.txt", "b.txt"]
  assert fileio.exists(f"{gcs_bucket}/d/b.txt")
