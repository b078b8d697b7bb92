"""The RL stage of `paraagent_jax.train` (``config.stage = "rl"``).

Each iteration:

1. draws ``rl.tasks_per_iter`` tasks from ToolEnv's train split (task number
   ``it * tasks_per_iter + j``, so a resumed run draws the same tasks);
2. rolls out ``rl.group_size`` samples of each with the *current* parameters
   (`paraagent_jax.paraact.rollout.run_rollout`, temperature ``rl.temperature``);
3. ToolEnv scores them at three levels; the rollout packs a `TrajectoryBatch`;
4. takes ``rl.passes`` GRPO steps over it (`paraagent_jax.rl.grpo`: the
   step/phase/trajectory-decoupled advantages are computed inside the jitted
   loss; ``rl.grpo.levels=("traj",)`` is plain GRPO);
5. logs success and each level's mean reward (``metrics.jsonl``), evaluates
   greedily on held-out test tasks every ``rl.eval_every`` iterations, and
   checkpoints (model, optimizer, step, iteration, RNG) with Orbax.

The run resumes from the workdir's last complete checkpoint; inside the
pipeline ``config.init_from`` points at the SFT stage. At the end the learning
curve is saved as ``rl_curve.png`` next to ``metrics.jsonl``.

Keep this module light at import time: `config_utils.train_defaults` imports
it for `rl_defaults`.
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any, Sequence

import ml_collections

KINDS = "single,parallel,chain,fanout,mixed"


def rl_defaults() -> ml_collections.ConfigDict:
  """Defaults of ``config.rl`` (typed keys for command-line overrides)."""
  c = ml_collections.ConfigDict()
  c.catalog = "procedural"
  c.catalog_seed = 0
  c.task_seed = 0
  c.kinds = KINDS
  c.strategy = "paraact"
  c.tokenizer = ""              # "" = the SFT data's tokenizer
  c.iterations = 20
  c.tasks_per_iter = 4
  c.group_size = 4
  c.passes = 1                  # optimisation passes (K) over each batch
  c.temperature = 1.0
  c.top_k = 0
  c.top_p = 1.0
  c.max_turns = 8
  c.max_turn_tokens = 160
  c.max_len = 1536
  c.max_obs_tokens = 256
  c.eval_every = 5              # iterations; 0 = only at the end
  c.eval_tasks = 40             # held-out test tasks (kinds round robin)
  c.token_budget = 0            # max real tokens per batch; 0 = no budget
  c.grpo = ml_collections.ConfigDict(dict(
      clip_eps_low=0.2, clip_eps_high=0.28, beta=0.0, entropy_coef=0.0,
      aggregation="token_mean", levels="traj,phase,step", normalize="mean_std",
      drop_no_spread_groups=True, mask_truncated=False))
  return c


def _levels(spec: Any) -> tuple[str, ...]:
  if isinstance(spec, str):
    return tuple(s.strip() for s in spec.split(",") if s.strip())
  return tuple(spec)


def tokenizer_path(config) -> str:
  """Where the policy's tokenizer lives (rl.tokenizer, data.tokenizer, data_dir)."""
  for p in (config.rl.get("tokenizer", ""), config.data.get("tokenizer", "")):
    if p:
      return p
  d = config.data.get("data_dir", "")
  if d:
    return os.path.join(d, "tokenizer")
  if config.init_from:
    return os.path.join(config.init_from, "tokenizer")
  return ""


def draw_tasks(gen, split: str, start: int, n: int, kinds: Sequence[str]):
  """Tasks ``start .. start+n-1`` of ``split`` (kinds round robin)."""
  return [gen.task(i, split, kinds[i % len(kinds)]) for i in range(start, start + n)]


def rollout_config(rl):
  from paraagent_jax.paraact import rollout  # pylint: disable=g-import-not-at-top
  return rollout.RolloutConfig(max_turns=rl.max_turns, max_turn_tokens=rl.max_turn_tokens,
                               max_len=rl.max_len, max_obs_tokens=rl.max_obs_tokens)


def greedy_eval(policy, fmt, catalog, tasks, rcfg, strategy: str = "paraact",
                seed: int = 0) -> dict[str, float]:
  """Greedy success per task kind (and overall), turns, calls per execute step."""
  import toolenv  # pylint: disable=g-import-not-at-top
  from paraagent_jax.paraact import rollout  # pylint: disable=g-import-not-at-top
  env = toolenv.VectorToolEnv(catalog, num_envs=len(tasks),
                              **toolenv.oracle.env_options(strategy))
  temp = policy.temperature
  policy.temperature = 0.0
  try:
    res = rollout.run_rollout(policy, env, tasks, fmt, rcfg, seed=seed)
  finally:
    policy.temperature = temp
  return summarize(tasks, res.episodes)


