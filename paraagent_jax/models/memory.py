"""Memory of a Qwen3 on a mesh, without allocating: parameters and AdamW state.

`memory_per_device` builds the model and the optimizer state with
`jax.eval_shape` and sums each leaf's bytes per device under the shardings of
`paraagent_jax.sharding`; `benchmarks/memory_estimate.py` prints the table for
several meshes. (The compiled per-program peaks are `paraagent_jax.dry_run`'s.)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from flax import nnx
import jax
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
import optax

from paraagent_jax import sharding as shd
from paraagent_jax.models import qwen3


def _leaf_bytes_per_device(shape, dtype, sharding) -> int:
  shard = sharding.shard_shape(tuple(shape)) if shape else ()
  return int(np.prod(shard, dtype=np.int64)) * np.dtype(dtype).itemsize


def memory_per_device(config, mesh, rules=None, optimizer=None) -> dict[str, int]:
  """Parameter and optimizer-state bytes per device, without allocating.

  The model and the optimizer state are built with `jax.eval_shape`; each
  optimizer leaf that mirrors a parameter (AdamW mu / nu) gets that parameter's
  sharding, other leaves (step counts) are replicated.

  Args:
    config: a `qwen3.Qwen3Config`.
    mesh: a Mesh or AbstractMesh (any size; no devices are touched).
    rules: logical-axis rules (default `sharding.DEFAULT_RULES`).
    optimizer: an optax GradientTransformation (default optax.adamw(1e-4)).

  Returns:
    {"params": bytes, "optimizer": bytes, "total": bytes, "num_params": n}.
  """
  optimizer = optimizer or optax.adamw(1e-4)
  abs_model = nnx.eval_shape(lambda: qwen3.Qwen3(config, rngs=nnx.Rngs(0)))
  state = nnx.state(abs_model, nnx.Param)
  shard_tree = shd.param_shardings(state, mesh, rules)
  pure = nnx.to_pure_dict(state)
  pure_sh = nnx.to_pure_dict(shard_tree)
  by_path = {}
  p_bytes = n_params = 0
  for (path, leaf), (_, sh) in zip(
      jax.tree_util.tree_flatten_with_path(pure)[0],
      jax.tree_util.tree_flatten_with_path(pure_sh)[0]):
    by_path[path] = sh
    p_bytes += _leaf_bytes_per_device(leaf.shape, leaf.dtype, sh)
    n_params += int(np.prod(leaf.shape, dtype=np.int64))
  opt_state = jax.eval_shape(optimizer.init, pure)
  replicated = NamedSharding(mesh, PartitionSpec())
  o_bytes = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
    sh = replicated
    for start in range(len(path)):
      if path[start:] in by_path:
        sh = by_path[path[start:]]
        break
    o_bytes += _leaf_bytes_per_device(leaf.shape, leaf.dtype, sh)
  return {"params": p_bytes, "optimizer": o_bytes, "total": p_bytes + o_bytes,
          "num_params": n_params}


def print_memory_table(config, meshes: Sequence[Mapping[str, int]], rules=None
                       ) -> list[dict[str, Any]]:
  """Prints (and returns) params/AdamW bytes per device for several meshes."""
  rows = []
  print(f"{'mesh (data,fsdp,tensor)':>24} {'params GiB':>11} {'adamw GiB':>10} "
        f"{'total GiB':>10}")
  for shape in meshes:
    m = memory_per_device(config, shd.abstract_mesh(shape), rules)
    sizes = tuple(int(shape.get(a, 1)) for a in shd.MESH_AXES)
    gib = {k: m[k] / 2 ** 30 for k in ("params", "optimizer", "total")}
    print(f"{str(sizes):>24} {gib['params']:11.3f} {gib['optimizer']:10.3f} "
          f"{gib['total']:10.3f}")
    rows.append({"mesh": sizes, **m})
  return rows
