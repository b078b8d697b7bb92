"""Batched multi-turn ParaAct rollouts against `toolenv.VectorToolEnv`.

One call runs B episodes to the end: every unfinished episode gets a turn
from the policy, its text is parsed into a `toolenv.Step` (malformed text is a
parse error that the environment answers with an error observation and a
penalty: never an exception), all episodes are stepped together, the
observation tokens are appended, and the loop goes on until each episode has
answered, run out of turns, or would overflow its token budget (then it is
marked truncated, not dropped).

The output is exactly what the RL loss needs (`TrajectoryBatch` fields as
numpy arrays, see `paraagent_jax.paraact.episode.pack_episodes`) plus
per-episode records for reports.

The text format (system prompt, turn template, step rendering and parsing,
token kinds) comes from a `ChatFormat` (`paraagent_jax.paraact.chat_format`).

    fmt = chat_format.ChatFormat(tokenizer, "paraact")
    env = toolenv.VectorToolEnv(catalog, len(tasks), **toolenv.oracle.env_options("paraact"))
    result = run_rollout(policies.OraclePolicy(fmt, "paraact"), env, tasks, fmt)
    batch = result.trajectory_batch()
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

import toolenv
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.paraact import episode as ep
from paraagent_jax.paraact import policies as pol
from paraagent_jax.paraact import protocol


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Budgets of a rollout.

  Attributes:
    max_turns: assistant turns per episode (S of the batch).
    max_turn_tokens: tokens the policy may write per turn.
    max_len: tokens per episode, prompt and observations included (T).
    max_obs_tokens: an observation longer than this is cut (and says so).
    max_phases: phase segments per episode (P); defaults to max_turns.
  """
  max_turns: int = 10
  max_turn_tokens: int = 192
  max_len: int = 2048
  max_obs_tokens: int = 384
  max_phases: int | None = None


@dataclasses.dataclass
class RolloutResult:
  """A finished batch: fixed-shape arrays, episode records and timings."""
  arrays: dict[str, np.ndarray]
  episodes: list[dict[str, Any]]
  buffers: list[ep.EpisodeBuffer]
  timing: dict[str, float]
  policy_stats: dict[str, float]

  def trajectory_batch(self):
    """The arrays as a `paraagent_jax.learner.batch.TrajectoryBatch` (jnp arrays)."""
    return batch_lib.TrajectoryBatch(**{k: jnp.asarray(v) for k, v in self.arrays.items()})


# Observations longer than this are cut in a record's transcript (the policy
# saw at most rollout.max_obs_tokens of them anyway).
TRANSCRIPT_OBS_CHARS = 3000


def _episode_record(task, buf: ep.EpisodeBuffer, steps: list[toolenv.Step],
                    rewards: toolenv.EpisodeRewards, wall: float,
                    transcript: list[dict[str, str]] | None = None,
                    diagnosis: dict[str, Any] | None = None) -> dict[str, Any]:
  """Behavioural statistics of one episode (the evaluation report's fields).

  ``diagnosis``: the environment's `ToolEnv.diagnosis` (failure cause,
  searches, redundant searches, the oracle plan's counts), merged in where the
  environment gives one (ToolEnv does; the fixed-task benchmarks do not).
  Parse failures: ``parse_errors`` (malformed steps), ``calls_dropped`` and
  ``json_errors`` (`protocol.failure_counts`), ``unknown_tool_calls`` (calls
  of tools that do not exist: the diagnosis's count, where the environment
  gives one, plus those refused before the environment).
  """
  lost = [protocol.failure_counts(s) for s in steps]
  exec_calls = [len(s.calls) for s in steps
                if s.phase == "execute" and isinstance(s.calls, list) and s.parse_error is None]
  n_calls = sum(len(s.calls) for s in steps if isinstance(s.calls, list))
  phases = [p for p in buf.step_phases if p in ("explore", "execute")]
  switches = sum(1 for a, b in zip(phases, phases[1:]) if a != b)
  kinds = np.asarray(buf.token_kind)
  mask = np.asarray(buf.loss_mask) > 0
  step_of = np.asarray(buf.step_id)
  explore_tok = execute_tok = 0
  for s, phase in enumerate(buf.step_phases):
    n = int(np.sum(mask & (step_of == s)))
    if phase == "explore":
      explore_tok += n
    elif phase == "execute":
      execute_tok += n
  step_r = list(rewards.step)
  phase_r = [p[1] for p in rewards.phase]
  return {
      "task_id": getattr(task, "task_id", getattr(task, "id", None)),
      "kind": getattr(task, "kind", None),
      "split": getattr(task, "split", None),
      "success": bool(rewards.success),
      "turns": len(steps),
      "calls": n_calls,
      "calls_per_step": exec_calls,
      "calls_per_execute_step": (sum(exec_calls) / len(exec_calls)) if exec_calls else 0.0,
      "phase_switches": switches,
      "explore_tokens": explore_tok,
      "execute_tokens": execute_tok,
      "parse_errors": sum(1 for s in steps if s.parse_error is not None),
      "calls_dropped": sum(c["calls_dropped"] for c in lost),
      "json_errors": sum(c["json_errors"] for c in lost),
      "tokens_generated": int(mask.sum()),
      "episode_tokens": len(buf),
      "truncated": buf.truncated,
      "wall_time_s": wall,
      "step_reward_mean": float(np.mean(step_r)) if step_r else 0.0,
      "phase_reward_mean": float(np.mean(phase_r)) if phase_r else 0.0,
      "traj_reward": float(rewards.trajectory),
      "answer": next((s.answer for s in reversed(steps) if s.phase == "answer"), None),
      "plan_tokens": int(np.sum(mask & (kinds == batch_lib.KIND_PLAN))),
      # What the policy read and wrote, turn by turn: {"role": "task" |
      # "assistant" | "observation", "text": ...}.
      "transcript": list(transcript or []),
      **_diagnosis_fields(diagnosis),
      "unknown_tool_calls": int((diagnosis or {}).get("unknown_tool_calls", 0)) + sum(
          c["unknown_tools"] for c in lost),
  }


