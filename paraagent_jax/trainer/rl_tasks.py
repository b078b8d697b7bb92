"""Which ToolEnv tasks an RL iteration trains on.

Task numbers are ``(it - 1) * n + j`` for iteration ``it`` (1-based), so a
resumed run draws the same tasks. Kinds go round robin, or (``rl.task_sampling
= "pass_rate"``) in proportion to the chance that a group of that kind has
both successes and failures, from each kind's recent rollout success
(`kind_weights`).
"""

from __future__ import annotations

import collections
import random
from typing import Sequence

from paraagent_jax import config_utils

TASK_SAMPLING = ("round_robin", "pass_rate")


def draw_tasks(gen, split: str, start: int, n: int, kinds: Sequence[str]):
  """Tasks ``start .. start+n-1`` of ``split`` (kinds round robin)."""
  return [gen.task(i, split, kinds[i % len(kinds)]) for i in range(start, start + n)]


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
