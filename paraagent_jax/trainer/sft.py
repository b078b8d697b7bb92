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
  tasks (kinds round robin, the RL stage's settings ``rl.*``; the held-out
  evaluator `evaluation.heldout`); success per kind, multi-tool success and
  calls per execute step are printed and saved to ``WORKDIR/sft_eval.json``.

The config is read once, at the door (`specs.sft_spec`); the loop runs on the
typed `specs.SFTSpec`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import time

from flax import nnx
import jax

from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import interrupts
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import multihost
from paraagent_jax import sharding as shd
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.coldstart import build as coldstart_build
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import runner
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import sft_loss
from paraagent_jax.paraact import formats, policies
from paraagent_jax.trainer import specs
from paraagent_jax.trainer import state as state_lib

DEMOS_DIR = "demos"
EVAL_FILE = "sft_eval.json"


def make_sft_data(spec: specs.SFTSpec, split: str, seed_offset: int = 0):
  """The SFT data source named by ``spec.source`` (``data.source``; this host's rows).

  The source is the module ``paraagent_jax.data.<source>``, whose
  ``make_sft_data(data_config, *, split, batch_size, seq_len, seed,
  process_index, process_count)`` returns an iterator with ``state()`` and
  ``restore()`` (see `paraagent_jax.data.synthetic`).
  """
  name = spec.source
  module_name = f"paraagent_jax.data.{name}"
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name != module_name:
      raise
    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
    known = sorted(f[:-3] for f in fileio.listdir(here)
                   if f.endswith(".py") and not f.startswith("_"))
    raise config_utils.ConfigError(
        f"data.source={name!r}: no module {module_name}; available: "
        f"{', '.join(known)}") from None
  if not hasattr(module, "make_sft_data"):
    raise config_utils.ConfigError(
        f"data.source={name!r}: {module_name} has no make_sft_data()")
  count = jax.process_count()
  if spec.batch_size % count:
    raise config_utils.ConfigError(f"batch_size={spec.batch_size} is not "
                                   f"divisible by {count} hosts")
  # Process 0 first: what a source builds on first use (a TFDS dataset, a
  # tokenizer) is built once, then read by the others.
  # A source that writes chat turns takes the protocol format (``protocol=``).
  takes = "protocol" in inspect.signature(module.make_sft_data).parameters
  if not takes and spec.protocol.format != formats.TAGS:
    raise config_utils.ConfigError(
        f"data.source={name!r} writes no chat turns; protocol.format="
        f"{spec.protocol.format} needs data.source=demonstrations")
  with multihost.primary_first(f"sft data {split}"):
    return module.make_sft_data(
        spec.data, split=split, batch_size=spec.batch_size // count,
        seq_len=spec.seq_len, seed=spec.data_seed + seed_offset,
        process_index=jax.process_index(), process_count=count,
        **({"protocol": spec.protocol} if takes else {}))


def validation_metrics(eval_step, ts_state, spec: specs.SFTSpec, mesh) -> dict[str, float]:
  """Mean validation metrics over ``spec.eval_batches`` fixed batches."""
  data = make_sft_data(spec, "validation", seed_offset=1)
  sums: dict[str, float] = {}
  for _ in range(spec.eval_batches):
    out = metrics_lib.to_floats(eval_step(ts_state.state,
                                          state_lib.device_batch(next(data), mesh)))
    for k, v in out.items():
      sums[k] = sums.get(k, 0.0) + v
  return {k: v / spec.eval_batches for k, v in sums.items()}


def run_sft(config, workdir: str) -> dict[str, float]:
  """Supervised fine-tuning; returns the last logged train metrics.

  The config is read here only: every config error stops the run before the
  demonstrations are built or anything is compiled.
  """
  spec = specs.sft_spec(config)
  mesh = shd.make_mesh(dict(spec.run.mesh))
  state_lib.check_batch_divides(spec.batch_size, spec.num_micro_batches, mesh)
  if ensure_demonstrations(config, workdir):
    spec = specs.sft_spec(config)   # data.data_dir now points at them
  return train_sft(spec, workdir, mesh)


