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
