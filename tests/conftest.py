"""Test set-up: 8 CPU devices for JAX, before anything touches a backend.

ToolEnv tests must not need JAX: this file imports JAX only if it is
installed, and ToolEnv test modules never import it themselves.
"""

import os

# Keep tests on the CPU even on a machine with an accelerator, and quiet.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

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
