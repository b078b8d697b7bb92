"""The stages' typed specs: a ConfigDict is read here, once, at the stage's door.

`rl_spec(config)` and `sft_spec(config)` turn the run's ``ml_collections``
config into frozen dataclasses (`RLSpec`, `SFTSpec`) whose fields are the
typed values the layers below take: the run's state settings
(`state.RunSpec`), the model (`rundir.ModelSpec`), the optimizer
(`learner.optimizer.OptimizerConfig`), GRPO (`learner.grpo.GRPOConfig`), the
rollout limits (`paraact.rollout.RolloutConfig`), the RL task draw
(`rl_tasks.TaskSpec`) and the held-out evaluation
(`evaluation.heldout.HeldOutSpec`). Every check that can be made from the
config alone happens here, so a bad value stops the run with a one-line
`ConfigError` before anything is compiled; below this module no function
reads ``config``.

The one exception is by design: an SFT data source (``data.source``) is a
plug-in chosen by name that reads its own keys, so it gets the ``data`` group
as a read-only mapping (`SFTSpec.data`).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Mapping

from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import provenance
from paraagent_jax import rundir
from paraagent_jax.sampling import programs as sampling_programs
from paraagent_jax import sharding as shd
from paraagent_jax.data import rows as data_rows
from paraagent_jax.evaluation import heldout
from paraagent_jax.learner import grpo
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.paraact import chat_format
from paraagent_jax.paraact import formats
from paraagent_jax.paraact import rollout
from paraagent_jax.trainer import rl_tasks
from paraagent_jax.trainer import state as state_lib

ConfigError = config_utils.ConfigError


# ----------------------------------------------------------------------------
# Shared by both stages.
# ----------------------------------------------------------------------------


def rl_catalog(config) -> str:
  """The catalog RL (and the SFT greedy evaluation) draws tasks from:
  ``rl.catalog``, else the demonstrations' ``data.catalog``, else procedural."""
  return config.rl.get("catalog", "") or config.data.get("catalog", "") or "procedural"


def rl_micro_batches(config) -> int:
  """Micro-batches of the RL step: ``rl.num_micro_batches``, 0 = the SFT one."""
  return (int(config.rl.get("num_micro_batches", 0))
          or int(config.num_micro_batches))


def run_spec(config) -> state_lib.RunSpec:
  """The train state's settings: seed, init, mesh, sharding, checkpoints."""
  sharding = config.get("sharding") or {}
  debug = config.get("debug") or {}
  return state_lib.RunSpec(
      seed=int(config.seed), init_from=str(config.init_from),
      mesh=tuple(dict(config.mesh).items()),
      rules=shd.as_rules(config_utils.to_dict(sharding.get("rules")) or None),
      min_sharded_size=int(sharding.get("min_sharded_size", 2 ** 14)),
      ckpt_every=config.ckpt_every, keep_ckpts=config.keep_ckpts or None,
      async_ckpt=config.async_ckpt, nan_at_step=int(debug.get("nan_at_step", 0) or 0))


def optimizer_config(config) -> optim.OptimizerConfig:
  """``config.optimizer`` with ``total_steps=0`` meaning the run's length."""
  values = dict(config.optimizer)
  if not values.get("total_steps"):
    values["total_steps"] = config.total_steps
  try:
    return config_utils.config_from_mapping(optim.OptimizerConfig, values)
  except (ValueError, TypeError) as e:
    raise ConfigError(f"optimizer: {e}") from None


def rollout_limits(rl) -> rollout.RolloutConfig:
  """The rollout budgets of ``config.rl`` (turns, tokens per turn, length,
  observation cut)."""
  return rollout.RolloutConfig(max_turns=rl.max_turns, max_turn_tokens=rl.max_turn_tokens,
                               max_len=rl.max_len, max_obs_tokens=rl.max_obs_tokens)


def protocol_spec(config) -> chat_format.ProtocolSpec:
  """``config.protocol``: the format of every turn and an optional template file."""
  protocol = config.get("protocol") or {}
  try:
    return chat_format.ProtocolSpec.checked(protocol.get("format", formats.TAGS),
                                            protocol.get("chat_template", ""))
  except ValueError as e:
    raise ConfigError(f"protocol: {e}") from None


def heldout_spec(config, num_tasks: int) -> heldout.HeldOutSpec:
  """The held-out evaluation of a training run (SFT's final one, RL's): the
  RL keys' catalog, seeds, kinds, strategy and limits, the demonstrations'
  observation format, ``num_tasks`` test tasks."""
  rl = config.rl
  return heldout.HeldOutSpec(
      catalog=rl_catalog(config), catalog_seed=rl.catalog_seed,
      task_seed=rl.task_seed, kinds=tuple(config_utils.parse_list(rl.kinds)),
      num_tasks=int(num_tasks), strategy=rl.strategy,
      obs_format=str(config.data.get("obs_format", "full")),
      limits=rollout_limits(rl))


