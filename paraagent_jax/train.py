r"""Training entry point: ``python -m paraagent_jax.train``.

  python -m paraagent_jax.train --config=configs/demo.py:stage=sft \
      --workdir=/tmp/x

``--config`` is a Python config file plus ``key=value,...`` overrides (see
`paraagent_jax.config_utils`); ``config.stage`` picks what runs:

* ``sft``: supervised fine-tuning on fixed-shape token batches with the loss
  on assistant tokens (`run_sft`, below);
* ``rl``: `paraagent_jax.rl_stage.run_rl`;
* ``demos``: build the demonstrations dataset (`paraagent_jax.coldstart`);
* ``pipeline``: ``config.pipeline.stages`` in turn, each in
  ``WORKDIR/<stage>``, each starting from the previous one's result.

`run_sft` reads top to bottom like big_vision's train.py: mesh -> data ->
abstract state (``jax.eval_shape``) -> shardings -> jitted init -> jitted,
donating update -> resume -> loop. Restarting the same command resumes
from the newest complete checkpoint in the workdir; a fresh workdir starts
from ``config.init_from`` (an HF directory or an Orbax checkpoint) or from
scratch. Every step is a pure function of the seed and the data position,
so an interrupted and resumed run ends exactly where an uninterrupted one
does.

Bad input (config, init_from, checkpoint) and NaN/Inf stop with one line on
stderr, ``paraagent_jax.train: error: ...``, and exit code 1.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from typing import Any, Callable

from absl import app
from absl import flags
from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import interrupts
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import rl_stage
from paraagent_jax import sft_stage
from paraagent_jax import sharding as shd
from paraagent_jax import workdir_lock
from paraagent_jax.models import qwen3
from paraagent_jax.rl import sft_loss
from paraagent_jax.rl import train_step as ts



def _string_flag(name: str, help_text: str) -> flags.FlagHolder:
  """Defines ``--name`` once per process.

  ``python -m paraagent_jax.train`` runs this file as ``__main__``; the RL
  stage and the other entry points import it again as ``paraagent_jax.train``,
  which must reuse the flag rather than define it twice.
  """
  if name in flags.FLAGS:
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[name])
  return flags.DEFINE_string(name, None, help_text)


_CONFIG = _string_flag("config", "Config file and overrides: configs/X.py[:key=value,...]")
_WORKDIR = _string_flag("workdir", "Run directory (checkpoints, metrics); rerun the "
                        "same command to resume.")

# Defined once per process, like _string_flag (the module is imported twice).
_DRY_RUN = (flags.FlagHolder(flags.FLAGS, flags.FLAGS["dry_run"])
            if "dry_run" in flags.FLAGS else flags.DEFINE_bool(
                "dry_run", False, "Build the abstract state on a fake CPU "
                "mesh, print memory per device and shardings, lower the "
                "train and sample steps; allocates no weights "
                "(paraagent_jax.dry_run). --workdir is not needed."))
_FAKE_DEVICES = (flags.FlagHolder(flags.FLAGS, flags.FLAGS["fake_devices"])
                 if "fake_devices" in flags.FLAGS else flags.DEFINE_integer(
                     "fake_devices", 0, "With --dry_run: fake CPU devices "
                     "(0 = as many as the config's mesh needs)."))

DONE_FILE = "DONE.json"
USER_ERRORS = (config_utils.ConfigError, ckpt_lib.CheckpointError,
               metrics_lib.NonFiniteError, NotImplementedError)


# ----------------------------------------------------------------------------
# Building blocks (the RL stage reuses them).
# ----------------------------------------------------------------------------


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


def is_hf_dir(path: str) -> bool:
  """True for a directory with an HF ``config.json`` and safetensors."""
  return (os.path.isfile(os.path.join(path, "config.json")) and any(
      f.endswith(".safetensors") for f in os.listdir(path)))


def check_init_from(path: str) -> str:
  """Validates ``config.init_from``: returns "", "hf" or "orbax"."""
  if not path:
    return ""
  if not os.path.isdir(path):
    raise config_utils.ConfigError(f"init_from={path}: no such directory")
  if is_hf_dir(path):
    return "hf"
  if ckpt_lib.find_checkpoint(path) is not None:
    return "orbax"
  raise config_utils.ConfigError(
      f"init_from={path}: neither an HF checkpoint (config.json + "
      f"*.safetensors) nor an Orbax checkpoint (checkpoints/<step>/)")


def model_config(config, vocab_size: int = 0) -> qwen3.Qwen3Config:
  """The Qwen3Config: from ``init_from``'s HF config.json, else the preset.

  Args:
    config: the run config (reads ``model.*`` and ``init_from``).
    vocab_size: the data's vocabulary, used when ``model.vocab_size`` is 0.
  """
  m = config.model
  overrides = {k: m[k] for k in m.keys() if k not in ("preset", "vocab_size")}
  vocab = int(m.vocab_size) or int(vocab_size)
  try:
    if check_init_from(config.init_from) == "hf":
      with open(os.path.join(config.init_from, "config.json")) as f:
        return qwen3.Qwen3Config.from_hf_dict(json.load(f), **overrides)
    if vocab:
      overrides["vocab_size"] = vocab
    return qwen3.Qwen3Config.preset(m.preset, **overrides)
  except (ValueError, TypeError) as e:
    raise config_utils.ConfigError(f"model: {e}") from None


def make_sft_data(config, split: str, seed_offset: int = 0):
  """The SFT data source named by ``config.data.source`` (this host's rows).

  The source is the module ``paraagent_jax.data.<source>``, whose
  ``make_sft_data(data_config, *, split, batch_size, seq_len, seed,
  process_index, process_count)`` returns an iterator with ``state()`` and
  ``restore()`` (see `paraagent_jax.data.synthetic`).
  """
  name = config.data.source
  module_name = f"paraagent_jax.data.{name}"
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name != module_name:
      raise
    here = os.path.join(os.path.dirname(__file__), "data")
    known = sorted(f[:-3] for f in os.listdir(here)
                   if f.endswith(".py") and not f.startswith("_"))
    raise config_utils.ConfigError(
        f"data.source={name!r}: no module {module_name}; available: "
        f"{', '.join(known)}") from None
  if not hasattr(module, "make_sft_data"):
    raise config_utils.ConfigError(
        f"data.source={name!r}: {module_name} has no make_sft_data()")
  count = jax.process_count()
  if config.batch_size % count:
    raise config_utils.ConfigError(f"batch_size={config.batch_size} is not "
                                   f"divisible by {count} hosts")
  return module.make_sft_data(
      config.data, split=split, batch_size=config.batch_size // count,
      seq_len=config.seq_len, seed=config.data.seed + seed_offset,
      process_index=jax.process_index(), process_count=count)


def optimizer_config(config) -> ts.OptimizerConfig:
  """``config.optimizer`` with ``total_steps=0`` meaning the run's length."""
  values = dict(config.optimizer)
  if not values.get("total_steps"):
    values["total_steps"] = config.total_steps
  try:
    return ts.config_from_mapping(ts.OptimizerConfig, values)
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


def abstract_model(model_cfg: qwen3.Qwen3Config, mesh, rules):
  """(graphdef, abstract state, state shardings), nothing allocated."""
  model = nnx.eval_shape(lambda: qwen3.Qwen3(model_cfg, rngs=nnx.Rngs(0)))
  # The graphdef carries the mesh for the activation constraints.
  shd.set_sharding_ctx(model, mesh, rules)
  graphdef, abstract = nnx.split(model)
  return graphdef, abstract, shd.param_shardings(abstract, mesh, rules)


def _load_init_weights(kind: str, path: str, abstract, shardings, model_cfg):
  """Model state from ``init_from``, placed with ``shardings``."""
  if kind == "orbax":
    return ckpt_lib.restore_model_state(
        path, ckpt_lib.with_shardings(abstract, shardings))
  from paraagent_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  try:
    loaded = hf_io.load_hf(path, dtype=jnp.dtype(model_cfg.param_dtype))
  except (OSError, ValueError, KeyError) as e:
    raise config_utils.ConfigError(f"init_from={path}: {e}") from None
  model = loaded[0] if isinstance(loaded, tuple) else loaded
  state = nnx.state(model)
  if jax.tree.structure(state) != jax.tree.structure(abstract):
    raise config_utils.ConfigError(f"init_from={path}: parameters do not match "
                                   f"the model built from its config.json")
  return jax.device_put(state, shardings)


def abstract_train_state(mesh, optimizer, model_cfg):
  """(graphdef, abstract state, its shardings, abstract opt state, its
  shardings): shapes only, nothing allocated (also the dry run's state)."""
  rules = shd.as_rules(None)
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
      mesh, optimizer, model_cfg)
  checkpointer = ckpt_lib.Checkpointer(
      workdir, every_steps=config.ckpt_every, keep=config.keep_ckpts or None,
      async_save=config.async_ckpt)
  restored = checkpointer.restore(ckpt_lib.with_shardings(abstract, shardings),
                                  ckpt_lib.with_shardings(opt_abs, opt_sh))
  if restored is not None:
    logging.info("resumed from %s", restored.path)
    return TrainState(graphdef, restored.model_state, restored.opt_state,
                      restored.step, restored.rng, restored.data_state,
                      checkpointer, model_cfg, "resumed")

  rng = jax.random.PRNGKey(config.seed)
  state, kind = _initial_state(config, model_cfg, abstract, shardings)
  params, _ = ts.split_params(state)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
  return TrainState(graphdef, state, opt_state, 0, rng, None, checkpointer,
                    model_cfg, kind)


