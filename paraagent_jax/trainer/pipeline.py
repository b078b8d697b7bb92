"""What ``config.stage`` runs, and the pipeline of stages.

* ``sft``: `trainer.sft.run_sft`; ``rl``: `trainer.rl.run_rl`;
* ``demos``: build the demonstrations dataset (`paraagent_jax.coldstart`);
* ``pipeline``: ``config.pipeline.stages`` in turn, each in
  ``WORKDIR/<stage>``, each starting from the previous one's result; a
  finished stage leaves ``DONE.json`` and a rerun skips it.

`run(config, workdir)` is the library entry point behind
``python -m paraagent_jax.train``.

Several processes (a pod's hosts) run every stage together, except the
``demos`` stage, which process 0 builds alone (the cold start writes its
files from every process that runs it); process 0 writes the ``DONE.json``
markers; after each stage a barrier lets every process read what it wrote.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import ml_collections

from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import interrupts
from paraagent_jax import multihost
from paraagent_jax import rundir
from paraagent_jax.coldstart import build as coldstart_build
from paraagent_jax.trainer import rl as rl_lib
from paraagent_jax.trainer import rl_report
from paraagent_jax.trainer import sft as sft_lib

DONE_FILE = "DONE.json"


def run_demos(config, workdir: str) -> dict:
  """Builds the demonstrations dataset into ``workdir`` (cold start), on
  process 0 only: the other processes wait for it and read its statistics."""
  result = {}
  if multihost.is_primary():
    result = coldstart_build.build_demonstrations(config, workdir)
  multihost.barrier("pipeline: demos built")
  return multihost.allgather_json(result)[0]


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
      stage_cfg.data.tokenizer = rundir.tokenizer_dir(previous_cfg)
      stage_cfg.data.data_dir = ""
    if stage == "rl" and previous in ("sft", "sft2"):
      stage_cfg.init_from = os.path.join(workdir, previous)
    previous, previous_cfg = stage, stage_cfg
    if fileio.exists(done):
      print(f"pipeline: {stage} already done ({done})", flush=True)
      continue
    # Each stage's directory is a run of its own: evaluate --checkpoint and
    # export_hf --workdir read the model config from its config.json.
    rundir.write_config(stage_cfg, sub)
    results[stage] = STAGES[stage](stage_cfg, sub) or {}
    if multihost.is_primary():
      fileio.write_json_atomic(done, {"stage": stage, "result": results[stage]},
                               indent=None)
    multihost.barrier(f"pipeline: {stage} done")
    if interrupts.requested() and stage != config.pipeline.stages[-1]:
      raise interrupts.Interrupted(f"after stage {stage} (done)",
                                   "go on from the next stage")
  print(pipeline_summary(config, workdir), flush=True)
  return results


def _read_json(path: str) -> dict | None:
  if not fileio.exists(path):
    return None
  with fileio.open(path) as f:
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
      ev = _read_json(os.path.join(sub, sft_lib.EVAL_FILE))
      got = (f"held-out greedy success {ev['success']:.1%} (multi-tool "
             f"{ev.get('success_multi_tool', 0.0):.1%})" if ev else "trained")
      lines.append(f"  {stage:<6} {got}; checkpoints in {sub}/checkpoints")
    elif stage == "rl":
      paired = _read_json(os.path.join(sub, rl_report.PAIRED_FILE))
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
  last = config.pipeline.stages[-1]
  if config.get("runlocal"):
    ev = (f"python -m paraagent_jax.evaluate --config=configs/evaluate.py:runlocal "
          f"--workdir={workdir}/eval --checkpoint={workdir}/{last}  (10 tasks per "
          "strategy, about a minute)")
  else:
    ev = (f"python -m paraagent_jax.evaluate --config=configs/evaluate.py:strategies=paraact "
          f"--workdir={workdir}/eval --checkpoint={workdir}/{last}  (the full report on "
          "200 held-out tasks: 3-4 minutes on 2 CPU cores for the demo model; without "
          "strategies=, one such run per strategy, four)")
  lines.append(f"  next: {ev}; python -m paraagent_jax.export_hf --workdir={workdir}/"
               f"{last} --out=/tmp/hf")
  return "\n".join(lines)


STAGES: dict[str, Callable[[Any, str], Any]] = {
    "sft": sft_lib.run_sft,
    "sft2": sft_lib.run_sft,
    "rl": rl_lib.run_rl,
    "demos": run_demos,
    "pipeline": run_pipeline,
}


def run(config, workdir: str):
  """Runs ``config.stage`` in ``workdir`` (the library entry point)."""
  if config.stage not in STAGES:
    raise config_utils.ConfigError(f"stage={config.stage!r}; expected one of "
                                   f"{', '.join(STAGES)}")
  rundir.write_config(config, workdir)
  return STAGES[config.stage](config, workdir)