# ----------------------------------------------------------------------------
# SFT.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SFTSpec:
  """Everything the SFT stage reads from its config."""
  run: state_lib.RunSpec
  model: rundir.ModelSpec
  optimizer: optim.OptimizerConfig
  source: str                   # data.source: a module of paraagent_jax.data
  data: Mapping[str, Any]       # the data group, read-only (the source's keys)
  data_seed: int
  batch_size: int               # global rows
  seq_len: int
  num_micro_batches: int
  total_steps: int
  log_every: int
  eval_every: int               # validation loss every N steps (0 = never)
  eval_batches: int
  heldout: heldout.HeldOutSpec | None   # greedy ParaAct after SFT (None = off)
  tokenizer: str                # the run's tokenizer ("" = none: synthetic data)
  protocol: chat_format.ProtocolSpec   # the turns' format (data sources that take it)
  progress: bool
  tensorboard: bool
  rows_log: str = ""            # debug.rows_log: each process's rows, per step ("" = off)


def sft_spec(config) -> SFTSpec:
  """The SFT stage's spec (call after the demonstrations are in place)."""
  rundir.check_init_from(config.init_from)   # fail before any compilation
  n_eval = int(config.get("sft_eval_tasks", 0) or 0)
  return SFTSpec(
      run=run_spec(config), model=rundir.model_spec(config),
      optimizer=optimizer_config(config), source=str(config.data.source),
      data=types.MappingProxyType(config.data.to_dict()),
      data_seed=int(config.data.seed), batch_size=int(config.batch_size),
      seq_len=int(config.seq_len), num_micro_batches=int(config.num_micro_batches),
      total_steps=int(config.total_steps), log_every=int(config.log_every),
      eval_every=int(config.eval_every), eval_batches=int(config.eval_batches),
      heldout=heldout_spec(config, n_eval) if n_eval else None,
      tokenizer=rundir.tokenizer_dir(config) if n_eval else "",
      protocol=protocol_spec(config), progress=bool(config.progress), tensorboard=bool(config.tensorboard),
      rows_log=str((config.get("debug") or {}).get("rows_log", "") or ""))


# ----------------------------------------------------------------------------
# RL.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
  """How the RL policy samples its rollouts."""
  temperature: float
  top_k: int
  top_p: float
  draw: str                     # "gumbel" | "inverse_cdf" (`sampling_programs.DRAWS`)


@dataclasses.dataclass(frozen=True)
class RLSpec:
  """Everything the RL stage reads from its config."""
  run: state_lib.RunSpec
  model: rundir.ModelSpec
  optimizer: optim.OptimizerConfig
  grpo: grpo.GRPOConfig
  tasks: rl_tasks.TaskSpec      # the training tasks of each iteration
  heldout: heldout.HeldOutSpec  # the held-out evaluation (before, every N, after)
  limits: rollout.RolloutConfig
  sampling: SamplingSpec
  tokenizer: str
  strategy: str
  protocol: chat_format.ProtocolSpec
  obs_format: str               # the demonstrations' observation format
  iterations: int
  passes: int                   # optimisation passes over each batch
  eval_every: int               # iterations (0 = only before and after)
  ckpt_every: int               # iterations
  token_budget: int             # real tokens per batch (0 = no budget)
  length_buckets: tuple[int, ...]
  tensorboard: bool
  meta: Mapping[str, Any]       # what identifies the run (`run_meta`)


def length_buckets(rl) -> tuple[int, ...]:
  """``rl.length_buckets`` as sorted update lengths ending at ``rl.max_len``
  (() = no buckets), parsed like ``data.length_bucket``."""
  text = str(rl.get("length_buckets", "") or "")
  try:
    return tuple(data_rows.bucket_lengths(text, int(rl.max_len)))
  except ValueError as e:
    raise ConfigError(f"rl.length_buckets: {e}") from None


def rl_optimizer_config(config) -> optim.OptimizerConfig:
  """``config.optimizer`` with RL's own overrides (``rl.learning_rate``,
  ``rl.warmup_steps``, ``rl.schedule``) and RL's number of steps."""
  rl = config.rl
  values = dict(config.optimizer)
  if rl.get("learning_rate", 0.0):
    values["learning_rate"] = float(rl.learning_rate)
  if rl.get("warmup_steps", -1) >= 0:
    values["warmup_steps"] = int(rl.warmup_steps)
  if rl.get("schedule", ""):
    values["schedule"] = str(rl.schedule)
  if values.get("schedule", "cosine") not in optim.SCHEDULES:
    raise ConfigError(f"optimizer (rl): schedule={values['schedule']!r}; "
                      f"choose from {optim.SCHEDULES}")
  values["total_steps"] = max(1, int(rl.iterations) * int(rl.passes))
  values["warmup_steps"] = min(int(values.get("warmup_steps", 0)), values["total_steps"] - 1)
  try:
    return config_utils.config_from_mapping(optim.OptimizerConfig, values)
  except (ValueError, TypeError) as e:
    raise ConfigError(f"optimizer (rl): {e}") from None


