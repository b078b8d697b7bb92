"""The RL stage of `paraagent_jax.train` (``config.stage = "rl"``).

Each iteration:

1. draws ``rl.tasks_per_iter`` tasks from ToolEnv's train split (task number
   ``it * tasks_per_iter + j``, so a resumed run draws the same tasks); kinds
   round robin, or (``rl.task_sampling="pass_rate"``) in proportion to the
   chance that a group of that kind has both successes and failures, from
   each kind's recent rollout success (`kind_weights`);
2. rolls out ``rl.group_size`` samples of each with the *current* parameters
   (`paraagent_jax.paraact.rollout.run_rollout`, temperature ``rl.temperature``);
3. ToolEnv scores them at three levels; the rollout packs a `TrajectoryBatch`;
4. takes ``rl.passes`` GRPO steps over it (`paraagent_jax.rl.grpo`: the
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

from paraagent_jax import interrupts
from paraagent_jax.evaluation import paired as paired_lib

KINDS = "single,parallel,chain,fanout,mixed"
# fold_in tag separating the rollout seeds from the train-step keys.
ROLLOUT_STREAM = 0x5EED
RUN_META_FILE = "rl_run.json"
# Per-task greedy results on the held-out tasks before and after RL, and
# their paired comparison (`evaluation.paired`).
EVAL_BEFORE_FILE = "eval_before.jsonl"
EVAL_AFTER_FILE = "eval_after.jsonl"
PAIRED_FILE = "rl_paired.json"


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
  # "round_robin": kinds in turn. "pass_rate": kinds drawn with weight
  # 1 - p^G - (1-p)^G (the chance a group of G samples has spread in its
  # trajectory reward), p = the kind's rollout success over the last
  # sampling_window iterations (Beta(1, 1) prior), floor sampling_floor.
  c.task_sampling = "round_robin"
  c.sampling_window = 5
  c.sampling_floor = 0.05
  c.group_size = 4
  c.passes = 1                  # optimisation passes (K) over each batch
  c.temperature = 1.0
  c.top_k = 0
  c.top_p = 1.0
  c.max_turns = 8
  c.max_turn_tokens = 160
  c.max_len = 1536
  c.max_obs_tokens = 256
  # Token lengths of the update's micro-batches ("1024,1536"): episodes are
  # sorted by length and each micro-batch is padded to the smallest of these
  # (or max_len) that holds it, one compilation per length, the same update
  # (`train_step.build_sorted_train_step`). "" = one scan over micro-batches
  # of max_len rows.
  c.length_buckets = ""
  c.eval_every = 5              # iterations; 0 = only at the end
  c.eval_tasks = 40             # held-out test tasks (kinds round robin)
  c.ckpt_every = 1              # iterations between checkpoints (and the last)
  c.token_budget = 0            # max real tokens per batch; 0 = no budget
  c.num_micro_batches = 0       # RL step micro-batches; 0 = config.num_micro_batches
  # RL's own optimizer settings over config.optimizer (which a pipeline shares
  # with SFT): peak learning rate (0 = optimizer's), warmup (-1 = optimizer's)
  # and schedule ("" = optimizer's). The schedule's length is always RL's own
  # number of optimizer steps (iterations x passes).
  c.learning_rate = 0.0
  c.warmup_steps = -1
  c.schedule = ""
  c.grpo = ml_collections.ConfigDict(dict(
      clip_eps_low=0.2, clip_eps_high=0.28, beta=0.0, entropy_coef=0.0,
      aggregation="token_mean", levels="traj,phase,step", normalize="mean_std",
      drop_no_spread_groups=True, mask_truncated=False))
  return c


def length_buckets(rl) -> list[int]:
  """``rl.length_buckets`` as sorted update lengths ending at ``rl.max_len``
  ([] = no buckets), parsed like ``data.length_bucket``."""
  # pylint: disable=g-import-not-at-top
  from paraagent_jax import config_utils
  from paraagent_jax.data import demonstrations
  # pylint: enable=g-import-not-at-top
  spec = str(rl.get("length_buckets", "") or "")
  try:
    return demonstrations.bucket_lengths(spec, int(rl.max_len))
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
  import jax  # pylint: disable=g-import-not-at-top
  key = jax.random.fold_in(jax.random.fold_in(rng, ROLLOUT_STREAM), it)
  return int(jax.random.randint(key, (), 0, 2**31 - 1))


def run_meta(config, levels: Sequence[str]) -> dict[str, Any]:
  """What identifies an RL run: stored in its checkpoints and ``rl_run.json``."""
  rl = config.rl
  return {"levels": list(levels), "normalize": rl.grpo.normalize,
          "strategy": rl.strategy, "group_size": int(rl.group_size),
          "tasks_per_iter": int(rl.tasks_per_iter), "passes": int(rl.passes),
          "task_sampling": task_sampling(rl),
          "temperature": float(rl.temperature), "seed": int(config.seed),
          "init_from": config.init_from}


def write_json_atomic(path: str, obj: Any) -> None:
  """Writes JSON via a temporary file and a rename (never half a file)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, default=str)
  os.replace(tmp, path)