def summarize(tasks, episodes) -> dict[str, float]:
  """Success per kind, multi-tool success, mean turns and calls per execute step."""
  import toolenv  # pylint: disable=g-import-not-at-top
  by = collections.defaultdict(list)
  for t, e in zip(tasks, episodes):
    by[t.kind].append(float(e["success"]))
  out = {f"success_{k}": sum(v) / len(v) for k, v in sorted(by.items())}
  out["success"] = sum(float(e["success"]) for e in episodes) / max(1, len(episodes))
  multi = [float(e["success"]) for t, e in zip(tasks, episodes)
           if t.kind in toolenv.MULTI_TOOL_KINDS]
  if multi:
    out["success_multi_tool"] = sum(multi) / len(multi)
  out["turns"] = sum(e["turns"] for e in episodes) / max(1, len(episodes))
  per_step = [n for e in episodes for n in e.get("calls_per_step", [])]
  out["calls_per_execute_step"] = sum(per_step) / max(1, len(per_step))
  return out


def save_curve(workdir: str) -> str | None:
  """Plots success and each level's mean reward per iteration to rl_curve.png."""
  from paraagent_jax import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  records = metrics_lib.read_jsonl(path)
  rows = [r for r in records if "train/rollout/success" in r]
  if not rows:
    return None
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
  it = [r["step"] for r in rows]   # the RL stage logs one record per iteration
  axes[0].plot(it, [r["train/rollout/success"] for r in rows], label="rollout success")
  ev = [r for r in records if "eval/success" in r]
  if ev:
    axes[0].plot([r["step"] for r in ev], [r["eval/success"] for r in ev], "o-",
                 label="held-out greedy success")
  axes[0].set_xlabel("iteration")
  axes[0].legend()
  for key in ("traj_reward", "phase_reward", "step_reward"):
    axes[1].plot(it, [r.get(f"train/rollout/{key}", float("nan")) for r in rows], label=key)
  axes[1].set_xlabel("iteration")
  axes[1].legend()
  fig.tight_layout()
  out = os.path.join(workdir, "rl_curve.png")
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out


