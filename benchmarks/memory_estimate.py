"""Per-device memory of a config's model: params, AdamW, rollout KV cache.

Nothing is allocated: parameter and optimizer shapes come from
`jax.eval_shape` (`paraagent_jax.models.memory.memory_per_device`) on an abstract
mesh of any size; the KV cache is counted from its shape [L, B, K, S, H]
with the batch split over data x fsdp and kv heads over tensor (when they
divide), as `sampling.kv_cache.constrain_cache` lays it out.

  PYTHONPATH=. python benchmarks/memory_estimate.py --config=configs/paraagent_4b.py:slice=v5p-64

Activations are not counted (that needs the compiled step; see --dry_run).
"""

from __future__ import annotations

import argparse

import numpy as np

from paraagent_jax import config_utils
from paraagent_jax import sharding as shd
from paraagent_jax.models import memory
from paraagent_jax.models import qwen3


def kv_cache_bytes_per_device(cfg: qwen3.Qwen3Config, batch: int, max_len: int,
                              mesh_shape: dict, dtype: str = "bfloat16") -> int:
  """Bytes of K and V per device for `batch` rows of `max_len` slots."""
  dp = mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1)
  tp = mesh_shape.get("tensor", 1)
  rows = batch // dp if batch % dp == 0 else batch
  heads = cfg.num_kv_heads // tp if cfg.num_kv_heads % tp == 0 else cfg.num_kv_heads
  per = cfg.num_layers * rows * max_len * heads * cfg.head_dim
  return 2 * per * np.dtype(dtype).itemsize


def main() -> None:
  """Prints the memory table of one config."""
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--config", required=True)
  args = p.parse_args()
  c = config_utils.load_config(args.config)
  cfg = qwen3.Qwen3Config.preset(c.model.preset, scan_layers=True,
                                 param_dtype=c.model.param_dtype)
  mesh = dict(c.mesh)
  mem = memory.memory_per_device(cfg, shd.abstract_mesh(mesh))
  rollouts = c.rl.tasks_per_iter * c.rl.group_size
  kv = kv_cache_bytes_per_device(cfg, rollouts, c.rl.max_len, mesh,
                                 c.model.dtype)
  gib = 2 ** 30
  total = mem["total"] + kv
  print(f"{c.model.preset}: {mem['num_params'] / 1e9:.2f}B params, mesh {mesh}")
  print(f"  params      {mem['params'] / gib:8.2f} GiB/device")
  print(f"  adamw       {mem['optimizer'] / gib:8.2f} GiB/device")
  print(f"  kv cache    {kv / gib:8.2f} GiB/device ({rollouts} rollouts x "
        f"{c.rl.max_len} tokens, {c.model.dtype})")
  print(f"  total       {total / gib:8.2f} GiB/device (activations not counted)")
  hbm = c.get("hbm_gb", 0)
  if hbm:
    verdict = "fits" if total < hbm * 1e9 else "does NOT fit"
    print(f"  {verdict} in {hbm} GB HBM per chip")


if __name__ == "__main__":
  main()