def resume_history(config, levels, data_state, workdir: str,
                   primary: bool = True) -> tuple[int, list[dict]]:
  """(iteration, learning-curve records) of the restored checkpoint.

  Rewrites ``metrics.jsonl`` to exactly those records, so records of
  iterations after the checkpoint (written before a kill) disappear and
  none is duplicated.

  Raises:
    ConfigError: the checkpoint was trained with other advantage levels.
  """
  from paraagent_jax import config_utils  # pylint: disable=g-import-not-at-top
  from paraagent_jax import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
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
    os.makedirs(workdir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in history)
    os.replace(tmp, path)
  return start_it, history


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


TASK_SAMPLING = ("round_robin", "pass_rate")


def kind_weights(history: Sequence[dict], kinds: Sequence[str], group_size: int,
                 window: int, floor: float) -> dict[str, float]:
  """Sampling weight of each kind from its recent rollout success.

  ``p`` is the posterior mean success of the kind over the last ``window``
  iterations of ``history`` (``train/rollout/success_<kind>`` and
  ``train/rollout/n_<kind>``; a Beta(1, 1) prior, so an unseen kind has
  p = 0.5); the weight is ``1 - p^G - (1-p)^G``, the chance that a group of
  ``G`` samples has both a success and a failure, at least ``floor``.
  """
  rows = [r for r in history if "train/rollout/success" in r][-window:] if window > 0 else []
  out = {}
  for k in kinds:
    n = sum(r.get(f"train/rollout/n_{k}", 0.0) for r in rows)
    s = sum(r.get(f"train/rollout/success_{k}", 0.0) * r.get(f"train/rollout/n_{k}", 0.0)
            for r in rows)
    p = (s + 1.0) / (n + 2.0)
    out[k] = max(floor, 1.0 - p ** group_size - (1.0 - p) ** group_size)
  return out


def task_sampling(rl) -> str:
  """``rl.task_sampling``, checked (a `ConfigError` names the choices)."""
  mode = rl.get("task_sampling", "round_robin")
  if mode not in TASK_SAMPLING:
    from paraagent_jax import config_utils  # pylint: disable=g-import-not-at-top
    raise config_utils.ConfigError(
        f"rl.task_sampling={mode!r}; expected one of {TASK_SAMPLING}")
  return mode


def sample_tasks(gen, it: int, n: int, kinds: Sequence[str], rl, history: Sequence[dict],
                 seed: int = 0):
  """The ``n`` train tasks of iteration ``it`` (1-based), per ``rl.task_sampling``.

  Task numbers are ``(it - 1) * n + j`` either way; with "pass_rate" the kind
  of slot ``j`` is drawn from `kind_weights` with a generator seeded by
  ``seed`` and ``it``, so a resumed run (whose history is restored) draws the
  same tasks.
  """
  import random  # pylint: disable=g-import-not-at-top
  mode = task_sampling(rl)
  start = (it - 1) * n
  if mode == "round_robin":
    return draw_tasks(gen, "train", start, n, kinds)
  w = kind_weights(history, kinds, int(rl.group_size), int(rl.get("sampling_window", 5)),
                   float(rl.get("sampling_floor", 0.05)))
  rng = random.Random(f"rl-kinds-{seed}-{it}")
  chosen = rng.choices(list(kinds), weights=[w[k] for k in kinds], k=n)
  return [gen.task(start + j, "train", k) for j, k in enumerate(chosen)]


