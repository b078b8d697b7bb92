"""The RL stage (``config.stage = "rl"``): GRPO on ParaAct rollouts in ToolEnv.

Each iteration:

1. draws ``rl.tasks_per_iter`` tasks from ToolEnv's train split (of the
   catalog of ``rl.train_catalog_seed`` when set; task number
   ``it * tasks_per_iter + j``, so a resumed run draws the same tasks); kinds
   round robin, or (``rl.task_sampling="pass_rate"``) in proportion to the
   chance that a group of that kind has both successes and failures, from
   each kind's recent rollout success (`rl_tasks.kind_weights`);
2. rolls out ``rl.group_size`` samples of each with the *current* parameters
   (`paraagent_jax.paraact.rollout.run_rollout`, temperature ``rl.temperature``);
3. ToolEnv scores them at three levels; the rollout packs a `TrajectoryBatch`;
4. takes ``rl.passes`` GRPO steps over it (`paraagent_jax.learner.grpo`: the
   step/phase/trajectory-decoupled advantages are computed inside the jitted
   loss; ``rl.grpo.levels=("traj",)`` is plain GRPO);
5. logs success and each level's mean reward (``metrics.jsonl``), evaluates
   greedily on held-out test tasks every ``rl.eval_every`` iterations, and
   checkpoints every ``rl.ckpt_every`` iterations with Orbax.

Resume. A checkpoint holds the model, the optimizer state, the step, the base
RNG key and, as its JSON data state, the iteration, the run's metadata
(`run_meta`: advantage levels, group size, ...) and the learning curve and
eval history so far. Orbax writes a step into a temporary directory and
renames it when complete, so a kill at any point leaves the previous step as
the newest checkpoint. A restart resumes from it: ``metrics.jsonl`` is
rewritten from the checkpoint's history (no iteration duplicated or missing),
and iteration ``it`` always samples with the seed `iteration_seed` derives
from the restored key and ``it``, so a killed and resumed run ends with the
same parameters and metrics as an uninterrupted one. Resuming with other
advantage levels than the checkpoint's is refused.

Every optimisation pass's metrics are checked: a NaN/Inf stops the run with
the step, the metric and the last good checkpoint named, before anything is
saved (``debug.nan_at_step=N`` injects one, for tests).

Several processes (a pod's hosts; `paraagent_jax.local_pod` on the CPU):
each rolls out the GRPO groups of the batch rows it holds, on its local
devices, and evaluates a share of the held-out tasks; the learner's batch is
one global array of their rows; process 0 writes the files
(`trainer.hosts`). On one process the rollout runs on the train state's own
parameters, as it always did.

Inside the pipeline ``config.init_from`` points at the SFT stage. At the end
the learning curve is saved as ``rl_curve.png`` next to ``metrics.jsonl``,
the final evaluation as ``rl_eval.json`` and the metadata as ``rl_run.json``.
The report, the curve and the paired before/after test are `rl_report`'s.
"""

from __future__ import annotations

import os
import time
from typing import Sequence

from flax import nnx
import jax
import ml_collections
import numpy as np

import toolenv
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import interrupts
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import multihost
from paraagent_jax import sharding as shd
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import paired as paired_lib
from paraagent_jax.evaluation import runner
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import step as ts
from paraagent_jax.paraact import policies, rollout
from paraagent_jax.trainer import hosts as hosts_lib
from paraagent_jax.trainer import rl_report
from paraagent_jax.trainer import rl_tasks
from paraagent_jax.trainer import specs
from paraagent_jax.trainer import state as state_lib

# fold_in tag separating the rollout seeds from the train-step keys.
ROLLOUT_STREAM = 0x5EED


def iteration_seed(rng, it: int) -> int:
  """The rollout sampling seed of iteration ``it`` (from the run's base key).

  The key is restored with every checkpoint, so a resumed run samples the
  same episodes as an uninterrupted one.
  """
  key = jax.random.fold_in(jax.random.fold_in(rng, ROLLOUT_STREAM), it)
  return int(jax.random.randint(key, (), 0, 2**31 - 1))


