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

Inside the pipeline ``config.init_from`` points at the SFT stage. At the end
the learning curve is saved as ``rl_curve.png`` next to ``metrics.jsonl``,
the final evaluation as ``rl_eval.json`` and the metadata as ``rl_run.json``.
The report, the curve and the paired before/after test are `rl_report`'s.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from flax import nnx
import jax
import ml_collections
import numpy as np

import toolenv
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import interrupts
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import provenance
from paraagent_jax import rundir
from paraagent_jax.sampling import programs as sampling_kernels
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.data import rows as data_rows
from paraagent_jax.evaluation import greedy
from paraagent_jax.evaluation import paired as paired_lib
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import step as ts
from paraagent_jax.paraact import chat_format, policies, rollout
from paraagent_jax.trainer import rl_report
from paraagent_jax.trainer import rl_tasks
from paraagent_jax.trainer import state as state_lib

# fold_in tag separating the rollout seeds from the train-step keys.
ROLLOUT_STREAM = 0x5EED


def length_buckets(rl) -> list[int]:
  """``rl.length_buckets`` as sorted update lengths ending at ``rl.max_len``
  ([] = no buckets), parsed like ``data.length_bucket``."""
  spec = str(rl.get("length_buckets", "") or "")
  try:
    return data_rows.bucket_lengths(spec, int(rl.max_len))
  except ValueError as e:
    raise config_utils.ConfigError(f"rl.length_buckets: {e}") from None


def _levels(spec: Any) -> tuple[str, ...]:
  if isinstance(spec, str):
    return tuple(s.strip() for s in spec.split(",") if s.strip())
  return tuple(spec)


def iteration_seed(rng, it: int) -> int:
  """The rollout sampling seed of iteration ``it`` (from the run's base key).

  The key is restored with every checkpoint, so a resumed run samples the
  same episodes as an uninterrupted one.
  """
  key = jax.random.fold_in(jax.random.fold_in(rng, ROLLOUT_STREAM), it)
  return int(jax.random.randint(key, (), 0, 2**31 - 1))


def run_meta(config, levels: Sequence[str]) -> dict[str, Any]:
  """What identifies an RL run: stored in its checkpoints and ``rl_run.json``."""
  rl = config.rl
  return {"levels": list(levels), "normalize": rl.grpo.normalize,
          "strategy": rl.strategy, "group_size": int(rl.group_size),
          "tasks_per_iter": int(rl.tasks_per_iter), "passes": int(rl.passes),
          "task_sampling": rl_tasks.task_sampling(rl),
          "train_catalog_seed": int(rl.get("train_catalog_seed", -1)),
          "temperature": float(rl.temperature), "seed": int(config.seed),
          "init_from": config.init_from, "machine": provenance.machine()}


def resume_history(config, levels, data_state, workdir: str,
                   primary: bool = True) -> tuple[int, list[dict]]:
  """(iteration, learning-curve records) of the restored checkpoint.

  Rewrites ``metrics.jsonl`` to exactly those records, so records of
  iterations after the checkpoint (written before a kill) disappear and
  none is duplicated.

  Raises:
    ConfigError: the checkpoint was trained with other advantage levels.
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
  elif start_it and os.path.exists(path):
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
  share of episodes with one; ``rollout/cause/<cause>``: the share of
  episodes that failed for that cause (`toolenv.diagnosis`).
  """
  n = max(1, len(episodes))
  out = {"rollout/parse_failures": float(sum(e.get("parse_errors", 0) for e in episodes)),
         "rollout/steps": float(sum(e.get("turns", 0) for e in episodes)),
         "rollout/parse_failure_episodes": sum(1 for e in episodes
                                               if e.get("parse_errors", 0)) / n,
         "rollout/unknown_tool_calls": float(sum(e.get("unknown_tool_calls", 0)
                                                 for e in episodes))}
  if any("cause" in e for e in episodes):
    for cause in toolenv.diagnosis.CAUSES:
      out[f"rollout/cause/{cause}"] = sum(1 for e in episodes if e.get("cause") == cause) / n
  return out


def no_update_note(m: dict) -> str:
  """A console note when a batch gave the optimiser nothing to learn from."""
  if m.get("dropped_episode_frac", 0.0) >= 1.0:
    return ("; no group had reward spread at any enabled level: every episode "
            "was dropped, no update")
  return ""