def kind_rollout_metrics(tasks, episodes) -> dict[str, float]:
  """``rollout/success_<kind>`` and ``rollout/n_<kind>`` of one iteration."""
  by = collections.defaultdict(list)
  for t, e in zip(tasks, episodes):
    by[t.kind].append(float(e["success"]))
  out = {}
  for k, v in sorted(by.items()):
    out[f"rollout/success_{k}"] = sum(v) / len(v)
    out[f"rollout/n_{k}"] = float(len(v))
  return out


def traj_spread_fraction(traj_reward, group_size: int) -> float:
  """Fraction of groups whose trajectory rewards are not all equal.

  Episodes are laid out group by group (``group_size`` consecutive rows);
  only these groups give plain GRPO (``levels=traj``) a nonzero advantage.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  r = np.asarray(traj_reward, np.float64).reshape(-1, group_size)
  return float(np.mean(r.max(axis=1) - r.min(axis=1) > 1e-9))


def no_update_note(m: dict) -> str:
  """A console note when a batch gave the optimiser nothing to learn from."""
  if m.get("dropped_episode_frac", 0.0) >= 1.0:
    return ("; no group had reward spread at any enabled level: every episode "
            "was dropped, no update")
  return ""


def rollout_config(rl):
  from paraagent_jax.paraact import rollout  # pylint: disable=g-import-not-at-top
  return rollout.RolloutConfig(max_turns=rl.max_turns, max_turn_tokens=rl.max_turn_tokens,
                               max_len=rl.max_len, max_obs_tokens=rl.max_obs_tokens)


def greedy_eval(policy, fmt, catalog, tasks, rcfg, strategy: str = "paraact",
                seed: int = 0, obs_format: str = "full",
                per_task: list | None = None) -> dict[str, float]:
  """Greedy success per task kind (and overall), turns, calls per execute step.

  ``obs_format``: ToolEnv's observation format (``config.data.obs_format``,
  the one the demonstrations were built with). ``per_task``: if a list, one
  record per task is appended (``task_id``, ``kind``, ``success``,
  ``turns``), for paired comparisons (`evaluation.paired`).
  """
  import toolenv  # pylint: disable=g-import-not-at-top
  from paraagent_jax.paraact import rollout  # pylint: disable=g-import-not-at-top
  env = toolenv.VectorToolEnv(catalog, num_envs=len(tasks), obs_format=obs_format,
                              **toolenv.oracle.env_options(strategy))
  temp = policy.temperature
  policy.temperature = 0.0
  try:
    res = rollout.run_rollout(policy, env, tasks, fmt, rcfg, seed=seed)
  finally:
    policy.temperature = temp
  if per_task is not None:
    per_task.extend({"task_id": t.id, "kind": t.kind, "success": bool(e["success"]),
                     "turns": int(e["turns"]),
                     "calls_per_step": [int(n) for n in e.get("calls_per_step", [])],
                     "transcript": e.get("transcript", [])}
                    for t, e in zip(tasks, res.episodes))
  return summarize(tasks, res.episodes)


def behaviour_by_kind(records: Sequence[dict]) -> dict[str, tuple[float, float]]:
  """``{kind: (mean turns, calls per execute step)}`` of per-task records
  (``turns``, ``calls_per_step``: calls of each execute step)."""
  by = collections.defaultdict(list)
  for r in records:
    by[r["kind"]].append(r)
  out = {}
  for k, rs in sorted(by.items()):
    calls = [n for r in rs for n in r.get("calls_per_step", [])]
    out[k] = (sum(r["turns"] for r in rs) / len(rs), sum(calls) / max(1, len(calls)))
  return out


def oracle_records(tasks, strategy: str = "paraact") -> list[dict]:
  """Per-task records of the oracle's plan (`toolenv.oracle.solve`) of ``tasks``."""
  import toolenv  # pylint: disable=g-import-not-at-top
  out = []
  for t in tasks:
    steps = toolenv.oracle.solve(t, strategy)
    out.append({"task_id": t.id, "kind": t.kind, "success": True, "turns": len(steps),
                "calls_per_step": [len(s.calls) for s in steps if s.phase == "execute"]})
  return out


