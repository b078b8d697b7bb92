"""Reward signals at three levels: step, phase segment, trajectory.

All weights live in `RewardConfig`. With ``c = RewardConfig()``:

Step (one assistant turn):
    r_step = c.format                               if the step is well formed
             - c.malformed                          otherwise (and nothing else counts)
           + sum over calls of:
               + c.valid       call ran without an error
               - c.error       call returned an error (unknown tool, bad arguments, ...)
               - c.violation   phase violation (explore step calling a catalog tool,
                               execute step calling a meta-tool); the call is not run
               - c.duplicate   same tool and canonical arguments as an earlier call
               + c.useful      explore: a gold tool seen for the first time
                               execute: a gold DAG node completed for the first time
    An answer step gets only the format term; its correctness is the trajectory's.

Phase segment (a maximal run of non-answer steps with the same phase):
    explore:  recall / n_steps, where recall = |gold tools found in the segment
              among those still needed and unknown at its start| / |those|
              (0 if nothing was needed: exploring then is wasted)
    execute:  (|nodes ready at the start that the segment completed| / |ready|)
              * min(1, levels / n_steps), where levels = DAG levels spanned by
              the nodes completed in the segment: doing a level's independent
              calls in one step scores 1, one per step scores 1/k.

Trajectory:
    R = 1 + c.efficiency * (1 - turns / max_turns)   on success, else 0,
    success = every gold answer value appears in the answer text (token
    boundaries, case-insensitive) and, for write tasks, the final state equals
    the gold state.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Weights of the reward terms (see the module docstring for the formulas)."""

  format: float = 0.1
  malformed: float = 0.5
  valid: float = 0.05
  error: float = 0.2
  violation: float = 0.3
  duplicate: float = 0.1
  useful: float = 0.3
  efficiency: float = 0.1
  after_done: float = 0.5      # penalty for acting after the episode ended


def step_reward(c: RewardConfig, *, well_formed: bool, statuses: Sequence[str],
                useful: int) -> float:
  """The step reward from per-call statuses.

  ``statuses`` holds one of ``ok``, ``error``, ``violation``, ``duplicate``
  (a duplicate that ran counts ``valid`` too, see `call_terms`) per call.
  """
  if not well_formed:
    return -c.malformed
  r = c.format + c.useful * useful
  for s in statuses:
    r += call_term(c, s)
  return r


def call_term(c: RewardConfig, status: str) -> float:
  """The reward of one call with ``status``."""
  return {"ok": c.valid, "error": -c.error, "violation": -c.violation,
          "duplicate": c.valid - c.duplicate}.get(status, -c.error)


def explore_segment_reward(needed: set[str], found: set[str], n_steps: int) -> float:
  """Recall of the needed gold tools per step spent."""
  if not needed or n_steps <= 0:
    return 0.0
  return len(needed & found) / len(needed) / n_steps


def execute_segment_reward(ready: set[str], completed: set[str],
                           levels: int, n_steps: int) -> float:
  """Fraction of ready nodes completed, times the parallelism efficiency."""
  if not ready or n_steps <= 0:
    return 0.0
  frac = len(ready & completed) / len(ready)
  return frac * min(1.0, max(1, levels) / n_steps)


def value_in_answer(value: str, answer: str) -> bool:
  """Whether ``value`` appears in ``answer`` as a whole token sequence."""
  v = value.strip().lower()
  if not v:
    return True
  pat = r"(?<![0-9a-z])" + re.escape(v) + r"(?![0-9a-z])"
  return re.search(pat, answer.lower()) is not None


def answer_correct(values: Sequence[str], answer: Any) -> bool:
  """Every gold value present in the answer text."""
  if not isinstance(answer, str):
    return False
  return all(value_in_answer(v, answer) for v in values)


def trajectory_reward(c: RewardConfig, success: bool, turns: int,
                      max_turns: int) -> float:
  """1 plus a small efficiency bonus on success, else 0."""
  if not success:
    return 0.0
  return 1.0 + c.efficiency * max(0.0, 1.0 - turns / max(1, max_turns))


def segments(phases: Sequence[str]) -> list[tuple[str, int, int]]:
  """Maximal runs ``(phase, first, last)`` of explore/execute steps.

  Answer steps end a run and form none; a step with an invalid phase (None)
  joins the run it interrupts, as it made no phase decision of its own.
  """
  out: list[list[Any]] = []
  for i, p in enumerate(phases):
    if p == "answer":
      out.append(["answer", i, i])
      continue
    if p not in ("explore", "execute"):
      if out and out[-1][0] != "answer":
        out[-1][2] = i
      continue
    if out and out[-1][0] == p:
      out[-1][2] = i
    else:
      out.append([p, i, i])
  return [tuple(s) for s in out if s[0] != "answer"]