def train_sft(spec: specs.SFTSpec, workdir: str, mesh) -> dict[str, float]:
  """The SFT loop of `run_sft` on its spec."""
  data = make_sft_data(spec, "train")
  model_cfg = spec.model.qwen3_config(data.vocab_size)
  if data.vocab_size > model_cfg.vocab_size:
    raise config_utils.ConfigError(
        f"data vocabulary {data.vocab_size} exceeds the model's "
        f"{model_cfg.vocab_size}")
  optimizer = optim.make_optimizer(spec.optimizer)
  schedule = optim.make_schedule(spec.optimizer)

  t = state_lib.build_train_state(spec.run, mesh, optimizer, model_cfg, workdir)
  train_step = sft_loss.make_sft_train_step(
      t.graphdef, optimizer, mesh, num_micro_batches=spec.num_micro_batches)
  eval_step = sft_loss.make_sft_eval_step(t.graphdef, mesh)
  if t.data_state is not None:
    data.restore(t.data_state)
  print(f"sft: {t.source} at step {t.step}/{spec.total_steps}; model "
        f"{spec.model.preset} vocab {model_cfg.vocab_size}; mesh "
        f"{dict(mesh.shape)}; workdir {workdir}", flush=True)

  writer = metrics_lib.MetricsWriter(
      workdir, total_steps=spec.total_steps, start_step=t.step,
      tensorboard=spec.tensorboard, progress=spec.progress,
      is_primary=jax.process_index() == 0)
  rows_log = RowsLog(spec.rows_log)
  step_rng = jax.random.fold_in(t.rng, 1)
  last: dict[str, float] = {}
  prev_loss = None
  try:
    for step in range(t.step + 1, spec.total_steps + 1):
      batch = next(data)
      rows_log.write(step, data)
      writer.add_tokens(batch["attention_mask"].sum() * jax.process_count())
      t.state = state_lib.maybe_inject_nan(spec.run.nan_at_step, step, t.state)
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
      final = step == spec.total_steps
      saving = final or t.checkpointer.should_save(step)
      if saving or step % spec.log_every == 0:
        # Checked before saving, so a checkpoint never holds a NaN step.
        last = metrics_lib.to_floats(out)
        metrics_lib.check_finite(step, last, t.checkpointer.last_complete)
        last.update(writer.throughput(step))
        last["learning_rate"] = float(schedule(step - 1))
        writer.write(step, last)
      else:
        writer.tick(step)
      if spec.eval_every and (step % spec.eval_every == 0 or final):
        writer.write(step, validation_metrics(eval_step, t, spec, mesh), "eval")
      # On several processes: any one's signal stops all at this step.
      stop = state_lib.stop_requested()
      t.checkpointer.save(step, t.state, t.opt_state,
                          data_state=data.state(), rng=t.rng, force=final or stop)
      if stop and not final:
        raise interrupts.Interrupted(f"at step {step}", f"resume from step {step}")
  finally:
    writer.close()
    rows_log.close()
    t.checkpointer.close()
  if last:
    print(f"sft: done at step {t.step}, loss {last.get('loss', float('nan')):.6f}"
          f", {last.get('tokens_per_sec', 0.0):.0f} tokens/s", flush=True)
  if state_lib.stop_requested():
    raise interrupts.Interrupted(f"after the last step ({t.step}, saved)",
                                 "run the held-out evaluation")
  if spec.heldout is not None:
    last.update({f"eval/{k}": v for k, v in heldout_eval(
        spec, workdir, t.graphdef, t.state).items()})
  return last


def ensure_demonstrations(config, workdir: str) -> bool:
  """Points ``config.data.data_dir`` at built demonstrations (in place).

  Does nothing (returns False) unless ``data.source`` is "demonstrations"
  and ``data_dir`` is empty. Otherwise builds into ``WORKDIR/demos`` unless a
  finished build (its ``stats.json``, written last) is there already.
  """
  data = config.data
  if data.source != "demonstrations" or data.get("data_dir", ""):
    return False
  out = os.path.join(workdir, DEMOS_DIR)
  # Process 0 builds them; the others wait, then read them.
  with multihost.primary_first("sft demonstrations"):
    if jax.process_index() == 0 and not fileio.exists(os.path.join(out, "stats.json")):
      print(f"sft: data.data_dir is empty: building the demonstrations in {out}",
            flush=True)
      coldstart_build.build_demonstrations(config, out)
  data.data_dir = out
  return True


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
  lines.append("  " + runner.parse_failure_text(result))
  return "\n".join(lines)


def heldout_eval(spec: specs.SFTSpec, workdir: str, graphdef, state) -> dict[str, float]:
  """Greedy ParaAct success of the model on ``spec.heldout``'s test tasks."""
  t0 = time.time()
  fmt = spec.protocol.chat_format(tok_lib.load_tokenizer(spec.tokenizer),
                                 spec.heldout.strategy)
  held = heldout.HeldOut(spec.heldout)
  limits = spec.heldout.limits
  policy = policies.JaxPolicy(nnx.merge(graphdef, state), fmt, max_len=limits.max_len,
                              max_turn_tokens=limits.max_turn_tokens, temperature=0.0)
  result = held.run(policy, fmt).metrics
  result["num_tasks"] = len(held.tasks)
  result["eval_seconds"] = round(time.time() - t0, 1)
  print(f"sft: greedy ParaAct on {len(held.tasks)} held-out test tasks "
        f"({result['eval_seconds']:.0f}s):\n{format_eval(result)}", flush=True)
  if jax.process_index() == 0:
    fileio.write_json_atomic(os.path.join(workdir, EVAL_FILE), result, default=None)
  return result


class RowsLog:
  """The ``debug.rows_log`` hook: appends, per step, the ids of the rows this
  process trained on (the source's ``last_row_ids()``) to
  ``DIR/rows_<process>.jsonl``; nothing when ``directory`` is "". A resumed
  run appends after the killed one's lines: the last line of a step wins."""

  def __init__(self, directory: str):
    self._file = (fileio.AppendFile(os.path.join(directory, f"rows_{jax.process_index()}.jsonl"))
                  if directory else None)

  def write(self, step: int, data) -> None:
    if self._file is not None:
      self._file.write(json.dumps({"step": step, "process": jax.process_index(),
                                   "rows": data.last_row_ids()}) + "\n")

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
