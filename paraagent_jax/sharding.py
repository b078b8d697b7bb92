"""Device meshes, logical-axis rules, and helpers that shard models and activations.

Parameters and key activations carry *logical* axis names ("embed", "mlp",
"batch", ...). One rules table maps each logical name to mesh axes of a mesh with
axes ("data", "fsdp", "tensor"). The mapping is resolved per array with a
divisibility fallback: a mesh axis that does not divide the dimension is dropped
for that array (e.g. 2 kv heads on a 4-way tensor axis stay replicated) rather
than failing, and `check_sharded` reports large arrays that ended up replicated.

`constrain` applies `with_sharding_constraint` on every backend, the CPU
included, whenever the mesh has more than one device: the 8-CPU-device tests then
exercise the same partitioning as a TPU pod.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from flax import nnx
import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec
import numpy as np

MESH_AXES = ("data", "fsdp", "tensor")

# Logical name -> mesh axis (a name, a tuple of names, or None = replicated).
DEFAULT_RULES: dict[str, Any] = {
    # Parameters.
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "layers": None,
    # Activations and the KV cache.
    "batch": ("data", "fsdp"),
    "seq": None,
    "cache_seq": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
}

Rules = tuple[tuple[str, Any], ...]


def make_mesh(shape: Mapping[str, int], devices: Sequence[Any] | None = None
              ) -> jax.sharding.Mesh:
  """A mesh with axes ("data", "fsdp", "tensor") and Auto axis types.

  Args:
    shape: axis name -> size; missing axes get 1; one size may be -1 (filled
      from the device count).
    devices: devices to use (default: all of `jax.devices()`).

  Raises:
    ValueError: unknown axis names, more than one -1, or sizes that do not
      multiply to the device count.
  """
  devices = list(jax.devices() if devices is None else devices)
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"unknown mesh axes {sorted(unknown)}; expected {MESH_AXES}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got {dict(shape)}")
  if -1 in sizes:
    known = math.prod(s for s in sizes if s != -1)
    if known <= 0 or len(devices) % known:
      raise ValueError(f"cannot fill -1 in {dict(shape)} from {len(devices)} devices")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices) or min(sizes) < 1:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)}"
                     f" devices, have {len(devices)}")
  return jax.make_mesh(tuple(sizes), MESH_AXES,
                       axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def abstract_mesh(shape: Mapping[str, int]) -> jax.sharding.AbstractMesh:
  """A device-free mesh of any size (for memory estimates of big pods)."""
  sizes = tuple(int(shape.get(a, 1)) for a in MESH_AXES)
  return jax.sharding.AbstractMesh(sizes, MESH_AXES,
                                   axis_types=(AxisType.Auto,) * len(MESH_AXES))


def as_rules(rules: Mapping[str, Any] | Rules | None) -> Rules:
  """Normalises a rules table to a hashable tuple of (logical, mesh axes)."""
  if rules is None:
    rules = DEFAULT_RULES
  items = rules.items() if isinstance(rules, Mapping) else rules
  return tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in items)


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int],
                    mesh, rules) -> PartitionSpec:
  """The PartitionSpec for an array, dropping mesh axes that do not divide it."""
  table = dict(as_rules(rules))
  if len(logical_axes) != len(shape):
    raise ValueError(f"logical axes {tuple(logical_axes)} do not match shape "
                     f"{tuple(shape)}")
  used: set[str] = set()
  spec = []
  for name, dim in zip(logical_axes, shape):
    target = table.get(name) if name is not None else None
    if target is None:
      spec.append(None)
      continue
    axes = (target,) if isinstance(target, str) else tuple(target)
    kept = []
    for ax in axes:
      size = mesh.shape.get(ax, 1)
      if ax in used or size == 1:
        continue
      if dim % (math.prod(mesh.shape[a] for a in kept) * size) == 0:
        kept.append(ax)
    used.update(kept)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*spec)


def constrain(x, logical_axes, mesh, rules=None):
  """`with_sharding_constraint` by logical names; applies on every backend.

  A no-op only when there is no mesh or the mesh has a single device (then
  there is nothing to partition).
  """
  if mesh is None or mesh.size == 1:
    return x
  spec = logical_to_spec(logical_axes, x.shape, mesh, rules)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _is_param(x) -> bool:
  return isinstance(x, nnx.Variable)


def _names(var) -> tuple:
  names = var.get_metadata().get("out_sharding")
  if names is None:
    return (None,) * len(var.shape)
  return tuple(names)


def param_shardings(state, mesh, rules=None):
  """A tree like `state` (nnx.State of Params) with a NamedSharding per leaf."""
  return jax.tree.map(
      lambda v: v.replace(NamedSharding(
          mesh, logical_to_spec(_names(v), v.shape, mesh, rules))),
      state, is_leaf=_is_param)


def shard_model(model: nnx.Module, mesh, rules=None) -> nnx.Module:
  """Places every parameter with its logical sharding; enables constraints.

  The model is updated in place (and returned): parameter values are
  `device_put` to their NamedSharding and `model.sharding_ctx` is set so that
  the forward pass constrains its activations and KV cache on `mesh`.
  """
  rules = as_rules(rules)
  state = nnx.state(model)
  shardings = param_shardings(state, mesh, rules)
  # device_put maps the two trees leaf by leaf (indexing a Variable that holds
  # a NamedSharding with [...] fails).
  placed = jax.device_put(state, shardings)
  nnx.update(model, placed)
  set_sharding_ctx(model, mesh, rules)
  return model


def set_sharding_ctx(model: nnx.Module, mesh, rules=None) -> None:
  """Records (mesh, rules) on the model for its activation constraints."""
  model.sharding_ctx = (mesh, as_rules(rules))


def check_sharded(state, mesh, min_size: int = 2 ** 14, raise_error: bool = True
                  ) -> list[str]:
  """Lists parameters with >= `min_size` elements that are fully replicated.

  Args:
    state: an nnx.State (or model) whose leaves are placed arrays.
    mesh: the mesh they should be split over.
    min_size: smaller arrays may stay replicated.
    raise_error: raise instead of returning a non-empty list.

  Raises:
    ValueError: (if raise_error) some large parameter is replicated.
  """
  if isinstance(state, nnx.Module):
    state = nnx.state(state)
  if mesh.size == 1:
    return []
  bad = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if leaf.size < min_size:
      continue
    sh = getattr(leaf, "sharding", None)
    if sh is None or sh.is_fully_replicated:
      bad.append(jax.tree_util.keystr(path))
  if bad and raise_error:
    raise ValueError(f"{len(bad)} large parameters are replicated on mesh "
                     f"{dict(mesh.shape)}: {', '.join(bad[:5])}")
  return bad


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
    rules: logical-axis rules (default DEFAULT_RULES).
    optimizer: an optax GradientTransformation (default optax.adamw(1e-4)).

  Returns:
    {"params": bytes, "optimizer": bytes, "total": bytes, "num_params": n}.
  """
  import optax  # pylint: disable=g-import-not-at-top
  from paraagent_jax.models import qwen3  # pylint: disable=g-import-not-at-top

  optimizer = optimizer or optax.adamw(1e-4)
  abs_model = nnx.eval_shape(lambda: qwen3.Qwen3(config, rngs=nnx.Rngs(0)))
  state = nnx.state(abs_model, nnx.Param)
  shard_tree = param_shardings(state, mesh, rules)
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
    m = memory_per_device(config, abstract_mesh(shape), rules)
    sizes = tuple(int(shape.get(a, 1)) for a in MESH_AXES)
    gib = {k: m[k] / 2 ** 30 for k in ("params", "optimizer", "total")}
    print(f"{str(sizes):>24} {gib['params']:11.3f} {gib['optimizer']:10.3f} "
          f"{gib['total']:10.3f}")
    rows.append({"mesh": sizes, **m})
  return rows