def _diagnosis_fields(diagnosis: dict[str, Any] | None) -> dict[str, Any]:
  """The diagnosis keys a record takes (the record's own turns and calls per
  execute step, counted on the parsed steps, are kept)."""
  if not diagnosis:
    return {}
  return {k: v for k, v in diagnosis.items()
          if k not in ("turns", "calls_per_execute_step", "phase_switches")}


class _Episodes:
  """The open episodes of a batch: token buffers, pending observations, steps
  taken and transcripts, one entry per episode (`run_rollout`'s state)."""

  def __init__(self, b: int, first_obs, fmt):
    self.fmt = fmt
    self.buffers = [ep.EpisodeBuffer() for _ in range(b)]
    self.steps: list[list[toolenv.Step]] = [[] for _ in range(b)]
    self.done = [False] * b
    # Each episode's token stream in the protocol format (`ChatFormat.conversation`).
    self.convs = [fmt.conversation(first_obs[i]) for i in range(b)]
    self.pending_ids = [c.prompt_ids for c in self.convs]
    self.pending_msgs = [fmt.prompt_messages(first_obs[i]) for i in range(b)]
    self.wall = [0.0] * b
    self.transcripts = [[{"role": "task", "text": str(first_obs[i])}] for i in range(b)]

  def requests(self, config: RolloutConfig) -> list[pol.TurnRequest]:
    """This turn's requests; an episode whose next turn would not fit in
    ``max_len`` ends here, truncated."""
    out = []
    for i, buf in enumerate(self.buffers):
      if self.done[i]:
        continue
      if len(buf) + len(self.pending_ids[i]) + config.max_turn_tokens > config.max_len:
        buf.truncated = True
        self.done[i] = True
        continue
      buf.add_context(self.pending_ids[i])
      out.append(pol.TurnRequest(i, self.pending_ids[i], self.pending_msgs[i]))
    return out

  def record(self, i: int, out, step, res, config: RolloutConfig, t_start: float) -> None:
    """Episode ``i``'s turn: the policy's ``out``, the parsed ``step`` and the
    environment's result ``res``; queues the next observation or closes it."""
    fmt, buf = self.fmt, self.buffers[i]
    # Segments follow the phase the environment recorded (None when it
    # judged the step malformed), so they align with its phase rewards.
    s, seg = buf.begin_step(res.info.get("phase"))
    buf.add_policy(out.token_ids, out.logprobs, fmt.token_kinds(out.token_ids, out.text),
                   s, seg)
    self.steps[i].append(step)
    self.transcripts[i].append({"role": "assistant", "text": out.text})
    if res.done:
      self.done[i] = True
      buf.done = True
      self.wall[i] = time.perf_counter() - t_start
      self.pending_ids[i], self.pending_msgs[i] = [], []
      # Closing glue is context the policy never sees again: not sent to it.
      buf.add_context(self.convs[i].close_ids(out.token_ids, out.text))
    else:
      obs = str(res.observation)
      self.transcripts[i].append({"role": "observation", "text": obs if len(obs) <= (
          TRANSCRIPT_OBS_CHARS) else obs[:TRANSCRIPT_OBS_CHARS] + " [...]"})
      self.pending_ids[i] = self.convs[i].observation_ids(
          out.token_ids, out.text, res.observation, config.max_obs_tokens)
      self.pending_msgs[i] = fmt.observation_messages(res.observation, config.max_obs_tokens)