def resume_history(levels: Sequence[str], data_state, workdir: str,
                   primary: bool = True) -> tuple[int, list[dict]]:
  """(iteration, learning-curve records) of the restored checkpoint.

  Rewrites ``metrics.jsonl`` to exactly those records, so records of
  iterations after the checkpoint (written before a kill) disappear and
  none is duplicated.

  Raises:
    ConfigError: the checkpoint was trained with other advantage ``levels``.
  """
  data_state = dict(data_state or {})
  start_it = int(data_state.get("iteration", 0))
  saved = (data_state.get("meta") or {}).get("levels")
  if saved is not None and tuple(saved) != tuple(levels):
    raise config_utils.ConfigError(
        f"rl: {workdir} was trained with rl.grpo.levels={','.join(saved)}; "
        f"this config says {','.join(levels)} (use another workdir)")
  path = os.path.join(workdir, metrics_lib.METRICS_FILE)
  if "history" in data_state:
    history = [dict(r) for r in data_state["history"]]
  elif start_it and fileio.exists(path):
    # A checkpoint written before the history was stored: keep the file's
    # records up to the checkpoint.
    history = [r for r in metrics_lib.read_jsonl(path)
               if int(r.get("step", 0)) <= start_it]
  else:
    history = []
  if primary:
    fileio.write_jsonl_atomic(path, history)
  return start_it, history


def traj_spread_fraction(traj_reward, group_size: int) -> float:
  """Fraction of groups whose trajectory rewards are not all equal.

  Episodes are laid out group by group (``group_size`` consecutive rows);
  only these groups give plain GRPO (``levels=traj``) a nonzero advantage.
  """
  r = np.asarray(traj_reward, np.float64).reshape(-1, group_size)
  return float(np.mean(r.max(axis=1) - r.min(axis=1) > 1e-9))


def behaviour_metrics(episodes: Sequence[dict]) -> dict[str, float]:
  """Parse failures and failure causes of an iteration's sampled episodes.

  ``rollout/parse_failures``: malformed steps (unparseable text, no phase,
  broken JSON), of ``rollout/steps``; ``rollout/parse_failure_episodes``: the
  share of episodes with one; ``rollout/calls_dropped``: calls written that
  did not become calls, ``rollout/json_errors`` among them (broken JSON);
  ``rollout/unknown_tool_calls``: calls of tools that do not exist;
  ``rollout/cause/<cause>``: the share of episodes that failed for that
  cause (`toolenv.diagnosis`).
  """
  n = max(1, len(episodes))
  totals = runner.parse_failures(episodes)
  out = {"rollout/parse_failures": float(totals["parse_errors"]),
         "rollout/steps": float(sum(e.get("turns", 0) for e in episodes)),
         "rollout/parse_failure_episodes": sum(1 for e in episodes
                                               if e.get("parse_errors", 0)) / n,
         "rollout/calls_dropped": float(totals["calls_dropped"]),
         "rollout/json_errors": float(totals["json_errors"]),
         "rollout/unknown_tool_calls": float(totals["unknown_tool_calls"])}
  if any("cause" in e for e in episodes):
    for cause in toolenv.diagnosis.CAUSES:
      out[f"rollout/cause/{cause}"] = sum(1 for e in episodes if e.get("cause") == cause) / n
  return out


def rollout_metrics(res: rollout.RolloutResult) -> dict:
  """An iteration's rollout metrics: success, each level's mean reward, turns
  and episode lengths."""
  arr = res.arrays
  return {
      "rollout/success": float(np.mean([e["success"] for e in res.episodes])),
      "rollout/traj_reward": float(np.mean(arr["traj_reward"])),
      "rollout/phase_reward": float(np.sum(arr["phase_reward"] * arr["phase_mask"])
                                    / max(1.0, np.sum(arr["phase_mask"]))),
      "rollout/step_reward": float(np.sum(arr["step_reward"] * arr["step_mask"])
                                   / max(1.0, np.sum(arr["step_mask"]))),
      "rollout/turns": float(np.mean([e["turns"] for e in res.episodes])),
      "rollout/episode_tokens": float(np.mean(arr["seq_len"])),
      "rollout/episode_tokens_max": float(np.max(arr["seq_len"]))}


def no_update_note(m: dict) -> str:
  """A console note when a batch gave the optimiser nothing to learn from."""
  if m.get("dropped_episode_frac", 0.0) >= 1.0:
    return ("; no group had reward spread at any enabled level: every episode "
            "was dropped, no update")
  return ""