def grpo_config(config) -> grpo.GRPOConfig:
  """``config.rl.grpo`` typed: levels parsed, RL's micro-batching set."""
  rl = config.rl
  values = dict(rl.grpo.to_dict())
  levels = values.get("levels", "traj,phase,step")
  values["levels"] = tuple(config_utils.parse_list(levels))
  # RL batches (groups x full episodes) are larger than SFT's: their own
  # micro-batching bounds the step's memory (0 = the SFT setting).
  values["num_micro_batches"] = rl_micro_batches(config)
  try:
    out = config_utils.config_from_mapping(grpo.GRPOConfig, values)
  except (ValueError, TypeError) as e:
    raise ConfigError(f"rl.grpo: {e}") from None
  if out.tis_cap > 0 and int(rl.passes) != 1:
    raise ConfigError(
        f"rl.grpo.tis_cap={out.tis_cap} needs rl.passes=1 (got {rl.passes}): the "
        "trainer's log-probs at the sampler's parameters are the first pass's")
  return out


def task_spec(config) -> rl_tasks.TaskSpec:
  """The RL training-task draw (`rl_tasks.TaskSpec`), checked."""
  rl = config.rl
  mode = rl.get("task_sampling", "round_robin")
  if mode not in rl_tasks.TASK_SAMPLING:
    raise ConfigError(f"rl.task_sampling={mode!r}; expected one of {rl_tasks.TASK_SAMPLING}")
  return rl_tasks.TaskSpec(
      catalog=rl_catalog(config), catalog_seed=int(rl.catalog_seed),
      train_catalog_seed=int(rl.get("train_catalog_seed", -1)), task_seed=rl.task_seed,
      kinds=tuple(config_utils.parse_list(rl.kinds)), per_iteration=int(rl.tasks_per_iter),
      group_size=int(rl.group_size), sampling=mode,
      window=int(rl.get("sampling_window", 5)), floor=float(rl.get("sampling_floor", 0.05)),
      seed=int(config.seed))


def run_meta(config, levels) -> dict[str, Any]:
  """What identifies an RL run: stored in its checkpoints and ``rl_run.json``."""
  rl = config.rl
  fmt = protocol_spec(config).format
  return {"levels": list(levels), "normalize": rl.grpo.normalize,
          "strategy": rl.strategy, "group_size": int(rl.group_size),
          "tasks_per_iter": int(rl.tasks_per_iter), "passes": int(rl.passes),
          "task_sampling": rl.get("task_sampling", "round_robin"),
          "train_catalog_seed": int(rl.get("train_catalog_seed", -1)),
          "temperature": float(rl.temperature), "seed": int(config.seed),
          "init_from": config.init_from, "machine": provenance.machine(),
          # Only when not the default, so that a tags run's meta is as before.
          **({"protocol": fmt} if fmt != formats.TAGS else {})}


def rl_spec(config) -> RLSpec:
  """The RL stage's spec; every config error is raised here, in one line."""
  rl = config.rl
  tasks = task_spec(config)   # checked before the evaluation, not at iteration 1
  draw = str(rl.get("draw", "gumbel"))
  if draw not in sampling_programs.DRAWS:
    raise ConfigError(f"rl.draw={rl.draw!r}; expected one of "
                      f"{', '.join(sampling_programs.DRAWS)}")
  buckets = length_buckets(rl)
  tokenizer = rundir.tokenizer_dir(config)
  if not tokenizer or not fileio.exists(tokenizer):
    raise ConfigError(f"rl: no tokenizer at {tokenizer!r}; set rl.tokenizer or data.data_dir")
  rundir.check_init_from(config.init_from)
  grpo_cfg = grpo_config(config)
  return RLSpec(
      run=run_spec(config), model=rundir.model_spec(config),
      optimizer=rl_optimizer_config(config), grpo=grpo_cfg, tasks=tasks,
      heldout=heldout_spec(config, rl.eval_tasks), limits=rollout_limits(rl),
      sampling=SamplingSpec(temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p,
                            draw=draw),
      tokenizer=tokenizer, strategy=rl.strategy, protocol=protocol_spec(config),
      obs_format=str(config.data.get("obs_format", "full")),
      iterations=int(rl.iterations), passes=int(rl.passes), eval_every=int(rl.eval_every),
      ckpt_every=int(rl.ckpt_every), token_budget=int(rl.token_budget),
      length_buckets=buckets, tensorboard=bool(config.tensorboard),
      meta=types.MappingProxyType(run_meta(config, grpo_cfg.levels)))