def run_rollout(policy: pol.Policy, env, tasks: Sequence[Any], fmt,
                config: RolloutConfig = RolloutConfig(),
                group_ids: Sequence[int] | None = None, seed: int = 0,
                progress=None) -> RolloutResult:
  """Runs one batch of episodes to the end.

  Args:
    policy: any `policies.Policy`.
    env: a `toolenv.VectorToolEnv` with ``num_envs == len(tasks)``.
    tasks: one `toolenv.Task` per episode (repeat a task G times for GRPO groups).
    fmt: the `ChatFormat` (tokenizer + strategy text format).
    config: budgets.
    group_ids: dense group index per episode (default: one group per episode).
    seed: sampling seed for the policy.
    progress: optional callable ``progress(turn, active_count)``.

  Returns:
    A `RolloutResult`.
  """
  b = len(tasks)
  group_ids = list(range(b)) if group_ids is None else list(group_ids)
  t_start = time.perf_counter()
  # policy_s: the model (or oracle/API); parse_s: parsing, token kinds,
  # bookkeeping and observation encoding; tokenize_s: encoding the prompts;
  # env_s: ToolEnv.
  timing = {"policy_s": 0.0, "parse_s": 0.0, "env_s": 0.0, "tokenize_s": 0.0}

  t0 = time.perf_counter()
  first_obs = env.reset(list(tasks))
  timing["env_s"] += time.perf_counter() - t0
  policy.reset(b, tasks, seed=seed)
  t0 = time.perf_counter()
  eps = _Episodes(b, first_obs, fmt)
  timing["tokenize_s"] += time.perf_counter() - t0

  for turn in range(config.max_turns):
    requests = eps.requests(config)
    if not requests:
      break
    if progress is not None:
      progress(turn, len(requests))
    t0 = time.perf_counter()
    outputs = policy.act(requests)
    timing["policy_s"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    env_steps: list[toolenv.Step | None] = [None] * b
    for req, out in zip(requests, outputs):
      # Parse the text (the oracle goes through the same text path as the
      # model, so the protocol is exercised end to end), except for a policy
      # that acts structurally (an API model's native tool calls): its Step,
      # parse failures included, is what it did; the text is its rendering.
      env_steps[req.episode] = out.step if out.step is not None else fmt.parse(out.text)
    timing["parse_s"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    results = env.step(env_steps)
    timing["env_s"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    for req, out in zip(requests, outputs):
      eps.record(req.episode, out, env_steps[req.episode], results[req.episode], config,
                 t_start)
    timing["parse_s"] += time.perf_counter() - t0

  buffers = eps.buffers
  cut = [i for i in range(b) if not buffers[i].done]
  for i in cut:
    buffers[i].truncated = True
    eps.wall[i] = time.perf_counter() - t_start
  env.finish(cut)
  rewards = [env.rewards(i) for i in range(b)]
  for i in range(b):
    # The environment's own turn budget also truncates.
    buffers[i].truncated = buffers[i].truncated or bool(rewards[i].truncated)
  arrays = ep.pack_episodes(
      buffers, rewards, group_ids, max_len=config.max_len,
      max_steps=config.max_turns, max_phases=config.max_phases or config.max_turns,
      pad_id=fmt.pad_id)
  strategy = getattr(getattr(fmt, "strategy", None), "name", None)
  diagnose = getattr(env, "diagnosis", None)
  records = [_episode_record(
      tasks[i], buffers[i], eps.steps[i], rewards[i], eps.wall[i], eps.transcripts[i],
      diagnose(i, strategy if strategy in toolenv.oracle.STRATEGIES else None)
      if diagnose is not None else None) for i in range(b)]
  timing["total_s"] = time.perf_counter() - t_start
  stats = policy.stats()
  policy.release()        # the KV cache is not needed by the update
  return RolloutResult(arrays, records, buffers, timing, stats)
