"""The SFT stage (``config.stage = "sft"``): supervised fine-tuning on fixed-shape
token batches with the loss on assistant tokens.

`run_sft` reads top to bottom like big_vision's train.py: mesh -> data ->
abstract state (``jax.eval_shape``) -> shardings -> jitted init -> jitted,
donating update -> resume -> loop. Restarting the same command resumes
from the newest complete checkpoint in the workdir; a fresh workdir starts
from ``config.init_from`` (an HF directory or an Orbax checkpoint) or from
scratch. Every step is a pure function of the seed and the data position,
so an interrupted and resumed run ends exactly where an uninterrupted one
does.

The stage trains on whatever ``config.data.source`` yields. For the
demonstrations source two things happen around the loop:

* before it, `ensure_demonstrations`: with ``data.data_dir`` empty, the
  cold-start demonstrations are built into ``WORKDIR/demos`` (once; a rerun
  reuses them), so that ``--config=configs/demo.py:stage=sft`` runs alone;
* after it, `greedy_eval`: with ``sft_eval_tasks`` > 0, the trained policy
  runs greedily through the ParaAct rollout on that many held-out ``test``
  tasks (kinds round robin, the RL stage's settings ``rl.*``); success per
  kind, multi-tool success and calls per execute step are printed and saved
  to ``WORKDIR/sft_eval.json``.
"""

from __future__ import annotations

import importlib
import os
import time

from flax import nnx
import jax

import toolenv
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import interrupts
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import rundir
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.coldstart import build as coldstart_build
from paraagent_jax.evaluation import greedy
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import sft_loss
from paraagent_jax.paraact import chat_format, policies
from paraagent_jax.trainer import rl_tasks
from paraagent_jax.trainer import state as state_lib

DEMOS_DIR = "demos"
EVAL_FILE = "sft_eval.json"


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
    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
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


def validation_metrics(eval_step, ts_state, config, mesh) -> dict[str, float]:
  """Mean validation metrics over ``config.eval_batches`` fixed batches."""
  data = make_sft_data(config, "validation", seed_offset=1)
  sums: dict[str, float] = {}
  for _ in range(config.eval_batches):
    out = metrics_lib.to_floats(eval_step(ts_state.state,
                                          state_lib.device_batch(next(data), mesh)))
    for k, v in out.items():
      sums[k] = sums.get(k, 0.0) + v
  return {k: v / config.eval_batches for k, v in sums.items()}


def run_sft(config, workdir: str) -> dict[str, float]:
  """Supervised fine-tuning; returns the last logged train metrics."""
  rundir.check_init_from(config.init_from)  # Fail before any compilation.
  mesh = state_lib.make_mesh(config)
  state_lib.check_batch_divides(config, mesh)
  ensure_demonstrations(config, workdir)
  data = make_sft_data(config, "train")
  model_cfg = rundir.model_config(config, vocab_size=data.vocab_size)
  if data.vocab_size > model_cfg.vocab_size:
    raise config_utils.ConfigError(
        f"data vocabulary {data.vocab_size} exceeds the model's "
        f"{model_cfg.vocab_size}")
  opt_cfg = state_lib.optimizer_config(config)
  optimizer = optim.make_optimizer(opt_cfg)
  schedule = optim.make_schedule(opt_cfg)

  t = state_lib.build_train_state(config, mesh, optimizer, model_cfg, workdir)
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
      t.state = state_lib.maybe_inject_nan(config, step, t.state)
      t.state, t.opt_state, out = train_step(
          t.state, t.opt_state, state_lib.device_batch(batch, mesh),
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
        writer.write(step, validation_metrics(eval_step, t, config, mesh), "eval")
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
    last.update({f"eval/{k}": v for k, v in greedy_eval(
        config, workdir, t.graphdef, t.state).items()})
  return last


def ensure_demonstrations(config, workdir: str) -> None:
  """Points ``config.data.data_dir`` at built demonstrations (in place).

  Does nothing unless ``data.source`` is "demonstrations" and ``data_dir``
  is empty. Otherwise builds into ``WORKDIR/demos`` unless a finished build
  (its ``stats.json``, written last) is there already.
  """
  data = config.data
  if data.source != "demonstrations" or data.get("data_dir", ""):
    return
  out = os.path.join(workdir, DEMOS_DIR)
  if not os.path.exists(os.path.join(out, "stats.json")):
    print(f"sft: data.data_dir is empty: building the demonstrations in {out}",
          flush=True)
    coldstart_build.build_demonstrations(config, out)
  data.data_dir = out


def format_eval(result: dict[str, float]) -> str:
  """A small table: success per kind, overall, multi-tool, calls per step."""
  kinds = sorted(k[len("success_"):] for k in result
                 if k.startswith("success_") and k != "success_multi_tool")
  lines = [f"  {'kind':<12}success"]
  lines += [f"  {k:<12}{result['success_' + k]:.3f}" for k in kinds]
  lines.append(f"  {'overall':<12}{result.get('success', 0.0):.3f}")
  if "success_multi_tool" in result:
    lines.append(f"  {'multi-tool':<12}{result['success_multi_tool']:.3f}")
  lines.append(f"  mean turns {result.get('turns', 0.0):.2f}, calls per execute "
               f"step {result.get('calls_per_execute_step', 0.0):.2f}")
  return "\n".join(lines)


def greedy_eval(config, workdir: str, graphdef, state) -> dict[str, float]:
  """Greedy ParaAct success of the model on ``config.sft_eval_tasks`` test tasks."""
  rl = config.rl
  t0 = time.time()
  tok = tok_lib.load_tokenizer(rundir.tokenizer_dir(config))
  fmt = chat_format.ChatFormat(tok, strategy=rl.strategy)
  catalog = toolenv.load_catalog(config_utils.rl_catalog(config), seed=rl.catalog_seed)
  gen = toolenv.TaskGenerator(catalog, seed=rl.task_seed)
  kinds = [k for k in rl.kinds.split(",") if k]
  tasks = rl_tasks.draw_tasks(gen, "test", 0, int(config.sft_eval_tasks), kinds)
  policy = policies.JaxPolicy(nnx.merge(graphdef, state), fmt, max_len=rl.max_len,
                              max_turn_tokens=rl.max_turn_tokens, temperature=0.0)
  result = greedy.greedy_eval(
      policy, fmt, catalog, tasks, greedy.rollout_config(rl), rl.strategy,
      obs_format=str(config.data.get("obs_format", "full")))
  result["num_tasks"] = len(tasks)
  result["eval_seconds"] = round(time.time() - t0, 1)
  print(f"sft: greedy ParaAct on {len(tasks)} held-out test tasks "
        f"({result['eval_seconds']:.0f}s):\n{format_eval(result)}", flush=True)
  fileio.write_json_atomic(os.path.join(workdir, EVAL_FILE), result, default=None)
  return result
