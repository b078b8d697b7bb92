"""The train state a stage runs on: mesh, model, optimizer state, resume.

The building blocks both stages share, in the order big_vision's train.py
uses them: `sharding.make_mesh` -> `abstract_train_state` (``jax.eval_shape``, nothing
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
from paraagent_jax import interrupts
from paraagent_jax import multihost
from paraagent_jax import rundir
from paraagent_jax import sharding as shd
from paraagent_jax.learner import step as ts
from paraagent_jax.models import qwen3
from paraagent_jax.trainer import liveness


def maybe_initialize_distributed(mode: str = "auto", host_timeout_s: float = 120.0,
                                 prog: str = "paraagent_jax.train") -> None:
  """Calls `jax.distributed.initialize` on multi-host runs (or if asked).

  ``mode``: the config's ``distributed``: "auto" (on a multi-host slice, or
  when ``JAX_COORDINATOR_ADDRESS`` is set), "on" or "off". JAX reads the
  coordinator's address from the environment but not ``JAX_NUM_PROCESSES``
  or ``JAX_PROCESS_ID`` (set by `paraagent_jax.local_pod`), so they are
  passed here; where unset, JAX detects them (a Cloud TPU slice).

  ``host_timeout_s``: the config's ``host_timeout_s``. On several processes a
  `liveness.Watchdog` starts: a process that sends no heartbeat for that long
  stops the others, each with one line naming it (``prog: error: ...``);
  JAX's own heartbeat timeout is set above it.
  """
  if mode not in ("auto", "on", "off"):
    raise config_utils.ConfigError(f"distributed={mode!r}; expected auto, on "
                                   f"or off")
  if not host_timeout_s > 0:
    raise config_utils.ConfigError(f"host_timeout_s={host_timeout_s}; expected "
                                   "seconds > 0")
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  multi_host = "," in hosts or "JAX_COORDINATOR_ADDRESS" in os.environ
  if mode == "on" or (mode == "auto" and multi_host):
    count, index = (os.environ.get(k) for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))
    jax.distributed.initialize(
        os.environ.get("JAX_COORDINATOR_ADDRESS"),
        num_processes=int(count) if count else None,
        process_id=int(index) if index else None,
        heartbeat_timeout_seconds=liveness.jax_heartbeat_timeout(host_timeout_s))
    liveness.start(host_timeout_s, prog)


def on_process_0(prog: str, what: str, fn):
  """``fn()`` on process 0 only, alone: an entry point whose work is not
  split across processes (`evaluate`, `export_hf`) started on every host of
  a pod, or under `paraagent_jax.local_pod`. Process 0 runs as one process
  (it does not join the others: Orbax's restore would wait for them); the
  others (``JAX_PROCESS_ID`` > 0) print one line and return None.
  """
  index = int(os.environ.get("JAX_PROCESS_ID", "0") or 0)
  if index:
    print(f"{prog}: process {index}: {what} runs on process 0 alone; nothing "
          f"to do here", flush=True)
    return None
  return fn()


def stop_requested() -> bool:
  """Whether the loop stops after this step: Ctrl-C or SIGTERM reached this
  process (`interrupts.requested`), or, on several processes, any of them.

  On several processes this is a collective (every process calls it after
  the same steps) and all get the same answer, so they stop, and save, at
  the same step. On one process it is `interrupts.requested` alone.
  """
  return multihost.any_process(bool(interrupts.requested()))


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A stage's train-state settings (`trainer.specs.run_spec` reads them).

  Attributes:
    seed: the run's seed (init and base RNG key).
    init_from: an HF directory or Orbax checkpoint to start from ("" = scratch).
    mesh: mesh axis sizes, ``(("data", 1), ("fsdp", -1), ...)``; -1 = the rest.
    rules: logical-axis rules (`sharding.as_rules`).
    min_sharded_size: larger parameters may not stay replicated on a
      model-parallel mesh.
    ckpt_every, keep_ckpts, async_ckpt: the checkpointer's settings.
    nan_at_step: test hook (`maybe_inject_nan`); 0 = off.
  """
  seed: int = 0
  init_from: str = ""
  mesh: tuple[tuple[str, int], ...] = (("data", 1), ("fsdp", -1), ("tensor", 1))
  rules: shd.Rules = shd.as_rules(None)
  min_sharded_size: int = 2 ** 14
  ckpt_every: int = 50
  keep_ckpts: int | None = 3
  async_ckpt: bool = True
  nan_at_step: int = 0


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


def abstract_model(model_cfg: qwen3.Qwen3Config, mesh, rules):
  """(graphdef, abstract state, state shardings), nothing allocated.

  Raises:
    ShardingError: (a `ConfigError`) a rule maps a parameter axis to a mesh
      axis that does not divide it (one line naming the parameter).
  """
  model = nnx.eval_shape(lambda: qwen3.Qwen3(model_cfg, rngs=nnx.Rngs(0)))
  # The graphdef carries the mesh for the activation constraints.
  shd.set_sharding_ctx(model, mesh, rules)
  graphdef, abstract = nnx.split(model)
  return graphdef, abstract, shd.param_shardings(abstract, mesh, rules,
                                                 strict=True)


def abstract_train_state(mesh, optimizer, model_cfg, rules=None):
  """(graphdef, abstract state, its shardings, abstract opt state, its
  shardings): shapes only, nothing allocated (also the dry run's state).
  ``rules``: the logical-axis rules (`RunSpec.rules`; None = the defaults)."""
  rules = shd.as_rules(rules)
  graphdef, abstract, shardings = abstract_model(model_cfg, mesh, rules)
  params_abs, _ = ts.split_params(abstract)
  params_sh, _ = ts.split_params(shardings)
  opt_sh = ts.opt_state_sharding(optimizer, params_abs, params_sh, mesh)
  opt_abs = jax.eval_shape(optimizer.init, params_abs)
  return graphdef, abstract, shardings, opt_abs, opt_sh


def build_train_state(run: RunSpec, mesh, optimizer, model_cfg,
                      workdir: str) -> TrainState:
  """Resumes from ``workdir``, else initialises (init_from or scratch).

  The abstract state comes from ``jax.eval_shape``; shardings from the
  parameters' logical axes (`paraagent_jax.sharding`); fresh parameters are
  created by a jitted init directly in their shardings.
  """
  graphdef, abstract, shardings, opt_abs, opt_sh = abstract_train_state(
      mesh, optimizer, model_cfg, run.rules)
  checkpointer = ckpt_lib.Checkpointer(
      workdir, every_steps=run.ckpt_every, keep=run.keep_ckpts,
      async_save=run.async_ckpt)
  restored = checkpointer.restore(ckpt_lib.with_shardings(abstract, shardings),
                                  ckpt_lib.with_shardings(opt_abs, opt_sh))
  if restored is not None:
    logging.info("resumed from %s", restored.path)
    shd.check_sharded(restored.model_state, mesh, run.min_sharded_size)
    return TrainState(graphdef, restored.model_state, restored.opt_state,
                      restored.step, restored.rng, restored.data_state,
                      checkpointer, model_cfg, "resumed")

  rng = jax.random.PRNGKey(run.seed)
  state, kind = _initial_state(run, model_cfg, abstract, shardings)
  shd.check_sharded(state, mesh, run.min_sharded_size)
  params, _ = ts.split_params(state)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
  return TrainState(graphdef, state, opt_state, 0, rng, None, checkpointer,
                    model_cfg, kind)


def _initial_state(run: RunSpec, model_cfg, abstract, shardings):
  """(model state a fresh run starts from, its source): init_from or the seeded init."""
  kind = rundir.check_init_from(run.init_from)
  if kind:
    return rundir.load_init_weights(kind, run.init_from, abstract, shardings,
                                    model_cfg), kind
  init = jax.jit(
      lambda key: nnx.state(qwen3.Qwen3(model_cfg, rngs=nnx.Rngs(key))),
      out_shardings=shardings)
  return init(jax.random.fold_in(jax.random.PRNGKey(run.seed), 0)), "scratch"


def initial_model_state(run: RunSpec, mesh, model_cfg):
  """The model state a fresh run starts from, sharded.

  The same parameters `build_train_state` starts from (``init_from``, else
  the init seeded by ``run.seed``), whether or not the run has since
  resumed: RL's frozen KL reference.
  """
  _, abstract, shardings = abstract_model(model_cfg, mesh, run.rules)
  return _initial_state(run, model_cfg, abstract, shardings)[0]


def maybe_inject_nan(nan_at_step: int, step: int, state):
  """Test hook: NaN parameters right before step ``nan_at_step``.

  With ``debug.nan_at_step=N`` (N > 0) step N's loss is NaN, the way a real
  divergence looks to the checks; 0 (the default) is off.
  """
  if not nan_at_step or step != nan_at_step:
    return state
  return jax.tree.map(
      lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x,
      state)


def device_batch(batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
  """This host's rows -> global arrays sharded over the batch axes."""
  shardings = ts.data_sharding(batch, mesh)
  return {k: jax.make_array_from_process_local_data(shardings[k], v)
          for k, v in batch.items()}


def check_batch_divides(batch_size: int, num_micro_batches: int, mesh) -> None:
  """A clear error when the batch does not split over the mesh."""
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  need = dp * max(num_micro_batches, 1)
  if batch_size % need:
    raise config_utils.ConfigError(
        f"batch_size={batch_size} must be a multiple of data*fsdp*"
        f"num_micro_batches={need} (mesh {dict(mesh.shape)})")
