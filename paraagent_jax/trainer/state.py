"""The train state a stage runs on: mesh, model, optimizer state, resume.

The building blocks both stages share, in the order big_vision's train.py
uses them: `make_mesh` -> `abstract_train_state` (``jax.eval_shape``, nothing
allocated) -> shardings from the parameters' logical axes and the config's
rules -> `build_train_state` (resume from the workdir's newest complete
checkpoint, else ``init_from``, else a jitted init directly in the
shardings) -> `device_batch` per step.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import rundir
from paraagent_jax import sharding as shd
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import step as ts
from paraagent_jax.models import qwen3


def maybe_initialize_distributed(config) -> None:
  """Calls `jax.distributed.initialize` on multi-host runs (or if asked)."""
  mode = config.get("distributed", "auto")
  if mode not in ("auto", "on", "off"):
    raise config_utils.ConfigError(f"distributed={mode!r}; expected auto, on "
                                   f"or off")
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  multi_host = "," in hosts or "JAX_COORDINATOR_ADDRESS" in os.environ
  if mode == "on" or (mode == "auto" and multi_host):
    jax.distributed.initialize()


def make_mesh(config) -> jax.sharding.Mesh:
  """The device mesh of ``config.mesh`` (axis sizes; -1 = the rest)."""
  try:
    return shd.make_mesh(dict(config.mesh))
  except ValueError as e:
    raise config_utils.ConfigError(f"mesh: {e}") from None


def optimizer_config(config) -> optim.OptimizerConfig:
  """``config.optimizer`` with ``total_steps=0`` meaning the run's length."""
  values = dict(config.optimizer)
  if not values.get("total_steps"):
    values["total_steps"] = config.total_steps
  try:
    return config_utils.config_from_mapping(optim.OptimizerConfig, values)
  except (ValueError, TypeError) as e:
    raise config_utils.ConfigError(f"optimizer: {e}") from None


@dataclasses.dataclass
class TrainState:
  """Everything a stage needs to run its loop and checkpoint it."""

  graphdef: Any
  state: Any              # nnx.State of the model, sharded
  opt_state: Any          # Optax state, sharded like the params
  step: int               # last completed step (0 = none)
  rng: jax.Array          # base key; step keys are fold_in(rng, step)
  data_state: dict | None
  checkpointer: ckpt_lib.Checkpointer
  model_config: qwen3.Qwen3Config
  source: str             # "resumed", "hf", "orbax" or "scratch"


def sharding_rules(config) -> shd.Rules:
  """``config.sharding.rules`` (the defaults when the config has none)."""
  sharding = config.get("sharding") or {}
  return shd.as_rules(sharding.get("rules") or None)


def abstract_model(model_cfg: qwen3.Qwen3Config, mesh, rules):
  """(graphdef, abstract state, state shardings), nothing allocated.

  Raises:
    ConfigError: a rule maps a parameter axis to a mesh axis that does not
      divide it (one line naming the parameter).
  """
  model = nnx.eval_shape(lambda: qwen3.Qwen3(model_cfg, rngs=nnx.Rngs(0)))
  # The graphdef carries the mesh for the activation constraints.
  shd.set_sharding_ctx(model, mesh, rules)
  graphdef, abstract = nnx.split(model)
  try:
    shardings = shd.param_shardings(abstract, mesh, rules, strict=True)
  except shd.ShardingError as e:
    raise config_utils.ConfigError(f"sharding: mesh {dict(mesh.shape)}: {e}") from None
  return graphdef, abstract, shardings


def check_sharded(config, state, mesh) -> None:
  """Refuses large parameters left replicated on a mesh that could split them.

  Only on meshes with model-parallel axes (``fsdp`` x ``tensor`` > 1): under
  pure data parallelism every parameter is a replica by design. Parameters
  below ``sharding.min_sharded_size`` elements may stay replicated.
  """
  if shd.model_parallel_size(mesh) == 1:
    return
  min_size = int((config.get("sharding") or {}).get("min_sharded_size", 2 ** 14))
  try:
    shd.check_sharded(state, mesh, min_size=min_size)
  except shd.ShardingError as e:
    raise config_utils.ConfigError(
        f"sharding: {e}; give them a rule in config.sharding.rules or raise "
        f"sharding.min_sharded_size") from None