def _initial_state(config, model_cfg, abstract, shardings):
  """(model state a fresh run starts from, its source): init_from or the seeded init."""
  kind = check_init_from(config.init_from)
  if kind:
    return _load_init_weights(kind, config.init_from, abstract, shardings,
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
  _, abstract, shardings = abstract_model(model_cfg, mesh, shd.as_rules(None))
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


def evaluate(eval_step, ts_state, config, mesh) -> dict[str, float]:
  """Mean validation metrics over ``config.eval_batches`` fixed batches."""
  data = make_sft_data(config, "validation", seed_offset=1)
  sums: dict[str, float] = {}
  for _ in range(config.eval_batches):
    out = metrics_lib.to_floats(eval_step(ts_state.state,
                                          device_batch(next(data), mesh)))
    for k, v in out.items():
      sums[k] = sums.get(k, 0.0) + v
  return {k: v / config.eval_batches for k, v in sums.items()}


# ----------------------------------------------------------------------------
# Stages.
# ----------------------------------------------------------------------------


def run_sft(config, workdir: str) -> dict[str, float]:
  """Supervised fine-tuning; returns the last logged train metrics."""
  check_init_from(config.init_from)  # Fail before any compilation.
  mesh = make_mesh(config)
  check_batch_divides(config, mesh)
  sft_stage.ensure_demonstrations(config, workdir)
  data = make_sft_data(config, "train")
  model_cfg = model_config(config, vocab_size=data.vocab_size)
  if data.vocab_size > model_cfg.vocab_size:
    raise config_utils.ConfigError(
        f"data vocabulary {data.vocab_size} exceeds the model's "
        f"{model_cfg.vocab_size}")
  opt_cfg = optimizer_config(config)
  optimizer = ts.make_optimizer(opt_cfg)
  schedule = ts.make_schedule(opt_cfg)

  t = build_train_state(config, mesh, optimizer, model_cfg, workdir)
  train_step = sft_loss.make_sft_train_step(
      t.graphdef, optimizer, mesh, num_micro_batches=config.num_micro_batches)
  eval_step = sft_loss.make_sft_eval_step(t.graphdef, mesh)
  if t.data_state is not None:
    data.restore(t.data_state)
  print(f"sft: {t.source} at step {t.step}/{config.total_steps}; model "
        f"{config.model.preset} vocab {model_cfg.vocab_size}; mesh "
        f"{dict(mesh.shape)}; workdir {workdir}", flush=True)

  writer = metrics_lib.MetricsWriter(
      workdir, total_steps=config.total_steps, start_step=t.step,
      tensorboard=config.tensorboard, progress=config.progress,
      is_primary=jax.process_index() == 0)
  step_rng = jax.random.fold_in(t.rng, 1)
  last: dict[str, float] = {}
  prev_loss = None
  try:
    for step in range(t.step + 1, config.total_steps + 1):
      batch = next(data)
      writer.add_tokens(batch["attention_mask"].sum() * jax.process_count())
      t.state = maybe_inject_nan(config, step, t.state)
      t.state, t.opt_state, out = train_step(
          t.state, t.opt_state, device_batch(batch, mesh),
          jax.random.fold_in(step_rng, step))
      t.step = step
      if prev_loss is not None:
        # The previous step's loss, fetched once this step is queued: every
        # step is checked without stalling the device (logging and saving
        # steps check all their metrics below, before any save).
        metrics_lib.check_finite(step - 1, {"loss": float(prev_loss)},
                                 t.checkpointer.last_complete)
      prev_loss = out["loss"]
      final = step == config.total_steps
      saving = final or t.checkpointer.should_save(step)
      if saving or step % config.log_every == 0:
        # Checked before saving, so a checkpoint never holds a NaN step.
        last = metrics_lib.to_floats(out)
        metrics_lib.check_finite(step, last, t.checkpointer.last_complete)
        last.update(writer.throughput(step))
        last["learning_rate"] = float(schedule(step - 1))
        writer.write(step, last)
      else:
        writer.tick(step)
      if config.eval_every and (step % config.eval_every == 0 or final):
        writer.write(step, evaluate(eval_step, t, config, mesh), "eval")
      stop = bool(interrupts.requested())
      t.checkpointer.save(step, t.state, t.opt_state,
                          data_state=data.state(), rng=t.rng, force=final or stop)
      if stop and not final:
        raise interrupts.Interrupted(f"at step {step}", f"resume from step {step}")
  finally:
    writer.close()
    t.checkpointer.close()
  if last:
    print(f"sft: done at step {t.step}, loss {last.get('loss', float('nan')):.6f}"
          f", {last.get('tokens_per_sec', 0.0):.0f} tokens/s", flush=True)
  if interrupts.requested():
    raise interrupts.Interrupted(f"after the last step ({t.step}, saved)",
                                 "run the held-out evaluation")
  if config.get("sft_eval_tasks", 0):
    last.update({f"eval/{k}": v for k, v in sft_stage.greedy_eval(
        config, workdir, t.graphdef, t.state).items()})
  return last


def run_demos(config, workdir: str) -> dict:
  """Builds the demonstrations dataset into ``workdir`` (cold start)."""
  # Imported here: the cold start pulls in ToolEnv's catalog, which SFT on
  # synthetic data does not need.
  from paraagent_jax.coldstart import build  # pylint: disable=g-import-not-at-top
  return build.build_demonstrations(config, workdir)


def run_pipeline(config, workdir: str) -> dict:
  """Runs ``config.pipeline.stages`` in ``WORKDIR/<stage>`` in order.

  A finished stage leaves ``DONE.json``; rerunning skips it, so the whole
  pipeline resumes like a single stage. SFT reads the demonstrations of the
  ``demos`` stage (unless ``data.data_dir`` is set) and RL starts from the
  SFT checkpoint.
  """
  results = {}
  previous, previous_cfg = "", None
  for stage in config.pipeline.stages:
    if stage not in ("demos", "sft", "sft2", "rl"):
      raise config_utils.ConfigError(f"pipeline.stages: unknown stage "
                                     f"{stage!r}; expected demos, sft, sft2, rl")
    sub = os.path.join(workdir, stage)
    done = os.path.join(sub, DONE_FILE)
    stage_cfg = ml_collections.ConfigDict(config.to_dict())
    stage_cfg.stage = "sft" if stage == "sft2" else stage
    if stage in ("sft", "rl") and "data_dir" in stage_cfg.data and not (
        stage_cfg.data.data_dir) and "demos" in config.pipeline.stages:
      stage_cfg.data.data_dir = os.path.join(workdir, "demos")
    if stage == "sft2":
      if previous != "sft":
        raise config_utils.ConfigError("pipeline.stages: sft2 must follow sft")
      config_utils.merge_nested(stage_cfg, config.pipeline.get("sft2", {}), "pipeline.sft2")
      # Phase 1's weights and tokenizer; demonstrations of its own mix.
      stage_cfg.init_from = os.path.join(workdir, "sft")
      stage_cfg.data.tokenizer = rl_stage.tokenizer_path(previous_cfg)
      stage_cfg.data.data_dir = ""
    if stage == "rl" and previous in ("sft", "sft2"):
      stage_cfg.init_from = os.path.join(workdir, previous)
    previous, previous_cfg = stage, stage_cfg
    if os.path.exists(done):
      print(f"pipeline: {stage} already done ({done})", flush=True)
      continue
    # Each stage's directory is a run of its own: evaluate --checkpoint and
    # export_hf --workdir read the model config from its config.json.
    write_config(stage_cfg, sub)
    results[stage] = STAGES[stage](stage_cfg, sub) or {}
    with open(done, "w") as f:
      json.dump({"stage": stage, "result": results[stage]}, f, default=str)
    if interrupts.requested() and stage != config.pipeline.stages[-1]:
      raise interrupts.Interrupted(f"after stage {stage} (done)",
                                   "go on from the next stage")
  print(pipeline_summary(config, workdir), flush=True)
  return results


def _read_json(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def pipeline_summary(config, workdir: str) -> str:
  """The closing lines of a pipeline: what each stage reached, where it wrote.

  Read from the stages' files, so a rerun that skips finished stages prints
  the same summary.
  """
  lines = ["", f"pipeline: done in {workdir}"]
  for stage in config.pipeline.stages:
    sub = os.path.join(workdir, stage)
    if stage == "demos":
      st = _read_json(os.path.join(sub, "stats.json")) or {}
      kept = {s: (st.get(s) or {}).get("kept") for s in ("train", "test")}
      lines.append(f"  demos  {kept['train']} train + {kept['test']} test "
                   f"demonstrations and their tasks in {sub}")
    elif stage in ("sft", "sft2"):
      ev = _read_json(os.path.join(sub, sft_stage.EVAL_FILE))
      got = (f"held-out greedy success {ev['success']:.1%} (multi-tool "
             f"{ev.get('success_multi_tool', 0.0):.1%})" if ev else "trained")
      lines.append(f"  {stage:<6} {got}; checkpoints in {sub}/checkpoints")
    elif stage == "rl":
      paired = _read_json(os.path.join(sub, rl_stage.PAIRED_FILE))
      if paired:
        lines.append(f"  rl     held-out greedy success {paired['success_before']:.1%} "
                     f"before RL -> {paired['success_after']:.1%} after "
                     f"({paired['only_after']} tasks solved only after, "
                     f"{paired['only_before']} only before; McNemar p = "
                     f"{paired['mcnemar_p']:.3g})")
      else:
        ev = _read_json(os.path.join(sub, "rl_eval.json")) or {}
        lines.append(f"  rl     held-out greedy success after RL "
                     f"{ev.get('success', float('nan')):.1%}")
      lines.append(f"         report {sub}/rl_report.md, learning curve "
                   f"{sub}/rl_curve.png and rl_curve.jsonl")
  lines.append(f"  next: python -m paraagent_jax.evaluate --workdir={workdir}/eval "
               f"--checkpoint={workdir}/{config.pipeline.stages[-1]}  (full report); "
               f"python -m paraagent_jax.export_hf --workdir={workdir}/"
               f"{config.pipeline.stages[-1]} --out=/tmp/hf")
  return "\n".join(lines)


STAGES: dict[str, Callable[[Any, str], Any]] = {
    "sft": run_sft,
    "sft2": run_sft,
    "rl": rl_stage.run_rl,
    "demos": run_demos,
    "pipeline": run_pipeline,
}


def run(config, workdir: str):
  """Runs ``config.stage`` in ``workdir`` (the library entry point)."""
  if config.stage not in STAGES:
    raise config_utils.ConfigError(f"stage={config.stage!r}; expected one of "
                                   f"{', '.join(STAGES)}")
  write_config(config, workdir)
  return STAGES[config.stage](config, workdir)


def write_config(config, workdir: str) -> None:
  """Writes ``workdir/config.json`` (primary host only); creates workdir."""
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(config_utils.to_dict(config), f, indent=1, default=str)


def main(argv) -> None:
  """Command-line entry point: one-line errors, no tracebacks for bad input."""
  if len(argv) > 1:
    sys.exit(f"paraagent_jax.train: error: unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # Orbax logs every file it writes at INFO; keep the console readable.
    logging.set_verbosity(logging.WARNING)
  if _DRY_RUN.value:
    from paraagent_jax import dry_run  # pylint: disable=g-import-not-at-top
    sys.exit(dry_run.main(_CONFIG.value, _FAKE_DEVICES.value))
  if not _CONFIG.value or not _WORKDIR.value:
    sys.exit("paraagent_jax.train: error: --config and --workdir are required")
  try:
    config = config_utils.load_config(_CONFIG.value)
    maybe_initialize_distributed(config)
    workdir = os.path.abspath(_WORKDIR.value)
    # One run per workdir (primary host only: the hosts of a job share it).
    with workdir_lock.held(workdir, enabled=jax.process_index() == 0), \
        interrupts.graceful():
      run(config, workdir)
  except USER_ERRORS as e:
    sys.stdout.flush()
    sys.exit(f"paraagent_jax.train: error: {' '.join(str(e).split())}")
  except interrupts.Interrupted as e:
    sys.stdout.flush()
    print(f"paraagent_jax.train: {e}", file=sys.stderr, flush=True)
    sys.exit(130)
  except KeyboardInterrupt:
    sys.stdout.flush()
    print("paraagent_jax.train: interrupted; rerun the same command to resume "
          "from the last checkpoint", file=sys.stderr, flush=True)
    sys.exit(130)


if __name__ == "__main__":
  app.run(main)