def run_rl(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs the RL stage in ``workdir``; returns the final evaluation metrics."""
  # pylint: disable=g-import-not-at-top
  import jax
  import numpy as np
  from flax import nnx
  import toolenv
  from paraagent_jax import config_utils
  from paraagent_jax import metrics as metrics_lib
  from paraagent_jax import tokenizer as tok_lib
  from paraagent_jax import train as train_lib
  from paraagent_jax.rl import grpo
  from paraagent_jax.rl import train_step as ts
  # pylint: enable=g-import-not-at-top
  rl = config.rl
  tpath = tokenizer_path(config)
  if not tpath or not os.path.exists(tpath):
    raise config_utils.ConfigError(
        f"rl: no tokenizer at {tpath!r}; set rl.tokenizer or data.data_dir")
  tok = tok_lib.load_tokenizer(tpath)
  from paraagent_jax.paraact import chat_format, policies, rollout  # pylint: disable=g-import-not-at-top
  fmt = chat_format.ChatFormat(tok, strategy=rl.strategy)
  kinds = [k for k in rl.kinds.split(",") if k]
  catalog = toolenv.load_catalog(rl.catalog, seed=rl.catalog_seed)
  gen = toolenv.TaskGenerator(catalog, seed=rl.task_seed)
  eval_tasks = draw_tasks(gen, "test", 0, rl.eval_tasks, kinds)
  rcfg = rollout_config(rl)

  train_lib.check_init_from(config.init_from)
  mesh = train_lib.make_mesh(config)
  model_cfg = train_lib.model_config(config, vocab_size=len(tok))
  opt_cfg = train_lib.optimizer_config(config)
  optimizer = ts.make_optimizer(opt_cfg)
  t = train_lib.build_train_state(config, mesh, optimizer, model_cfg, workdir)
  gcfg = dict(rl.grpo.to_dict())
  gcfg["levels"] = _levels(gcfg.get("levels", "traj,phase,step"))
  gcfg["num_micro_batches"] = config.num_micro_batches
  step_fn = grpo.make_train_step(t.graphdef, optimizer, gcfg, mesh)
  start_it = int((t.data_state or {}).get("iteration", 0))
  print(f"rl: {t.source} at iteration {start_it}/{rl.iterations} (step {t.step}); "
        f"{rl.tasks_per_iter} tasks x {rl.group_size} samples, levels "
        f"{gcfg['levels']}, strategy {rl.strategy}; workdir {workdir}", flush=True)

  policy = policies.JaxPolicy(nnx.merge(t.graphdef, t.state), fmt, max_len=rl.max_len,
                              max_turn_tokens=rl.max_turn_tokens,
                              temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p)
  writer = metrics_lib.MetricsWriter(
      workdir, total_steps=rl.iterations, start_step=start_it,
      tensorboard=config.tensorboard, progress=False,
      is_primary=jax.process_index() == 0)
  g = rl.group_size
  env = toolenv.VectorToolEnv(catalog, num_envs=rl.tasks_per_iter * g,
                              **toolenv.oracle.env_options(rl.strategy))
  result: dict[str, float] = {}
  try:
    if start_it == 0 and rl.eval_every:
      before = greedy_eval(policy, fmt, catalog, eval_tasks, rcfg, rl.strategy)
      writer.write(0, before, "eval")
      print(f"rl: held-out greedy success before RL {before['success']:.3f}", flush=True)
    for it in range(start_it + 1, rl.iterations + 1):
      t0 = time.perf_counter()
      tasks = draw_tasks(gen, "train", (it - 1) * rl.tasks_per_iter, rl.tasks_per_iter, kinds)
      group_tasks = [task for task in tasks for _ in range(g)]
      group_ids = [j for j in range(len(tasks)) for _ in range(g)]
      policy.update_model(nnx.merge(t.graphdef, t.state))
      res = rollout.run_rollout(policy, env, group_tasks, fmt, rcfg, group_ids=group_ids,
                                seed=config.seed * 100_003 + it)
      t_roll = time.perf_counter() - t0
      batch = res.trajectory_batch()
      if rl.token_budget:
        from paraagent_jax.rl import batch as batch_lib  # pylint: disable=g-import-not-at-top
        batch, _ = batch_lib.apply_token_budget(batch, rl.token_budget)
      batch = jax.device_put(batch, ts.data_sharding(batch, mesh))
      out = {}
      for k in range(rl.passes):
        rng = jax.random.fold_in(jax.random.fold_in(t.rng, it), k)
        t.state, t.opt_state, out = step_fn(t.state, t.opt_state, batch, rng)
        t.step += 1
      m = metrics_lib.to_floats(out)
      metrics_lib.check_finite(t.step, m, t.checkpointer.last_complete)
      arr = res.arrays
      m.update({
          "rollout/success": float(np.mean([e["success"] for e in res.episodes])),
          "rollout/traj_reward": float(np.mean(arr["traj_reward"])),
          "rollout/phase_reward": float(np.sum(arr["phase_reward"] * arr["phase_mask"])
                                        / max(1.0, np.sum(arr["phase_mask"]))),
          "rollout/step_reward": float(np.sum(arr["step_reward"] * arr["step_mask"])
                                       / max(1.0, np.sum(arr["step_mask"]))),
          "rollout/turns": float(np.mean([e["turns"] for e in res.episodes])),
          "time/rollout_s": t_roll, "time/iteration_s": time.perf_counter() - t0})
      writer.write(it, m)
      print(f"rl: it {it}/{rl.iterations} success {m['rollout/success']:.2f} "
            f"R {m['rollout/traj_reward']:.3f} phase {m['rollout/phase_reward']:.3f} "
            f"step {m['rollout/step_reward']:.3f} loss {m.get('loss', float('nan')):.4f} "
            f"({m['time/iteration_s']:.1f}s)", flush=True)
      final = it == rl.iterations
      if (rl.eval_every and it % rl.eval_every == 0) or final:
        result = greedy_eval(policy_with(policy, nnx.merge(t.graphdef, t.state)), fmt,
                             catalog, eval_tasks, rcfg, rl.strategy)
        writer.write(it, result, "eval")
        print(f"rl: held-out greedy success {result['success']:.3f} "
              f"(multi-tool {result.get('success_multi_tool', 0.0):.3f})", flush=True)
      t.checkpointer.save(t.step, t.state, t.opt_state, data_state={"iteration": it},
                          rng=t.rng, force=final)
  finally:
    writer.close()
    t.checkpointer.close()
  curve = save_curve(workdir)
  if curve:
    print(f"rl: learning curve {curve}", flush=True)
  with open(os.path.join(workdir, "rl_eval.json"), "w") as f:
    json.dump(result, f, indent=1)
  return result


def policy_with(policy, model):
  """``policy`` sampling from ``model`` (the current parameters)."""
  policy.update_model(model)
  return policy
