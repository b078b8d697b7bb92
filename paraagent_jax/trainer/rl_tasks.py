"""Which ToolEnv tasks an RL iteration trains on.

Task numbers are ``(it - 1) * n + j`` for iteration ``it`` (1-based), so a
resumed run draws the same tasks. Kinds go round robin, or (``rl.task_sampling
= "pass_rate"``) in proportion to the chance that a group of that kind has
both successes and failures, from each kind's recent rollout success
(`kind_weights`).
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Sequence

import toolenv

TASK_SAMPLING = ("round_robin", "pass_rate")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Which train tasks each RL iteration draws (`trainer.specs.task_spec`).

  Attributes:
    catalog, catalog_seed: the held-out tasks' catalog (and, unless
      ``train_catalog_seed`` >= 0 differs, the training tasks').
    train_catalog_seed: another catalog seed for the training tasks (-1 = none).
    task_seed: the task generator's seed.
    kinds: task kinds.
    per_iteration: tasks per iteration (``rl.tasks_per_iter``).
    group_size: samples per task.
    sampling: "round_robin" or "pass_rate" (`TASK_SAMPLING`).
    window, floor: "pass_rate"'s history window and weight floor.
    seed: the run's seed ("pass_rate"'s kind draws).
  """
  catalog: str = "procedural"
  catalog_seed: int = 0
  train_catalog_seed: int = -1
  task_seed: int = 0
  kinds: tuple[str, ...] = tuple(toolenv.KINDS)
  per_iteration: int = 4
  group_size: int = 4
  sampling: str = "round_robin"
  window: int = 5
  floor: float = 0.05
  seed: int = 0


def train_generator(spec: TaskSpec, catalog):
  """The training tasks' generator: on ``catalog`` (the held-out tasks'), or,
  when ``train_catalog_seed`` names another seed, on that seed's catalog
  (other provider names, most of them new to the policy)."""
  if spec.train_catalog_seed >= 0 and spec.train_catalog_seed != spec.catalog_seed:
    catalog = toolenv.load_catalog(spec.catalog, seed=spec.train_catalog_seed)
  return toolenv.TaskGenerator(catalog, seed=spec.task_seed)


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


def sample_tasks(gen, it: int, spec: TaskSpec, history: Sequence[dict]):
  """The ``spec.per_iteration`` train tasks of iteration ``it`` (1-based), per
  ``spec.sampling``.

  Task numbers are ``(it - 1) * n + j`` either way; with "pass_rate" the kind
  of slot ``j`` is drawn from `kind_weights` with a generator seeded by
  ``spec.seed`` and ``it``, so a resumed run (whose history is restored)
  draws the same tasks.
  """
  n, kinds = spec.per_iteration, list(spec.kinds)
  start = (it - 1) * n
  if spec.sampling == "round_robin":
    return draw_tasks(gen, "train", start, n, kinds)
  if spec.sampling != "pass_rate":
    raise ValueError(f"task sampling {spec.sampling!r}; expected one of {TASK_SAMPLING}")
  w = kind_weights(history, kinds, spec.group_size, spec.window, spec.floor)
  rng = random.Random(f"rl-kinds-{spec.seed}-{it}")
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
