"""ToolEnv episodes over fixed benchmark tasks (BFCL, StableToolBench), scored by a rule.

`FixedTaskEnv` has the interface of `toolenv.VectorToolEnv` (``reset``,
``step``, ``finish``, ``rewards``), so the same ParaAct rollout and policies
run on it. Two things differ from a ToolEnv task:

* **Given tools.** In a benchmark's closed setting an episode is given its
  task's tools: that episode's environment then holds a catalog of just those
  tools (search and execution see nothing else). Otherwise every episode
  shares the pooled catalog and must search it (the open-world setting).
* **Scoring.** Success is not ToolEnv's answer check but the benchmark's rule:
  a ``scorer(task, episode)`` function sees the task and an `EpisodeLog` (the
  calls the agent made, in order, with the simulator's status, and the final
  answer) and returns ``{"success": bool, ...}``; the other keys are
  per-episode metrics the evaluation report shows (`extra`). The trajectory
  reward follows the benchmark's verdict; step and phase rewards stay
  ToolEnv's (they use the task's gold nodes: tools and, where known, calls).

Pure Python, no JAX.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

from toolenv import rewards as rw
from toolenv.catalog.store import Catalog
from toolenv.env import ToolEnv
from toolenv.schema import META_TOOLS, Call, EpisodeRewards, Step, StepResult, Tool
from toolenv.search import SearchIndex
from toolenv.tasks import Task


@dataclasses.dataclass
class CallRecord:
  """One call an agent made: which step, the call, and what the simulator said."""
  turn: int
  phase: str
  name: Any
  arguments: Any
  status: str        # ok | duplicate | error | violation


@dataclasses.dataclass
class EpisodeLog:
  """What a scorer sees of an episode."""
  calls: list[CallRecord] = dataclasses.field(default_factory=list)
  answer: Any = None
  finished: bool = False      # ended with an answer step (not by a budget)
  turns: int = 0
  parse_errors: int = 0

  def tool_calls(self) -> list[CallRecord]:
    """Calls of catalog tools (meta-tools and phase violations left out)."""
    return [c for c in self.calls
            if not (isinstance(c.name, str) and c.name in META_TOOLS)
            and c.status != "violation"]


Scorer = Callable[[Task, EpisodeLog, ToolEnv], dict[str, Any]]


class FixedTaskEnv:
  """A batch of ToolEnv episodes over fixed tasks, scored by ``scorer``."""

  def __init__(self, catalog: Catalog, num_envs: int, *, scorer: Scorer,
               given: dict[str, Sequence[Tool]] | None = None,
               enforce_phases: bool = True, seed: int | None = None, top_k: int = 5):
    """Creates the environment.

    Args:
      catalog: the pooled catalog (open-world episodes search and call it).
      num_envs: initial batch size (``reset`` grows or shrinks it).
      scorer: ``scorer(task, log, env) -> {"success": bool, ...}``.
      given: task id -> the tools that episode is given (closed setting);
        tasks not in it use the pooled catalog.
      enforce_phases: as in `toolenv.ToolEnv` (False for untagged strategies
        that mix meta-tools and catalog tools in one step).
      seed: simulator seed (default: the catalog's).
      top_k: default ``search_tools`` results.
    """
    if not isinstance(num_envs, int) or num_envs < 1:
      raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    self.catalog = catalog
    self.scorer = scorer
    self.given = dict(given or {})
    self.seed = catalog.info.get("seed", 0) if seed is None else seed
    self._kw = {"enforce_phases": enforce_phases, "seed": self.seed, "top_k": top_k}
    self.index = SearchIndex.for_catalog(catalog)
    self._shared = ToolEnv(catalog, index=self.index, **self._kw)
    self.envs: list[ToolEnv] = []
    self.tasks: list[Task] = []
    self.logs: list[EpisodeLog] = []
    self._scores: list[dict[str, Any] | None] = []
    self._num = num_envs

  @property
  def num_envs(self) -> int:
    return len(self.envs) or self._num

  def _env_for(self, task: Task) -> ToolEnv:
    tools = self.given.get(task.id)
    if tools is None:
      return ToolEnv(self.catalog, index=self.index, executor=self._shared.executor,
                     reward_config=self._shared.config, **self._kw)
    small = Catalog(list(tools), name=f"{self.catalog.name}-given",
                    info={"seed": self.seed})
    # bm25s sets its logger to DEBUG, which would log a line per episode.
    log = logging.getLogger("bm25s")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
      index = SearchIndex.build(small)
    finally:
      log.setLevel(level)
    return ToolEnv(small, index=index, **self._kw)

  def reset(self, tasks: Sequence[Task]) -> list[str]:
    """Starts one episode per task; returns the first observations."""
    self.tasks = list(tasks)
    self.envs = [self._env_for(t) for t in self.tasks]
    self.logs = [EpisodeLog() for _ in self.tasks]
    self._scores = [None] * len(self.tasks)
    return [e.reset(t) for e, t in zip(self.envs, self.tasks)]

  def step(self, steps: Sequence[Any]) -> list[StepResult | None]:
    """One step per episode (None skips it); logs the calls for the scorer."""
    if len(steps) != len(self.envs):
      raise ValueError(f"got {len(steps)} steps for {len(self.envs)} episodes")
    out: list[StepResult | None] = []
    for i, (env, s) in enumerate(zip(self.envs, steps)):
      if s is None:
        out.append(None)
        continue
      was_done = env.done
      res = env.step(s)
      out.append(res)
      if was_done:
        continue
      log = self.logs[i]
      log.turns += 1
      if not isinstance(s, Step) or s.parse_error is not None:
        log.parse_errors += 1
      statuses = res.info.get("statuses") or []
      phase = res.info.get("phase")
      if phase in ("explore", "execute") and isinstance(s.calls, (list, tuple)):
        for c, status in zip(s.calls, statuses):
          if isinstance(c, Call):
            log.calls.append(CallRecord(log.turns - 1, phase, c.name, c.arguments, status))
      if phase == "answer":
        log.answer = s.answer
        log.finished = True
    return out

  def finish(self, indices: Sequence[int]) -> None:
    """Ends the given episodes (truncation by the rollout)."""
    for i in indices:
      self.envs[i].finish()

  @property
  def done(self) -> list[bool]:
    return [e.done for e in self.envs]

  def score(self, i: int) -> dict[str, Any]:
    """The scorer's verdict on episode ``i`` (computed once)."""
    if self._scores[i] is None:
      got = dict(self.scorer(self.tasks[i], self.logs[i], self.envs[i]))
      got["success"] = bool(got.get("success", False))
      self._scores[i] = got
    return self._scores[i]

  def rewards(self, i: int) -> EpisodeRewards:
    """ToolEnv's reward parts with success and trajectory reward from the scorer."""
    env = self.envs[i]
    ok = self.score(i)["success"]
    return dataclasses.replace(
        env.rewards(), success=ok,
        trajectory=rw.trajectory_reward(env.config, ok, env.turns, self.tasks[i].max_turns))

  def extra(self, i: int) -> dict[str, Any]:
    """The scorer's per-episode metrics other than success (for the report)."""
    return {k: v for k, v in self.score(i).items() if k != "success"}
