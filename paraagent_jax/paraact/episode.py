"""Per-episode token bookkeeping for ParaAct rollouts, and the fixed-shape batch.

A rollout appends, per episode, context tokens (prompt, observations, chat
template glue: not trained on) and policy tokens (what the policy wrote: trained
on). This module keeps those streams aligned with the labels the RL loss needs
and packs a finished batch of episodes into fixed-shape numpy arrays.

Token kinds and phase types are the codes of `paraagent_jax.learner.batch`
(the one source): KIND_PLAN (phase tag and thought), KIND_ACTION (the calls),
KIND_ANSWER, KIND_ENV (context: prompt, observations, template glue);
PHASE_EXPLORE, PHASE_EXECUTE (an answer step has no phase segment).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from toolenv.schema import EpisodeRewards

from paraagent_jax.learner.batch import KIND_ENV, PHASE_CODES, PHASE_EXPLORE



@dataclasses.dataclass
class EpisodeBuffer:
  """The growing token stream of one episode.

  ``step_id`` / ``phase_id`` of a policy token index that step's entry in
  ``step_rewards`` and that phase segment's entry in ``phase_rewards``; on
  context tokens they are -1.
  """

  tokens: list[int] = dataclasses.field(default_factory=list)
  loss_mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  step_id: list[int] = dataclasses.field(default_factory=list)
  phase_id: list[int] = dataclasses.field(default_factory=list)
  token_kind: list[int] = dataclasses.field(default_factory=list)
  # Per step: the phase string as parsed, and its segment index (-1 for answers
  # and unparseable steps, which belong to no phase segment).
  step_phases: list[str] = dataclasses.field(default_factory=list)
  step_segment: list[int] = dataclasses.field(default_factory=list)
  segment_types: list[int] = dataclasses.field(default_factory=list)
  truncated: bool = False
  done: bool = False
  # Segment of the current run of explore/execute steps (-1: none).
  _current: int = -1

  def __len__(self) -> int:
    return len(self.tokens)

  def add_context(self, ids: Sequence[int]) -> None:
    """Appends tokens the policy did not write (mask 0)."""
    n = len(ids)
    self.tokens.extend(int(i) for i in ids)
    self.loss_mask.extend([0] * n)
    self.logprobs.extend([0.0] * n)
    self.step_id.extend([-1] * n)
    self.phase_id.extend([-1] * n)
    self.token_kind.extend([KIND_ENV] * n)

  def begin_step(self, phase: str | None) -> tuple[int, int]:
    """Registers a new step with its phase; returns (step index, segment index).

    Mirrors `toolenv.rewards.segments` exactly, so segment k here is entry k of
    the environment's ``rewards().phase``: an explore/execute step extends
    the current run or opens a new one; a step with no valid phase (pass the
    environment's ``info["phase"]``, None for malformed steps) joins the run it
    interrupts, or no segment (-1) if there is none; an answer step belongs to
    no segment and ends the current run.
    """
    step = len(self.step_phases)
    code = PHASE_CODES.get(phase) if isinstance(phase, str) else None
    if phase == "answer":
      seg = -1
      self._current = -1
    elif code is None:
      seg = self._current
    elif self._current >= 0 and self.segment_types[self._current] == code:
      seg = self._current
    else:
      seg = len(self.segment_types)
      self.segment_types.append(code)
      self._current = seg
    self.step_phases.append(phase if isinstance(phase, str) else "invalid")
    self.step_segment.append(seg)
    return step, seg

  def add_policy(self, ids: Sequence[int], logprobs: Sequence[float],
                 kinds: Sequence[int], step: int, segment: int) -> None:
    """Appends tokens the policy wrote (mask 1) with their labels."""
    n = len(ids)
    if not (len(logprobs) == len(kinds) == n):
      raise ValueError(f"policy tokens/logprobs/kinds lengths differ: {n}, "
                       f"{len(logprobs)}, {len(kinds)}")
    self.tokens.extend(int(i) for i in ids)
    self.loss_mask.extend([1] * n)
    self.logprobs.extend(float(x) for x in logprobs)
    self.step_id.extend([step] * n)
    # Tokens of an answer or broken step point at segment 0 with kind answer/plan;
    # the level weights (answer: traj only) and phase_mask keep them honest.
    self.phase_id.extend([max(segment, 0)] * n)
    self.token_kind.extend(int(k) for k in kinds)


def segment_rewards(segment_types: Sequence[int], env_phases: Sequence[Any]) -> list[float]:
  """The environment's phase-segment rewards, checked against our segments.

  The environment reports ``[(phase, reward), ...]`` for its maximal runs
  (`toolenv.rewards.segments`); `EpisodeBuffer.begin_step` builds the same runs
  from the environment's per-step phases, so the lists must match one to one.

  Raises:
    ValueError: the lists differ in length or phase type (a bookkeeping bug).
  """
  got = [PHASE_CODES.get(p[0] if isinstance(p, (tuple, list)) else None) for p in env_phases]
  if got != list(segment_types):
    raise ValueError(f"phase segments differ from the environment's: ours "
                     f"{list(segment_types)}, env {got}")
  return [float(p[1]) for p in env_phases]


def pack_episodes(buffers: Sequence[EpisodeBuffer], rewards: Sequence[EpisodeRewards],
                  group_id: Sequence[int], max_len: int, max_steps: int,
                  max_phases: int, pad_id: int = 0) -> dict[str, np.ndarray]:
  """Packs finished episodes into the fixed shapes of a `TrajectoryBatch`.

  Args:
    buffers: one per episode.
    rewards: per episode, `EpisodeRewards` (``step``, ``phase``: ``(type, r)``
      per segment, ``trajectory``) as ``toolenv.VectorToolEnv.rewards(i)`` returns them.
    group_id: dense group index per episode (same task -> same group).
    max_len, max_steps, max_phases: T, S, P of the batch.
    pad_id: token id used for padding.

  Returns:
    dict of numpy arrays with the field names of `paraagent_jax.learner.batch.TrajectoryBatch`.
  """
  b = len(buffers)
  out = {
      "tokens": np.full((b, max_len), pad_id, np.int32),
      "loss_mask": np.zeros((b, max_len), np.float32),
      "old_logprobs": np.zeros((b, max_len), np.float32),
      "step_id": np.zeros((b, max_len), np.int32),
      "phase_id": np.zeros((b, max_len), np.int32),
      "token_kind": np.full((b, max_len), KIND_ENV, np.int32),
      "attention_mask": np.zeros((b, max_len), np.int32),
      "seq_len": np.zeros((b,), np.int32),
      "step_reward": np.zeros((b, max_steps), np.float32),
      "step_mask": np.zeros((b, max_steps), np.float32),
      "step_phase_type": np.zeros((b, max_steps), np.int32),
      "phase_reward": np.zeros((b, max_phases), np.float32),
      "phase_mask": np.zeros((b, max_phases), np.float32),
      "phase_type": np.zeros((b, max_phases), np.int32),
      "traj_reward": np.zeros((b,), np.float32),
      "group_id": np.asarray(group_id, np.int32),
      "truncated": np.zeros((b,), bool),
  }
  for i, (buf, rew) in enumerate(zip(buffers, rewards)):
    n = min(len(buf), max_len)
    out["tokens"][i, :n] = buf.tokens[:n]
    out["loss_mask"][i, :n] = buf.loss_mask[:n]
    out["old_logprobs"][i, :n] = buf.logprobs[:n]
    out["step_id"][i, :n] = np.clip(buf.step_id[:n], 0, max_steps - 1)
    out["phase_id"][i, :n] = np.clip(buf.phase_id[:n], 0, max_phases - 1)
    out["token_kind"][i, :n] = buf.token_kind[:n]
    out["attention_mask"][i, :n] = 1
    out["seq_len"][i] = n
    out["truncated"][i] = buf.truncated or len(buf) > max_len
    step_r = list(rew.step)
    # Answer steps are credited at the trajectory level only (no step
    # advantage); a malformed step outside any run still carries its penalty,
    # grouped with explore steps.
    for s, (seg, name) in enumerate(zip(buf.step_segment[:max_steps],
                                        buf.step_phases[:max_steps])):
      if s < len(step_r) and name != "answer":
        out["step_reward"][i, s] = step_r[s]
        out["step_mask"][i, s] = 1.0
        out["step_phase_type"][i, s] = buf.segment_types[seg] if seg >= 0 else PHASE_EXPLORE
    seg_r = segment_rewards(buf.segment_types, rew.phase)
    for p, (ptype, r) in enumerate(zip(buf.segment_types[:max_phases], seg_r)):
      out["phase_reward"][i, p] = r
      out["phase_mask"][i, p] = 1.0
      out["phase_type"][i, p] = ptype
    out["traj_reward"][i] = float(rew.trajectory)
  return out
