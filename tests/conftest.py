"""Test set-up: 8 CPU devices for JAX, before anything touches a backend.

ToolEnv tests must not need JAX: this file imports JAX only if it is
installed, and ToolEnv test modules never import it themselves.
"""

import atexit
import os
import shutil
import tempfile

# Keep tests on the CPU even on a machine with an accelerator, and quiet.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# One persistent compilation cache for the whole run, shared by the
# subprocesses the tests start (they inherit the environment): many tests
# compile the same programs (a stage and its rerun after a kill, the
# processes of a pod, `evaluate` after `train`), and compiling is most of a
# small model's time on the CPU. Every program is cached (thresholds 0).
# A run starts with an empty cache, so no test depends on an earlier run;
# set JAX_COMPILATION_CACHE_DIR yourself to keep one between runs.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix="paraagent-jax-test-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

try:
  import jax
except ImportError:  # ToolEnv-only environments.
  jax = None

if jax is not None:
  jax.config.update("jax_num_cpu_devices", 8)


import gc  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

import pytest  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drops JAX's compiled programs after each test module: the full suite's
  process otherwise keeps every module's executables and grew to ~8 GB."""
  yield
  if jax is not None:
    jax.clear_caches()
  gc.collect()


# A local GCS emulator for the gs:// tests: the fixtures gcs_server, gcs_bucket.
pytest_plugins = ["tests.gcs_emulator"]
