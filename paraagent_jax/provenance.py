"""Where a run ran: the machine, the accelerator, the versions and XLA flags.

Float rounding differs between CPUs (and XLA versions, and flags), and a
greedy policy's decisions follow the rounding, so a number names the machine
it came from. `machine()` is written next to every stage's ``config.json`` as
``machine.json`` (`rundir.write_config`) and `one_line` heads every report.

    python -m paraagent_jax.provenance       # prints this machine's record
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
from typing import Any

import jax

MACHINE_FILE = "machine.json"
# The CPU flags that change which kernels XLA:CPU and oneDNN pick.
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni",
             "amx_bf16", "amx_tile", "sse4_2", "neon", "asimd", "sve")
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
ENV_VARS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS", "JAX_ENABLE_X64",
            "JAX_DEFAULT_MATMUL_PRECISION", "OPENBLAS_CORETYPE")


def _cpuinfo() -> tuple[str, str, list[str]]:
  """(model name, "family F model M stepping S", the `CPU_FLAGS` present) from
  /proc/cpuinfo (the platform's processor name and no flags elsewhere)."""
  model, flags, ids = platform.processor() or platform.machine(), set(), {}
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f:
        key, _, val = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and val.strip():
          model = val.strip()
        elif key in ("cpu family", "model", "stepping") and key not in ids:
          ids[key] = val.strip()
        elif key in ("flags", "features") and not flags:
          flags = set(val.split())
  except OSError:
    pass
  cpu_id = " ".join(f"{k.replace('cpu ', '')} {ids[k]}" for k in ("cpu family", "model",
                                                                    "stepping") if k in ids)
  return model, cpu_id, [f for f in CPU_FLAGS if f in flags]


def _version(pkg: str) -> str | None:
  try:
    return importlib.metadata.version(pkg)
  except importlib.metadata.PackageNotFoundError:
    return None


def machine() -> dict[str, Any]:
  """This process's machine record (JSON-serialisable)."""
  model, cpu_id, flags = _cpuinfo()
  devices = jax.devices()
  return {
      "cpu": model, "cpu_id": cpu_id, "cpu_flags": flags, "cpu_count": os.cpu_count(),
      "platform": devices[0].platform, "device_kind": devices[0].device_kind,
      "device_count": jax.device_count(), "process_count": jax.process_count(),
      "python": platform.python_version(), "os": platform.platform(),
      "versions": {p: _version(p) for p in PACKAGES},
      "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
      "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
  }


def one_line(m: dict[str, Any] | None = None) -> str:
  """``m`` (default: this machine) as one line for a report's header."""
  m = m or machine()
  v = m.get("versions", {})
  where = (f"{m.get('cpu')} [{m.get('cpu_id', '')}] ({m.get('cpu_count')} cores; "
           f"{' '.join(m.get('cpu_flags', []))})"
           if m.get("platform") == "cpu" else
           f"{m.get('device_count')} x {m.get('device_kind')} ({m.get('platform')}), "
           f"host {m.get('cpu')}")
  xla = m.get("env", {}).get("XLA_FLAGS")
  return (f"{where}; jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, flax {v.get('flax')}; "
          f"python {m.get('python')}; " + (f"XLA_FLAGS {xla!r}" if xla else "no XLA_FLAGS"))


if __name__ == "__main__":
  print(json.dumps(machine(), indent=2))
  print(one_line())