def iteration_line(it: int, iterations: int, m: dict, n_groups: int) -> str:
  """The console line of one RL iteration."""
  return (f"rl: it {it}/{iterations} success {m['rollout/success']:.2f} "
          f"spread {round(m['rollout/traj_spread_groups'] * n_groups)}/{n_groups} "
          f"R {m['rollout/traj_reward']:.3f} phase {m['rollout/phase_reward']:.3f} "
          f"step {m['rollout/step_reward']:.3f} loss {m.get('loss', float('nan')):.4f} "
          f"parse {int(m['rollout/parse_failures'])}/{int(m['rollout/steps'])} "
          f"(dropped {int(m.get('rollout/calls_dropped', 0))}, "
          f"json {int(m.get('rollout/json_errors', 0))}, "
          f"unknown tools {int(m.get('rollout/unknown_tool_calls', 0))}) "
          f"gap {m.get('rollout/logp_gap_max', float('nan')):.1e} "
          f"({m['time/iteration_s']:.1f}s)" + no_update_note(m))


def run_rl(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs the RL stage of ``config`` in ``workdir``; returns the final
  evaluation metrics. The config is read here only (`specs.rl_spec`)."""
  spec = specs.rl_spec(config)
  return RLRun(spec, workdir).run()


class RLRun:
  """One RL run: the train state, the policy, the environments and the loop.

  ``__init__`` sets everything up (tokenizer, held-out tasks, mesh, state,
  jitted GRPO step, resume); `run` evaluates before, iterates (`iteration`:
  rollout -> GRPO passes -> metrics; `evaluate` every ``eval_every``),
  checkpoints, and writes the report (`finish`).
  """

  def __init__(self, spec: specs.RLSpec, workdir: str):
    self.spec, self.workdir = spec, workdir
    tok = tok_lib.load_tokenizer(spec.tokenizer)
    self.fmt = spec.protocol.chat_format(tok, spec.strategy)
    try:
      self.heldout = heldout.HeldOut(spec.heldout)
    except ValueError as e:
      raise config_utils.ConfigError(f"rl: {e}") from None
    self.train_gen = rl_tasks.train_generator(spec.tasks, self.heldout.catalog)
    self.mesh = shd.make_mesh(dict(spec.run.mesh))
    optimizer = optim.make_optimizer(spec.optimizer)
    self.t = state_lib.build_train_state(spec.run, self.mesh, optimizer,
                                         spec.model.qwen3_config(len(tok)), workdir)
    self.step_fn = grpo.make_train_step(self.t.graphdef, optimizer, spec.grpo, self.mesh,
                                        lengths=spec.length_buckets)
    # beta > 0: the k3 KL pulls towards the policy RL started from, frozen (the
    # same parameters after a resume); beta = 0 never builds it.
    self.ref_state = (state_lib.initial_model_state(spec.run, self.mesh, self.t.model_config)
                      if spec.grpo.beta > 0 else None)
    self.primary = multihost.is_primary()
    self.meta = dict(spec.meta)
    try:
      # Several processes: each rolls out its rows on its own devices.
      self.hosts = (hosts_lib.Hosts(self.mesh, self.t.model_config, spec.run.rules,
                                    spec.tasks.per_iteration, spec.tasks.group_size)
                    if jax.process_count() > 1 else None)
      self.start_it, self.history = resume_history(spec.grpo.levels, self.t.data_state,
                                                   workdir, self.primary)
    except config_utils.ConfigError:
      self.t.checkpointer.close()
      raise
    multihost.barrier("rl: metrics.jsonl resumed")
    if self.primary:
      fileio.write_json_atomic(os.path.join(workdir, rl_report.RUN_META_FILE), self.meta)
    s = spec.sampling
    self.policy = policies.JaxPolicy(
        self.sampling_model(), self.fmt, max_len=spec.limits.max_len,
        max_turn_tokens=spec.limits.max_turn_tokens, temperature=s.temperature,
        top_k=s.top_k, top_p=s.top_p, draw=s.draw)
    rows = (self.hosts.rows if self.hosts else
            (0, spec.tasks.per_iteration * spec.tasks.group_size))
    self.env = toolenv.VectorToolEnv(
        self.train_gen.catalog, num_envs=rows[1] - rows[0],
        obs_format=spec.obs_format, **toolenv.oracle.env_options(spec.strategy))
    self.writer = None
    self.behaviour: list[str] = []

  def model(self):
    """The policy model at the current parameters."""
    return nnx.merge(self.t.graphdef, self.t.state)

  def sampling_model(self):
    """The model the sampler runs: `model` on one process; on several, a
    copy on this process's devices (`hosts.Hosts.sampling_model`, a
    collective)."""
    if self.hosts is None:
      return self.model()
    return self.hosts.sampling_model(self.t.state)

  def log(self, it: int, metrics: dict, prefix: str = "train") -> None:
    self.writer.write(it, metrics, prefix)
    self.history.append({"step": int(it), **{f"{prefix}/{k}": float(v)
                                             for k, v in metrics.items()}})

  def run(self) -> dict:
    spec, t = self.spec, self.t
    print(f"rl: {t.source} at iteration {self.start_it}/{spec.iterations} (step {t.step}); "
          f"{spec.tasks.per_iteration} tasks x {spec.tasks.group_size} samples, levels "
          f"{spec.grpo.levels}, strategy {spec.strategy}; workdir {self.workdir}", flush=True)
    self.writer = metrics_lib.MetricsWriter(
        self.workdir, total_steps=spec.iterations, start_step=self.start_it,
        tensorboard=spec.tensorboard, progress=False, is_primary=self.primary)
    result = last_eval(self.history)
    try:
      if self.start_it == 0 and spec.eval_every:
        before = self.evaluate(0, rl_report.EVAL_BEFORE_FILE)
        print(f"rl: held-out greedy success before RL {before['success']:.3f}", flush=True)
      for it in range(self.start_it + 1, spec.iterations + 1):
        self.iteration(it)
        final = it == spec.iterations
        if (spec.eval_every and it % spec.eval_every == 0) or final:
          result = self.evaluate(it, rl_report.EVAL_AFTER_FILE if final else None)
          print(f"rl: held-out greedy success {result['success']:.3f} "
                f"(multi-tool {result.get('success_multi_tool', 0.0):.3f}), "
                f"{runner.parse_failure_text(result)}", flush=True)
        stop = state_lib.stop_requested()   # every process at the same iteration
        if final or stop or (spec.ckpt_every > 0 and it % spec.ckpt_every == 0):
          # The history rides in the checkpoint's JSON: the curve on disk can
          # always be rebuilt to match the parameters it resumes from.
          t.checkpointer.save(
              t.step, t.state, t.opt_state, rng=t.rng, force=True,
              data_state={"iteration": it, "meta": self.meta, "history": list(self.history)})
        if stop and not final:
          raise interrupts.Interrupted(f"at rl iteration {it}",
                                       f"resume from iteration {it}")
    finally:
      self.writer.close()
      t.checkpointer.close()
    if self.primary:
      self.finish(result)
    return result

  def evaluate(self, it: int, final_file: str | None) -> dict[str, float]:
    """Greedy held-out evaluation at iteration ``it``: logged, per-task
    records written (``eval_it<it>.jsonl`` after iteration 0, and
    ``final_file``); the last one also tabulates behaviour against the oracle."""
    if it:
      self.policy.update_model(self.sampling_model())
    ev = (self.heldout.run(self.policy, self.fmt) if self.hosts is None
          else hosts_lib.evaluate_share(self.heldout, self.policy, self.fmt))
    per_task = [heldout.paired_record(r) for r in ev.records]
    if self.primary:
      if it:
        # Every evaluation's per-task records (paired tests along a long run).
        heldout.write_per_task(os.path.join(self.workdir, f"eval_it{it}.jsonl"), per_task)
      if final_file:
        heldout.write_per_task(os.path.join(self.workdir, final_file), per_task)
      if final_file == rl_report.EVAL_AFTER_FILE:
        self.behaviour = heldout.behaviour_table(
            per_task, heldout.oracle_records(self.heldout.tasks, self.spec.strategy))
    self.log(it, ev.metrics, "eval")
    return ev.metrics

  def iteration(self, it: int) -> dict:
    """One iteration: rollouts of this iteration's tasks, ``passes`` GRPO
    steps over them (each checked for NaN/Inf), metrics logged and printed."""
    spec, t, g = self.spec, self.t, self.spec.tasks.group_size
    t0 = time.perf_counter()
    tasks = rl_tasks.sample_tasks(self.train_gen, it, spec.tasks, self.history)
    group_tasks = [task for task in tasks for _ in range(g)]
    group_ids = [j for j in range(len(tasks)) for _ in range(g)]
    self.policy.update_model(self.sampling_model())
    if self.hosts is None:
      res = rollout.run_rollout(self.policy, self.env, group_tasks, self.fmt, spec.limits,
                                group_ids=group_ids, seed=iteration_seed(t.rng, it))
      t_roll = time.perf_counter() - t0
      batch = res.trajectory_batch()
      if spec.token_budget:
        batch, _ = batch_lib.apply_token_budget(batch, spec.token_budget)
      batch = jax.device_put(batch, ts.data_sharding(batch, self.mesh))
    else:   # this process's rows; the batch is one global array of every process's
      res, batch, parts = self.host_rollout(group_tasks, group_ids, iteration_seed(t.rng, it))
      t_roll = parts[self.hosts.index]["timing"]["total_s"]
    outs = []
    for k in range(spec.passes):
      t.state = state_lib.maybe_inject_nan(spec.run.nan_at_step, t.step + 1, t.state)
      rng = jax.random.fold_in(jax.random.fold_in(t.rng, it), k)
      t.state, t.opt_state, out = self.step_fn(t.state, t.opt_state, batch, rng,
                                               ref_state=self.ref_state)
      t.step += 1
      outs.append(out)
    # Every pass is checked (a pass's metrics are a few scalars; the
    # rollout already synchronised), before anything is logged or saved.
    m = {}
    for k, out in enumerate(outs):
      m = metrics_lib.to_floats(out)
      metrics_lib.check_finite(
          t.step - len(outs) + 1 + k, m, t.checkpointer.last_complete,
          context=f"rl iteration {it}, pass {k + 1}/{spec.passes}")
    m.update(rollout_metrics(res))
    m.update({"time/rollout_s": t_roll, "time/iteration_s": time.perf_counter() - t0})
    m.update(rl_tasks.kind_rollout_metrics(group_tasks, res.episodes))
    m["rollout/traj_spread_groups"] = traj_spread_fraction(res.arrays["traj_reward"], g)
    m.update(behaviour_metrics(res.episodes))
    if self.hosts is not None:
      m.update(self.hosts.episode_counts(parts))
    # The sampler/trainer log-prob gap at the first pass (same parameters).
    first = metrics_lib.to_floats(outs[0]) if outs else {}
    for k in ("logp_gap_mean", "logp_gap_max"):
      if k in first:
        m[f"rollout/{k}"] = first[k]
    self.log(it, m)
    n_groups = len(res.arrays["traj_reward"]) // g
    print(iteration_line(it, spec.iterations, m, n_groups), flush=True)
    return m

  def host_rollout(self, group_tasks, group_ids, seed: int):
    """This process's rows of the iteration's rollout (its groups, drawing
    the random numbers they draw in the whole batch); returns (every
    process's rollout gathered for the metrics, the learner's global batch,
    each process's part: `hosts.gather_rollout`)."""
    h = self.hosts
    self.policy.rows = (h.rows[0], h.num_rows)
    try:
      local = rollout.run_rollout(self.policy, self.env, h.share(group_tasks), self.fmt,
                                  self.spec.limits, group_ids=h.share(group_ids), seed=seed)
    finally:
      self.policy.rows = None
    batch = hosts_lib.global_batch(local, self.mesh, self.spec.token_budget)
    res, parts = hosts_lib.gather_rollout(local, h.rows[0])
    return res, batch, parts

  def finish(self, result: dict) -> None:
    """The learning curve, the final evaluation, the paired before/after test,
    the causes and the report (primary process)."""
    workdir = self.workdir
    curve = rl_report.save_curve(workdir)
    if curve:
      print(f"rl: learning curve {curve}", flush=True)
    fileio.write_json_atomic(os.path.join(workdir, "rl_eval.json"), result)
    paired = rl_report.paired_before_after(workdir)
    if paired:
      print("rl: " + paired_lib.format_paired(paired, ("before", "after")), flush=True)
    for line in rl_report.cause_summary_lines(workdir):
      print("rl: " + line, flush=True)
    report = rl_report.write_report(workdir, self.history, result, paired, self.meta,
                                    self.behaviour)
    print(f"rl: report {report}", flush=True)


def last_eval(history: Sequence[dict]) -> dict[str, float]:
  """The newest evaluation in ``history`` (metric names without the prefix)."""
  for rec in reversed(history):
    ev = {k[len("eval/"):]: v for k, v in rec.items() if k.startswith("eval/")}
    if ev:
      return ev
  return {}