def abstract_train_state(mesh, optimizer, model_cfg, rules=None):
  """(graphdef, abstract state, its shardings, abstract opt state, its
  shardings): shapes only, nothing allocated (also the dry run's state).
  ``rules``: the logical-axis rules (`sharding_rules`; None = the defaults)."""
  rules = shd.as_rules(rules)
  graphdef, abstract, shardings = abstract_model(model_cfg, mesh, rules)
  params_abs, _ = ts.split_params(abstract)
  params_sh, _ = ts.split_params(shardings)
  opt_sh = ts.opt_state_sharding(optimizer, params_abs, params_sh, mesh)
  opt_abs = jax.eval_shape(optimizer.init, params_abs)
  return graphdef, abstract, shardings, opt_abs, opt_sh


def build_train_state(config, mesh, optimizer, model_cfg,
                      workdir: str) -> TrainState:
  """Resumes from ``workdir``, else initialises (init_from or scratch).

  The abstract state comes from ``jax.eval_shape``; shardings from the
  parameters' logical axes (`paraagent_jax.sharding`); fresh parameters are
  created by a jitted init directly in their shardings.
  """
  graphdef, abstract, shardings, opt_abs, opt_sh = abstract_train_state(
      mesh, optimizer, model_cfg, sharding_rules(config))
  checkpointer = ckpt_lib.Checkpointer(
      workdir, every_steps=config.ckpt_every, keep=config.keep_ckpts or None,
      async_save=config.async_ckpt)
  restored = checkpointer.restore(ckpt_lib.with_shardings(abstract, shardings),
                                  ckpt_lib.with_shardings(opt_abs, opt_sh))
  if restored is not None:
    logging.info("resumed from %s", restored.path)
    check_sharded(config, restored.model_state, mesh)
    return TrainState(graphdef, restored.model_state, restored.opt_state,
                      restored.step, restored.rng, restored.data_state,
                      checkpointer, model_cfg, "resumed")

  rng = jax.random.PRNGKey(config.seed)
  state, kind = _initial_state(config, model_cfg, abstract, shardings)
  check_sharded(config, state, mesh)
  params, _ = ts.split_params(state)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
  return TrainState(graphdef, state, opt_state, 0, rng, None, checkpointer,
                    model_cfg, kind)


def _initial_state(config, model_cfg, abstract, shardings):
  """(model state a fresh run starts from, its source): init_from or the seeded init."""
  kind = rundir.check_init_from(config.init_from)
  if kind:
    return rundir.load_init_weights(kind, config.init_from, abstract, shardings,
                              model_cfg), kind
  init = jax.jit(
      lambda key: nnx.state(qwen3.Qwen3(model_cfg, rngs=nnx.Rngs(key))),
      out_shardings=shardings)
  return init(jax.random.fold_in(jax.random.PRNGKey(config.seed), 0)), "scratch"


def initial_model_state(config, mesh, model_cfg):
  """The model state a fresh run of ``config`` starts from, sharded.

  The same parameters `build_train_state` starts from (``init_from``, else
  the init seeded by ``config.seed``), whether or not the run has since
  resumed: RL's frozen KL reference.
  """
  _, abstract, shardings = abstract_model(model_cfg, mesh, sharding_rules(config))
  return _initial_state(config, model_cfg, abstract, shardings)[0]


def maybe_inject_nan(config, step: int, state):
  """Test hook: NaN parameters right before step ``debug.nan_at_step``.

  With ``debug.nan_at_step=N`` (N > 0) step N's loss is NaN, the way a real
  divergence looks to the checks; 0 (the default) is off.
  """
  debug = config.get("debug") or {}
  if not debug.get("nan_at_step", 0) or step != debug.get("nan_at_step"):
    return state
  return jax.tree.map(
      lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x,
      state)


def device_batch(batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
  """This host's rows -> global arrays sharded over the batch axes."""
  shardings = ts.data_sharding(batch, mesh)
  return {k: jax.make_array_from_process_local_data(shardings[k], v)
          for k, v in batch.items()}


def check_batch_divides(config, mesh) -> None:
  """A clear error when the batch does not split over the mesh."""
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  need = dp * max(config.num_micro_batches, 1)
  if config.batch_size % need:
    raise config_utils.ConfigError(
        f"batch_size={config.batch_size} must be a multiple of data*fsdp*"
        f"num_micro_batches={need} (mesh {dict(mesh.shape)})")