def behaviour_table(policy_records: Sequence[dict], oracle_recs: Sequence[dict]) -> list[str]:
  """Markdown: mean turns and calls per execute step per kind, policy and oracle."""
  pol, orc = behaviour_by_kind(policy_records), behaviour_by_kind(oracle_recs)
  lines = ["| kind | turns (policy) | turns (oracle) | calls per execute step (policy) "
           "| calls per execute step (oracle) |", "|---|---|---|---|---|"]
  for k in sorted(set(pol) | set(orc)):
    p, o = pol.get(k, (float("nan"),) * 2), orc.get(k, (float("nan"),) * 2)
    lines.append(f"| {k} | {p[0]:.2f} | {o[0]:.2f} | {p[1]:.2f} | {o[1]:.2f} |")
  return lines


def write_per_task(path: str, records: Sequence[dict]) -> None:
  """Per-task evaluation records as JSON lines, atomically."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  os.replace(tmp, path)


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


def _running_mean(values, window: int) -> list[float]:
  """Mean of the last ``window`` values at each position (fewer at the start)."""
  out = []
  for i in range(len(values)):
    part = values[max(0, i - window + 1):i + 1]
    out.append(sum(part) / len(part))
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
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  it = [r["step"] for r in rows]   # the RL stage logs one record per iteration
  # Few iterations: markers, so single points show; many: the per-iteration
  # values thin, with their 5-iteration running mean over them.
  style = "o-" if len(rows) <= 20 else "-"
  succ = [r["train/rollout/success"] for r in rows]
  if len(rows) > 20:
    axes[0].plot(it, succ, lw=0.8, alpha=0.45, color="C0", label="rollout (sampled)")
    axes[0].plot(it, _running_mean(succ, 5), lw=2.0, color="C0",
                 label="rollout, 5-iteration mean")
  else:
    axes[0].plot(it, succ, style, color="C0", label="rollout (sampled)")
  ev = [r for r in records if "eval/success" in r]
  if ev:
    axes[0].plot([r["step"] for r in ev], [r["eval/success"] for r in ev], "o-",
                 color="C1", label="held-out greedy")
  # Success is a fraction: a fixed 0-1 axis, so 0% reads as 0%, not as an
  # axis squeezed around a flat line.
  axes[0].set_ylim(-0.02, 1.02)
  axes[0].set_title("task success")
  axes[0].set_ylabel("fraction of tasks solved")
  for key in ("traj_reward", "phase_reward", "step_reward"):
    axes[1].plot(it, [r.get(f"train/rollout/{key}", float("nan")) for r in rows],
                 style, label=key.split("_")[0])
  axes[1].axhline(0.0, color="0.7", lw=0.8, zorder=0)
  axes[1].set_title("mean reward per level (sampled episodes)")
  axes[1].set_ylabel("reward")
  for ax in axes:
    ax.set_xlabel("RL iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    # Legends below the axes: never over the data.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
  meta_path = os.path.join(workdir, RUN_META_FILE)
  levels = []
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      levels = json.load(f).get("levels", [])
  fig.suptitle("RL learning curve" + (f" (GRPO advantage levels: {', '.join(levels)})"
                                      if levels else ""))
  fig.tight_layout()
  out = os.path.join(workdir, "rl_curve.png")
  tmp = os.path.join(workdir, "rl_curve.tmp.png")
  fig.savefig(tmp, dpi=100)
  os.replace(tmp, out)
  plt.close(fig)
  return out


def rl_optimizer_config(config):
  """``config.optimizer`` with RL's own overrides (``rl.learning_rate``,
  ``rl.warmup_steps``, ``rl.schedule``) and RL's number of steps."""
  # pylint: disable=g-import-not-at-top
  from paraagent_jax import config_utils
  from paraagent_jax.rl import train_step as ts
  rl = config.rl
  values = dict(config.optimizer)
  if rl.get("learning_rate", 0.0):
    values["learning_rate"] = float(rl.learning_rate)
  if rl.get("warmup_steps", -1) >= 0:
    values["warmup_steps"] = int(rl.warmup_steps)
  if rl.get("schedule", ""):
    values["schedule"] = str(rl.schedule)
  if values.get("schedule", "cosine") not in ts.SCHEDULES:
    raise config_utils.ConfigError(f"optimizer (rl): schedule={values['schedule']!r}; "
                                   f"choose from {ts.SCHEDULES}")
  values["total_steps"] = max(1, int(rl.iterations) * int(rl.passes))
  values["warmup_steps"] = min(int(values.get("warmup_steps", 0)), values["total_steps"] - 1)
  try:
    return ts.config_from_mapping(ts.OptimizerConfig, values)
  except (ValueError, TypeError) as e:
    raise config_utils.ConfigError(f"optimizer (rl): {e}") from None


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
  task_sampling(rl)   # checked before the evaluation, not at iteration 1
  buckets = length_buckets(rl)
  tpath = tokenizer_path(config)
  if not tpath or not os.path.exists(tpath):
    raise config_utils.ConfigError(
        f"rl: no tokenizer at {tpath!r}; set rl.tokenizer or data.data_dir")
  tok = tok_lib.load_tokenizer(tpath)
  # pylint: disable-next=g-import-not-at-top
  from paraagent_jax.paraact import chat_format, policies, rollout
  fmt = chat_format.ChatFormat(tok, strategy=rl.strategy)
  kinds = [k for k in rl.kinds.split(",") if k]
  catalog = toolenv.load_catalog(rl.catalog, seed=rl.catalog_seed)
  gen = toolenv.TaskGenerator(catalog, seed=rl.task_seed)
  eval_tasks = draw_tasks(gen, "test", 0, rl.eval_tasks, kinds)
  rcfg = rollout_config(rl)

  train_lib.check_init_from(config.init_from)
  mesh = train_lib.make_mesh(config)
  model_cfg = train_lib.model_config(config, vocab_size=len(tok))
  opt_cfg = rl_optimizer_config(config)
  optimizer = ts.make_optimizer(opt_cfg)
  gcfg = dict(rl.grpo.to_dict())
  gcfg["levels"] = _levels(gcfg.get("levels", "traj,phase,step"))
  # RL batches (groups x full episodes) are larger than SFT's: their own
  # micro-batching bounds the step's memory (0 = the SFT setting).
  gcfg["num_micro_batches"] = int(rl.get("num_micro_batches", 0)) or config.num_micro_batches
  try:
    grpo_cfg = ts.config_from_mapping(grpo.GRPOConfig, gcfg)
  except (ValueError, TypeError) as e:
    raise config_utils.ConfigError(f"rl.grpo: {e}") from None
  t = train_lib.build_train_state(config, mesh, optimizer, model_cfg, workdir)
  step_fn = grpo.make_train_step(t.graphdef, optimizer, grpo_cfg, mesh,
                                 lengths=buckets)
  # beta > 0: the k3 KL pulls towards the policy RL started from, frozen (the
  # same parameters after a resume); beta = 0 never builds it.
  ref_state = (train_lib.initial_model_state(config, mesh, model_cfg)
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
    write_json_atomic(os.path.join(workdir, RUN_META_FILE), meta)
  print(f"rl: {t.source} at iteration {start_it}/{rl.iterations} (step {t.step}); "
        f"{rl.tasks_per_iter} tasks x {rl.group_size} samples, levels "
        f"{grpo_cfg.levels}, strategy {rl.strategy}; workdir {workdir}", flush=True)

  policy = policies.JaxPolicy(nnx.merge(t.graphdef, t.state), fmt, max_len=rl.max_len,
                              max_turn_tokens=rl.max_turn_tokens,
                              temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p)
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
  env = toolenv.VectorToolEnv(catalog, num_envs=rl.tasks_per_iter * g, obs_format=obs_format,
                              **toolenv.oracle.env_options(rl.strategy))
  result = last_eval(history)
  behaviour: list[str] = []
  try:
    if start_it == 0 and rl.eval_every:
      per_task: list[dict] = []
      before = greedy_eval(policy, fmt, catalog, eval_tasks, rcfg, rl.strategy,
                           obs_format=obs_format, per_task=per_task)
      if primary:
        write_per_task(os.path.join(workdir, EVAL_BEFORE_FILE), per_task)
      log(0, before, "eval")
      print(f"rl: held-out greedy success before RL {before['success']:.3f}", flush=True)
    for it in range(start_it + 1, rl.iterations + 1):
      t0 = time.perf_counter()
      tasks = sample_tasks(gen, it, rl.tasks_per_iter, kinds, rl, history, seed=config.seed)
      group_tasks = [task for task in tasks for _ in range(g)]
      group_ids = [j for j in range(len(tasks)) for _ in range(g)]
      policy.update_model(nnx.merge(t.graphdef, t.state))
      res = rollout.run_rollout(policy, env, group_tasks, fmt, rcfg, group_ids=group_ids,
                                seed=iteration_seed(t.rng, it))
      t_roll = time.perf_counter() - t0
      batch = res.trajectory_batch()
      if rl.token_budget:
        from paraagent_jax.rl import batch as batch_lib  # pylint: disable=g-import-not-at-top
        batch, _ = batch_lib.apply_token_budget(batch, rl.token_budget)
      batch = jax.device_put(batch, ts.data_sharding(batch, mesh))
      outs = []
      for k in range(rl.passes):
        t.state = train_lib.maybe_inject_nan(config, t.step + 1, t.state)
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
      m.update(kind_rollout_metrics(group_tasks, res.episodes))
      m["rollout/traj_spread_groups"] = traj_spread_fraction(arr["traj_reward"], g)
      log(it, m)
      n_groups = len(arr["traj_reward"]) // g
      print(f"rl: it {it}/{rl.iterations} success {m['rollout/success']:.2f} "
            f"spread {round(m['rollout/traj_spread_groups'] * n_groups)}/{n_groups} "
            f"R {m['rollout/traj_reward']:.3f} phase {m['rollout/phase_reward']:.3f} "
            f"step {m['rollout/step_reward']:.3f} loss {m.get('loss', float('nan')):.4f} "
            f"({m['time/iteration_s']:.1f}s)" + no_update_note(m), flush=True)
      final = it == rl.iterations
      if (rl.eval_every and it % rl.eval_every == 0) or final:
        per_task = []
        result = greedy_eval(policy_with(policy, nnx.merge(t.graphdef, t.state)), fmt,
                             catalog, eval_tasks, rcfg, rl.strategy, obs_format=obs_format,
                             per_task=per_task)
        if primary and final:
          write_per_task(os.path.join(workdir, EVAL_AFTER_FILE), per_task)
          behaviour = behaviour_table(per_task, oracle_records(eval_tasks, rl.strategy))
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
  curve = save_curve(workdir)
  if curve:
    print(f"rl: learning curve {curve}", flush=True)
  write_json_atomic(os.path.join(workdir, "rl_eval.json"), result)
  paired = paired_before_after(workdir)
  if paired:
    print("rl: " + paired_lib.format_paired(paired, ("before", "after")), flush=True)
  report = write_report(workdir, history, result, paired, meta, behaviour)
  print(f"rl: report {report}", flush=True)
  return result


# rl_curve.jsonl field <- metrics key.
CURVE_KEYS = {"success": "train/rollout/success", "traj_reward": "train/rollout/traj_reward",
              "phase_reward": "train/rollout/phase_reward",
              "step_reward": "train/rollout/step_reward",
              "dropped_episode_frac": "train/dropped_episode_frac",
              "traj_spread_groups": "train/rollout/traj_spread_groups",
              "eval_success": "eval/success"}


def write_report(workdir: str, history: Sequence[dict], after: dict,
                 paired: dict | None, meta: dict,
                 behaviour: Sequence[str] = ()) -> str:
  """``rl_report.md`` (before/after per kind, the paired comparison) and
  ``rl_curve.jsonl`` (success and each level's mean reward per iteration)."""
  by_it: dict[int, dict] = {}
  for r in history:   # a train and an eval record may share an iteration
    vals = {name: r[key] for name, key in CURVE_KEYS.items() if key in r}
    if vals:
      by_it.setdefault(int(r["step"]), {"iteration": int(r["step"])}).update(vals)
  curve = [by_it[i] for i in sorted(by_it)]
  curve_path = os.path.join(workdir, "rl_curve.jsonl")
  with open(curve_path + ".tmp", "w") as f:
    f.writelines(json.dumps(c) + "\n" for c in curve)
  os.replace(curve_path + ".tmp", curve_path)
  before = {}
  for r in history:
    if int(r["step"]) == 0 and "eval/success" in r:
      before = {k[len("eval/"):]: v for k, v in r.items() if k.startswith("eval/")}
  keys = sorted(k for k in after if k.startswith("success_"))
  lines = [f"# RL report ({', '.join(meta.get('levels', []))} advantages)", "",
           f"Started from `{meta.get('init_from') or 'scratch'}`; greedy ParaAct on the "
           "same held-out test tasks before and after RL.", "",
           "| metric | before RL | after RL |", "|---|---|---|"]
  for k in ["success"] + keys + ["turns", "calls_per_execute_step"]:
    b = before.get(k)
    lines.append(f"| {k} | {'-' if b is None else f'{b:.3f}'} | {after.get(k, float('nan')):.3f} |")
  if paired:
    lines += ["", "Paired: " + paired_lib.format_paired(paired, ("before", "after")) + "."]
  if behaviour:
    lines += ["", "After RL, per kind, next to the oracle's plan of the same tasks:", "",
              *behaviour]
  lines += ["", "Learning curve: `rl_curve.png`, `rl_curve.jsonl` (per iteration: rollout "
            "success, mean trajectory / phase / step reward, held-out success where "
            "evaluated); every metric: `metrics.jsonl`.", ""]
  after_path = os.path.join(workdir, EVAL_AFTER_FILE)
  if os.path.exists(after_path):
    from paraagent_jax.evaluation import report as report_lib  # pylint: disable=g-import-not-at-top
    with open(after_path) as f:
      recs = [dict(json.loads(l), benchmark="toolenv", policy="after RL",
                   strategy=meta.get("strategy", "paraact")) for l in f if l.strip()]
    examples = report_lib.example_transcripts(recs)
    if examples:
      lines += ["After RL, one solved and one failed held-out transcript per kind "
                f"(all in `{EVAL_AFTER_FILE}`; long turns cut):", ""]
      for ex in examples:
        lines += ["```", report_lib.format_transcript(ex, max_chars=600), "```", ""]
  path = os.path.join(workdir, "rl_report.md")
  with open(path + ".tmp", "w") as f:
    f.write("\n".join(lines))
  os.replace(path + ".tmp", path)
  return path


def paired_before_after(workdir: str) -> dict | None:
  """The paired comparison of the evaluations before and after RL.

  Written to ``rl_paired.json``; None when either per-task file is absent
  (``rl.eval_every=0`` skips the evaluation before RL).
  """
  files = [os.path.join(workdir, f) for f in (EVAL_BEFORE_FILE, EVAL_AFTER_FILE)]
  if not all(os.path.exists(f) for f in files):
    return None
  paired = paired_lib.paired_comparison(*(paired_lib.read_per_task(f) for f in files),
                                        names=("before", "after"))
  write_json_atomic(os.path.join(workdir, PAIRED_FILE), paired)
  return paired


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
