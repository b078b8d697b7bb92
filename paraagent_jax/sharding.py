"""Device meshes, logical-axis rules, and helpers that shard models and activations.

Parameters and key activations carry *logical* axis names ("embed", "mlp",
"batch", ...). One rules table maps each logical name to mesh axes of a mesh with
axes ("data", "fsdp", "tensor"); a run's table is ``config.sharding.rules``
(`DEFAULT_RULES` unless the config says otherwise).

Parameters are resolved strictly by the trainer (`param_shardings(...,
strict=True)`): a mesh axis that does not divide a parameter's dimension is
refused with a one-line `ShardingError` naming the parameter, rather than
dropped silently (set that logical name's rule to "" to replicate it); and
`check_sharded` refuses large parameters that end up replicated on a mesh
with model-parallel axes. Activations and the KV cache, whose batch sizes
vary (a sampler batch of 1), keep a divisibility fallback: an axis that does
not divide is dropped for that array.

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

from paraagent_jax import config_utils

MESH_AXES = ("data", "fsdp", "tensor")

# Logical name -> mesh axes; the table a config's ``sharding.rules`` starts
# from ("" = replicated, "data,fsdp" = split over both).
DEFAULT_RULES: dict[str, str] = config_utils.SHARDING_RULES

Rules = tuple[tuple[str, Any], ...]


class ShardingError(config_utils.ConfigError):
  """A mesh or rules table that does not fit the devices or the model (one
  line; a `ConfigError`, so the entry points print it as one)."""


def make_mesh(shape: Mapping[str, int], devices: Sequence[Any] | None = None
              ) -> jax.sharding.Mesh:
  """A mesh with axes ("data", "fsdp", "tensor") and Auto axis types.

  Args:
    shape: axis name -> size; missing axes get 1; one size may be -1 (filled
      from the device count).
    devices: devices to use (default: all of `jax.devices()`).

  Raises:
    ShardingError: unknown axis names, more than one -1, or sizes that do not
      multiply to the device count.
  """
  devices = list(jax.devices() if devices is None else devices)
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ShardingError(f"mesh: unknown mesh axes {sorted(unknown)}; expected {MESH_AXES}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ShardingError(f"mesh: at most one mesh axis may be -1, got {dict(shape)}")
  if -1 in sizes:
    known = math.prod(s for s in sizes if s != -1)
    if known <= 0 or len(devices) % known:
      raise ShardingError(f"mesh: cannot fill -1 in {dict(shape)} from {len(devices)} devices")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices) or min(sizes) < 1:
    raise ShardingError(f"mesh: {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)}"
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
  """Normalises a rules table (a dict, a ConfigDict or pairs; None = the
  defaults) to a hashable tuple of (logical name, mesh axes); "" or None
  means replicated."""
  if rules is None:
    rules = DEFAULT_RULES
  items = rules.items() if hasattr(rules, "items") else rules
  out = []
  for k, v in items:
    if isinstance(v, str):
      v = tuple(a.strip() for a in v.split(",") if a.strip())
    if isinstance(v, (list, tuple)):
      v = tuple(a for a in v if a)
      v = v[0] if len(v) == 1 else (v or None)
    out.append((str(k), v))
  return tuple(sorted(out))


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int],
                    mesh, rules, strict: bool = False) -> PartitionSpec:
  """The PartitionSpec for an array.

  A mesh axis (of size > 1) that does not divide the dimension is dropped for
  this array, or, with ``strict``, refused with a `ShardingError`.
  """
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
      elif strict:
        raise ShardingError(
            f"logical axis {name!r} (size {dim}) does not divide over mesh axis "
            f"{ax!r} ({size}-way)")
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


def param_shardings(state, mesh, rules=None, strict: bool = False):
  """A tree like `state` (nnx.State of Params) with a NamedSharding per leaf.

  Raises:
    ShardingError: (``strict``) a rule maps a parameter's axis to a mesh axis
      that does not divide it; the message names the parameter and the rule.
  """
  if not strict:
    return jax.tree.map(
        lambda v: v.replace(NamedSharding(
            mesh, logical_to_spec(_names(v), v.shape, mesh, rules))),
        state, is_leaf=_is_param)

  def one(path, v):
    try:
      spec = logical_to_spec(_names(v), v.shape, mesh, rules, strict=True)
    except ShardingError as e:
      name = jax.tree_util.keystr(path)
      raise ShardingError(f"sharding: mesh {dict(mesh.shape)}: parameter {name} "
                          f"{tuple(v.shape)}: {e}; change the mesh "
                          f"or set its rule in config.sharding.rules (\"\" = "
                          f"replicated)") from None
    return v.replace(NamedSharding(mesh, spec))
  return jax.tree_util.tree_map_with_path(one, state, is_leaf=_is_param)


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


def model_parallel_size(mesh) -> int:
  """Devices a parameter can be split over: the product of the non-batch
  ("fsdp", "tensor") axes. 1 = pure data parallelism (replicas by design)."""
  return math.prod(mesh.shape.get(a, 1) for a in MESH_AXES if a != "data")


def check_sharded(state, mesh, min_size: int = 2 ** 14, raise_error: bool = True
                  ) -> list[str]:
  """Lists parameters with >= `min_size` elements that are fully replicated.

  Args:
    state: an nnx.State (or model) whose leaves are placed arrays.
    mesh: the mesh they should be split over.
    min_size: smaller arrays may stay replicated.
    raise_error: raise instead of returning a non-empty list.

  Raises:
    ShardingError: (if raise_error) some large parameter is replicated.
  """
  if isinstance(state, nnx.Module):
    state = nnx.state(state)
  if model_parallel_size(mesh) == 1:
    return []
  bad = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if leaf.size < min_size:
      continue
    sh = getattr(leaf, "sharding", None)
    if sh is None or sh.is_fully_replicated:
      bad.append(jax.tree_util.keystr(path))
  if bad and raise_error:
    raise ShardingError(f"sharding: {len(bad)} large parameters are replicated on "
                        f"mesh {dict(mesh.shape)}: {', '.join(bad[:5])}; give "
                        f"them a rule in config.sharding.rules or raise "
                        f"sharding.min_sharded_size")
  return bad