def rl_optimizer_config(config):
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
    raise config_utils.ConfigError(f"optimizer (rl): schedule={values['schedule']!r}; "
                                   f"choose from {optim.SCHEDULES}")
  values["total_steps"] = max(1, int(rl.iterations) * int(rl.passes))
  values["warmup_steps"] = min(int(values.get("warmup_steps", 0)), values["total_steps"] - 1)
  try:
    return config_utils.config_from_mapping(optim.OptimizerConfig, values)
  except (ValueError, TypeError) as e:
    raise config_utils.ConfigError(f"optimizer (rl): {e}") from None


def run_rl(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs the RL stage in ``workdir``; returns the final evaluation metrics."""
  rl = config.rl
  rl_tasks.task_sampling(rl)   # checked before the evaluation, not at iteration 1
  if rl.get("draw", "gumbel") not in sampling_kernels.DRAWS:
    raise config_utils.ConfigError(f"rl.draw={rl.draw!r}; expected one of "
                                   f"{', '.join(sampling_kernels.DRAWS)}")
  buckets = length_buckets(rl)
  tpath = rundir.tokenizer_dir(config)
  if not tpath or not os.path.exists(tpath):
    raise config_utils.ConfigError(
        f"rl: no tokenizer at {tpath!r}; set rl.tokenizer or data.data_dir")
  tok = tok_lib.load_tokenizer(tpath)
  # pylint: disable-next=g-import-not-at-top
  fmt = chat_format.ChatFormat(tok, strategy=rl.strategy)
  kinds = [k for k in rl.kinds.split(",") if k]
  catalog = toolenv.load_catalog(config_utils.rl_catalog(config), seed=rl.catalog_seed)
  gen = toolenv.TaskGenerator(catalog, seed=rl.task_seed)
  eval_tasks = rl_tasks.draw_tasks(gen, "test", 0, rl.eval_tasks, kinds)
  train_catalog, train_gen = catalog, gen
  train_seed = int(rl.get("train_catalog_seed", -1))
  if train_seed >= 0 and train_seed != int(rl.catalog_seed):
    # Training tasks from another catalog seed: other provider names, most of
    # them new to the policy (held-out tasks stay on catalog_seed).
    train_catalog = toolenv.load_catalog(config_utils.rl_catalog(config), seed=train_seed)
    train_gen = toolenv.TaskGenerator(train_catalog, seed=rl.task_seed)
  rcfg = greedy.rollout_config(rl)

  rundir.check_init_from(config.init_from)
  mesh = state_lib.make_mesh(config)
  model_cfg = rundir.model_config(config, vocab_size=len(tok))
  opt_cfg = rl_optimizer_config(config)
  optimizer = optim.make_optimizer(opt_cfg)
  gcfg = dict(rl.grpo.to_dict())
  gcfg["levels"] = _levels(gcfg.get("levels", "traj,phase,step"))
  # RL batches (groups x full episodes) are larger than SFT's: their own
  # micro-batching bounds the step's memory (0 = the SFT setting).
  gcfg["num_micro_batches"] = config_utils.rl_micro_batches(config)
  try:
    grpo_cfg = config_utils.config_from_mapping(grpo.GRPOConfig, gcfg)
  except (ValueError, TypeError) as e:
    raise config_utils.ConfigError(f"rl.grpo: {e}") from None
  if grpo_cfg.tis_cap > 0 and int(rl.passes) != 1:
    raise config_utils.ConfigError(
        f"rl.grpo.tis_cap={grpo_cfg.tis_cap} needs rl.passes=1 (got {rl.passes}): the "
        "trainer's log-probs at the sampler's parameters are the first pass's")
  t = state_lib.build_train_state(config, mesh, optimizer, model_cfg, workdir)
  step_fn = grpo.make_train_step(t.graphdef, optimizer, grpo_cfg, mesh,
                                 lengths=buckets)
  # beta > 0: the k3 KL pulls towards the policy RL started from, frozen (the
  # same parameters after a resume); beta = 0 never builds it.
  ref_state = (state_lib.initial_model_state(config, mesh, model_cfg)
               if grpo_cfg.beta > 0 else None)
  primary = jax.process_index() == 0
  meta = run_meta(config, grpo_cfg.levels)
  try:
    start_it, history = resume_history(config, grpo_cfg.levels, t.data_state,
                                       workdir, primary)
  except config_utils.ConfigError:
    t.checkpointer.close()
    raise
  if primary:
    fileio.write_json_atomic(os.path.join(workdir, rl_report.RUN_META_FILE), meta)
  print(f"rl: {t.source} at iteration {start_it}/{rl.iterations} (step {t.step}); "
        f"{rl.tasks_per_iter} tasks x {rl.group_size} samples, levels "
        f"{grpo_cfg.levels}, strategy {rl.strategy}; workdir {workdir}", flush=True)

  policy = policies.JaxPolicy(nnx.merge(t.graphdef, t.state), fmt, max_len=rl.max_len,
                              max_turn_tokens=rl.max_turn_tokens,
                              temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p,
                              draw=str(rl.get("draw", "gumbel")))
  writer = metrics_lib.MetricsWriter(
      workdir, total_steps=rl.iterations, start_step=start_it,
      tensorboard=config.tensorboard, progress=False, is_primary=primary)

  def log(it: int, metrics: dict, prefix: str = "train") -> None:
    writer.write(it, metrics, prefix)
    history.append({"step": int(it), **{f"{prefix}/{k}": float(v)
                                        for k, v in metrics.items()}})

  g = rl.group_size
  # The observation format the SFT demonstrations were built with.
  obs_format = str(config.data.get("obs_format", "full"))
  env = toolenv.VectorToolEnv(train_catalog, num_envs=rl.tasks_per_iter * g, obs_format=obs_format,
                              **toolenv.oracle.env_options(rl.strategy))
  result = last_eval(history)
  behaviour: list[str] = []
  try:
    if start_it == 0 and rl.eval_every:
      per_task: list[dict] = []
      before = greedy.greedy_eval(policy, fmt, catalog, eval_tasks, rcfg, rl.strategy,
                           obs_format=obs_format, per_task=per_task)
      if primary:
        greedy.write_per_task(os.path.join(workdir, rl_report.EVAL_BEFORE_FILE), per_task)
      log(0, before, "eval")
      print(f"rl: held-out greedy success before RL {before['success']:.3f}", flush=True)
    for it in range(start_it + 1, rl.iterations + 1):
      t0 = time.perf_counter()
      tasks = rl_tasks.sample_tasks(train_gen, it, rl.tasks_per_iter, kinds, rl, history,
                                    seed=config.seed)
      group_tasks = [task for task in tasks for _ in range(g)]
      group_ids = [j for j in range(len(tasks)) for _ in range(g)]
      policy.update_model(nnx.merge(t.graphdef, t.state))
      res = rollout.run_rollout(policy, env, group_tasks, fmt, rcfg, group_ids=group_ids,
                                seed=iteration_seed(t.rng, it))
      t_roll = time.perf_counter() - t0
      batch = res.trajectory_batch()
      if rl.token_budget:
        batch, _ = batch_lib.apply_token_budget(batch, rl.token_budget)
      batch = jax.device_put(batch, ts.data_sharding(batch, mesh))
      outs = []
      for k in range(rl.passes):
        t.state = state_lib.maybe_inject_nan(config, t.step + 1, t.state)
        rng = jax.random.fold_in(jax.random.fold_in(t.rng, it), k)
        t.state, t.opt_state, out = step_fn(t.state, t.opt_state, batch, rng,
                                            ref_state=ref_state)
        t.step += 1
        outs.append(out)
      # Every pass is checked (a pass's metrics are a few scalars; the
      # rollout already synchronised), before anything is logged or saved.
      m = {}
      for k, out in enumerate(outs):
        m = metrics_lib.to_floats(out)
        metrics_lib.check_finite(
            t.step - len(outs) + 1 + k, m, t.checkpointer.last_complete,
            context=f"rl iteration {it}, pass {k + 1}/{rl.passes}")
      arr = res.arrays
      m.update({
          "rollout/success": float(np.mean([e["success"] for e in res.episodes])),
          "rollout/traj_reward": float(np.mean(arr["traj_reward"])),
          "rollout/phase_reward": float(np.sum(arr["phase_reward"] * arr["phase_mask"])
                                        / max(1.0, np.sum(arr["phase_mask"]))),
          "rollout/step_reward": float(np.sum(arr["step_reward"] * arr["step_mask"])
                                       / max(1.0, np.sum(arr["step_mask"]))),
          "rollout/turns": float(np.mean([e["turns"] for e in res.episodes])),
          "rollout/episode_tokens": float(np.mean(arr["seq_len"])),
          "rollout/episode_tokens_max": float(np.max(arr["seq_len"])),
          "time/rollout_s": t_roll, "time/iteration_s": time.perf_counter() - t0})
      m.update(rl_tasks.kind_rollout_metrics(group_tasks, res.episodes))
      m["rollout/traj_spread_groups"] = traj_spread_fraction(arr["traj_reward"], g)
      m.update(behaviour_metrics(res.episodes))
      # The sampler/trainer log-prob gap at the first pass (same parameters).
      first = metrics_lib.to_floats(outs[0]) if outs else {}
      for k in ("logp_gap_mean", "logp_gap_max"):
        if k in first:
          m[f"rollout/{k}"] = first[k]
      log(it, m)
      n_groups = len(arr["traj_reward"]) // g
      print(f"rl: it {it}/{rl.iterations} success {m['rollout/success']:.2f} "
            f"spread {round(m['rollout/traj_spread_groups'] * n_groups)}/{n_groups} "
            f"R {m['rollout/traj_reward']:.3f} phase {m['rollout/phase_reward']:.3f} "
            f"step {m['rollout/step_reward']:.3f} loss {m.get('loss', float('nan')):.4f} "
            f"parse {int(m['rollout/parse_failures'])}/{int(m['rollout/steps'])} "
            f"gap {m.get('rollout/logp_gap_max', float('nan')):.1e} "
            f"({m['time/iteration_s']:.1f}s)" + no_update_note(m), flush=True)
      final = it == rl.iterations
      if (rl.eval_every and it % rl.eval_every == 0) or final:
        per_task = []
        result = greedy.greedy_eval(policy_with(policy, nnx.merge(t.graphdef, t.state)), fmt,
                             catalog, eval_tasks, rcfg, rl.strategy, obs_format=obs_format,
                             per_task=per_task)
        if primary:
          # Every evaluation's per-task records (paired tests along a long run).
          greedy.write_per_task(os.path.join(workdir, f"eval_it{it}.jsonl"), per_task)
        if primary and final:
          greedy.write_per_task(os.path.join(workdir, rl_report.EVAL_AFTER_FILE), per_task)
          behaviour = greedy.behaviour_table(per_task, greedy.oracle_records(eval_tasks, rl.strategy))
        log(it, result, "eval")
        print(f"rl: held-out greedy success {result['success']:.3f} "
              f"(multi-tool {result.get('success_multi_tool', 0.0):.3f})", flush=True)
      stop = bool(interrupts.requested())
      if final or stop or (rl.ckpt_every > 0 and it % rl.ckpt_every == 0):
        # The history rides in the checkpoint's JSON: the curve on disk can
        # always be rebuilt to match the parameters it resumes from.
        t.checkpointer.save(
            t.step, t.state, t.opt_state, rng=t.rng, force=True,
            data_state={"iteration": it, "meta": meta, "history": list(history)})
      if stop and not final:
        raise interrupts.Interrupted(f"at rl iteration {it}",
                                     f"resume from iteration {it}")
  finally:
    writer.close()
    t.checkpointer.close()
  if not primary:
    return result
  curve = rl_report.save_curve(workdir)
  if curve:
    print(f"rl: learning curve {curve}", flush=True)
  fileio.write_json_atomic(os.path.join(workdir, "rl_eval.json"), result)
  paired = rl_report.paired_before_after(workdir)
  if paired:
    print("rl: " + paired_lib.format_paired(paired, ("before", "after")), flush=True)
  for line in rl_report.cause_summary_lines(workdir):
    print("rl: " + line, flush=True)
  report = rl_report.write_report(workdir, history, result, paired, meta, behaviour)
  print(f"rl: report {report}", flush=True)
  return result


def last_eval(history: Sequence[dict]) -> dict[str, float]:
  """The newest evaluation in ``history`` (metric names without the prefix)."""
  for rec in reversed(history):
    ev = {k[len("eval/"):]: v for k, v in rec.items() if k.startswith("eval/")}
    if ev:
      return ev
  return {}


def policy_with(policy, model):
  """``policy`` sampling from ``model`` (the current parameters)."""
  policy.update_model(model)
  return policy
