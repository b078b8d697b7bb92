"""A real GCS on localhost for the tests: `gcp-storage-emulator`, in memory.

`gcs_bucket` (a pytest fixture, registered in tests/conftest.py) starts one
emulator per test session on a free port and points every GCS client at it:
``STORAGE_EMULATOR_HOST`` (gcsfs, google-cloud-storage), and
``TENSORSTORE_GCS_HTTP_URL`` with ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (Orbax's
TensorStore). Each test gets a bucket of its own, ``gs://<name>``. Subprocesses
inherit the variables, so an entry point run by a test writes to the same
emulator. Nothing here mocks the file layer: the package's code talks HTTP
to a storage server.

Two things the emulator (2026.7.19) lacks are added to it (`make_faithful`):
* GCS refuses an upload with ``ifGenerationMatch=0`` when the object exists
  (HTTP 412); the emulator ignores the precondition. The workdir lock on a
  bucket relies on it.
* GCS sends an object's generation (``x-goog-generation``) with its bytes;
  the emulator does not. TensorStore (Orbax's checkpoints) reads the OCDBT
  manifest by byte range and fails with "Malformed StorageGeneration"
  without it.
"""

from __future__ import annotations

import contextlib
from http import HTTPStatus
import itertools
import os
import socket

import pytest

_COUNTER = itertools.count()
# The variables that point GCS clients at the emulator (set by `gcs_server`).
ENV_KEYS = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
            "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GOOGLE_CLOUD_PROJECT",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")


def emulator_env(base: dict) -> dict:
  """``base`` (a subprocess's environment) plus the emulator's variables."""
  return dict(base, **{k: os.environ[k] for k in ENV_KEYS if k in os.environ})


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _honour_if_generation_match_0(objects) -> None:
  """Makes the emulator's simple and multipart uploads refuse to overwrite an
  existing object when asked ``ifGenerationMatch=0``, as GCS does."""
  if getattr(objects, "_paraagent_if_absent", False):
    return
  from gcp_storage_emulator.exceptions import NotFound  # pylint: disable=g-import-not-at-top

  def if_absent(upload):
    def wrapped(request, response, storage):
      if request.query.get("ifGenerationMatch") == ["0"]:
        name = (request.query["name"][0] if "name" in request.query
                else request.data["meta"].get("name"))
        try:
          storage.get_file_obj(request.params["bucket_name"], name)
        except NotFound:
          pass
        else:
          response.status = HTTPStatus.PRECONDITION_FAILED
          response.json({"error": {"code": 412, "message": "conditionNotMet",
                                   "errors": [{"reason": "conditionNotMet",
                                               "message": "conditionNotMet"}]}})
          return None
      return upload(request, response, storage)
    return wrapped

  objects._media_upload = if_absent(objects._media_upload)  # pylint: disable=protected-access
  objects._multipart_upload = if_absent(objects._multipart_upload)  # pylint: disable=protected-access
  objects._paraagent_if_absent = True


def _send_generation(server_lib, objects) -> None:
  """Adds ``x-goog-generation`` to the emulator's object downloads."""
  original = objects.download
  if getattr(original, "_paraagent_generation", False):
    return

  def download(request, response, storage, *args, **kwargs):
    from gcp_storage_emulator.exceptions import NotFound  # pylint: disable=g-import-not-at-top
    try:
      obj = storage.get_file_obj(request.params["bucket_name"],
                                 request.params["object_id"])
    except NotFound:
      pass
    else:
      response["x-goog-generation"] = str(obj["generation"])
      response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
    return original(request, response, storage, *args, **kwargs)

  download._paraagent_generation = True
  objects.download = download
  for _, handlers in server_lib.HANDLERS:
    for method, fn in list(handlers.items()):
      if fn is original:
        handlers[method] = download


def make_faithful(server_lib, objects) -> None:
  """The emulator's gaps that the package meets, filled (see the docstring)."""
  _honour_if_generation_match_0(objects)
  _send_generation(server_lib, objects)


@pytest.fixture(scope="session")
def gcs_server():
  """The emulator's URL; the environment points GCS clients at it."""
  server_lib = pytest.importorskip("gcp_storage_emulator.server")
  from gcp_storage_emulator.handlers import objects  # pylint: disable=g-import-not-at-top
  make_faithful(server_lib, objects)
  port = _free_port()
  server = server_lib.create_server("127.0.0.1", port, in_memory=True)
  server.start()
  url = f"http://127.0.0.1:{port}"
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
         "GOOGLE_CLOUD_PROJECT": "test",
         # gcsfs asks the storage control API (which the emulator lacks) for
         # each bucket's layout, and warns on every call when it fails.
         "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield url
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    with contextlib.suppress(Exception):
      server.stop()


@pytest.fixture
def gcs_bucket(gcs_server):
  """``gs://NAME``: a new, empty bucket on the emulator for this test."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  name = f"test-bucket-{os.getpid()}-{next(_COUNTER)}"
  storage.Client(project="test").create_bucket(name)
  return f"gs://{name}"
