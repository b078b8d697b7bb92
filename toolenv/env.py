"""ToolEnv and VectorToolEnv: episodes of explore / execute / answer steps.

    env = VectorToolEnv(catalog, num_envs=len(tasks))
    observations = env.reset(tasks)            # instruction text per episode
    results = env.step(steps)                  # one Step (or None if done) each
    env.rewards(0)                             # step / phase / trajectory parts

An explore step calls the meta-tools (``search_tools``, ``get_tool_doc``); an
execute step calls catalog tools; all calls of a step are independent and
answered together, one observation block per call. Nothing a model writes
makes the environment raise: malformed steps, unknown tools, bad arguments
and acting after the end are error observations with a penalty
(`toolenv.rewards` has the formulas). ``enforce_phases=False`` lets a step mix
meta-tools and catalog tools (the baselines without phases).
``obs_format="compact"`` renders search results as ``name(params)`` without
the one-line descriptions (`compact_result_line`): the same tools in about
half the tokens, for small models whose cost grows with every context token.
"""

from __future__ import annotations

from typing import Any, Sequence

from toolenv import diagnosis as diag_lib
from toolenv import rewards as rw
from toolenv.executor import Executor, state_key
from toolenv.schema import META_TOOLS, SEARCH_TOOLS, Call, EpisodeRewards, Step, StepResult
from toolenv.search import SearchIndex, get_tool_doc, param_signature
from toolenv.tasks import Task
from toolenv.validation import canonical_call, error, is_error, with_defaults
from toolenv.values import OBS_JSON, canonical_json, digest

MAX_CALLS_PER_STEP = 16
MAX_OBS_CHARS = 1500          # per call block
FAULTS = ("timeout", "rate_limited", "unavailable")
OBS_FORMATS = ("full", "compact")


def compact_result_line(tool) -> str:
  """A search-result line without the description: ``name(params)``."""
  return f"{tool.name}{param_signature(tool)}"


def _short(x: Any, n: int = 60) -> str:
  s = x if isinstance(x, str) else type(x).__name__
  return s[:n]


_dump = OBS_JSON   # one encoder object (json.dumps with options builds one per call)


class ToolEnv:
  """One episode at a time over a catalog (see the module docstring)."""

  def __init__(self, catalog, *, seed: int | None = None, index: SearchIndex | None = None,
               executor: Executor | None = None, reward_config: rw.RewardConfig | None = None,
               enforce_phases: bool = True, fault_rate: float = 0.0, top_k: int = 5,
               obs_format: str = "full"):
    if obs_format not in OBS_FORMATS:
      raise ValueError(f"obs_format={obs_format!r}; expected one of {OBS_FORMATS}")
    self.obs_format = obs_format
    self.catalog = catalog
    self.seed = catalog.info.get("seed", 0) if seed is None else seed
    self.index = index or SearchIndex.for_catalog(catalog)
    self.executor = executor or Executor(catalog, seed=self.seed)
    self.config = reward_config or rw.RewardConfig()
    self.enforce_phases = enforce_phases
    self.fault_rate = fault_rate
    self.top_k = top_k
    self.task: Task | None = None
    self.done = True

  # ---- episode -------------------------------------------------------------
  def reset(self, task: Task) -> str:
    """Starts ``task``; returns the first observation (the instruction)."""
    self.task = task
    self.state = self.executor.new_state()
    self.done = False
    self.truncated = False
    self.turns = 0
    self.answer: Any = None
    self.known: set[str] = set()
    self.completed: set[str] = set()
    self.seen_calls: set[str] = set()
    self.log: list[dict[str, Any]] = []
    self._gold = {}
    for n in task.nodes:
      tool = self.catalog.get(n["tool"])
      # = canonical_call(tool, arguments), with the executor's memoised spec.
      args = with_defaults(tool, n["arguments"], self.executor.spec(tool))
      self._gold[tool.name + canonical_json(args)] = n["id"]
    self._nodes = {n["id"]: n for n in task.nodes}
    self._gold_tools = set(task.gold_tools)
    return (f"Task: {task.instruction}\n"
            f"(You have at most {task.max_turns} turns.)")

  def step(self, step: Any) -> StepResult:
    """Runs one step; never raises on what the step contains."""
    if self.task is None:
      return StepResult("error: call reset(task) first", -self.config.after_done,
                        terminated=True, info={"error": "no_episode"})
    if self.done:
      return StepResult("error: the episode is over; no more steps are accepted",
                        -self.config.after_done, terminated=not self.truncated,
                        truncated=self.truncated, info={"error": "after_done"})
    try:
      obs, reward, info = self._step(step)
    except Exception as e:  # pylint: disable=broad-except
      # Last line of defence: the env must never crash a rollout. Tests check
      # that this never happens on model output.
      obs = "error: the environment could not process this step"
      reward = -self.config.malformed
      info = {"internal_error": repr(e)[:200], "phase": None, "statuses": [], "useful": 0}
      self._record(None, reward, set(), set())
    self.turns += 1
    if not self.done and self.turns >= self.task.max_turns:
      self.done = self.truncated = True
      obs += "\n(turn budget spent: the episode is over)"
    return StepResult(obs, reward, terminated=self.done and not self.truncated,
                      truncated=self.truncated, info=info)

  def _record(self, phase, reward, found, completed_now, calls=()) -> None:
    """One step of the log: its phase (None if malformed), reward, the needed
    tools it first showed, the gold nodes it completed and, per call, the name,
    status, error code, completed node and needed tools shown
    (`toolenv.diagnosis` reads them)."""
    self.log.append({"phase": phase, "reward": reward, "found": found,
                     "completed": completed_now, "malformed": phase is None,
                     "calls": list(calls)})

  def _step(self, step: Any) -> tuple[str, float, dict[str, Any]]:
    c = self.config
    problem = None
    if not isinstance(step, Step):
      problem = f"expected a step, got {type(step).__name__}"
    elif step.parse_error:
      problem = f"could not parse your step: {_short(step.parse_error, 300)}"
    elif not isinstance(step.phase, str) or step.phase not in ("explore", "execute", "answer"):
      problem = f"phase must be explore, execute or answer, got {_short(step.phase)!r}"
    elif step.phase == "answer" and not isinstance(step.answer, str):
      problem = "an answer step needs the answer text"
    elif step.phase != "answer" and (not isinstance(step.calls, (list, tuple)) or not step.calls):
      problem = "an explore or execute step needs at least one call"
    if problem is not None:
      info = {"error": "malformed", "phase": None, "statuses": [], "useful": 0}
      self._record(None, -c.malformed, set(), set())
      return f"error: {problem}", -c.malformed, info
    if step.phase == "answer":
      self.answer = step.answer
      self.done = True
      info = {"phase": "answer", "statuses": [], "useful": 0}
      self._record("answer", c.format, set(), set())
      return "Answer received.", c.format, info
    blocks, statuses, found, done_nodes, calls = [], [], set(), set(), []
    for i, call in enumerate(step.calls):
      text, status, f, n, code = self._call(step.phase, i, call)
      name = getattr(call, "name", None)
      blocks.append(f"[{i + 1}] {_short(name)}: {text[:MAX_OBS_CHARS]}")
      statuses.append(status)
      calls.append({"name": name[:80] if isinstance(name, str) else None, "status": status,
                    "error": code, "node": next(iter(n), None), "found": sorted(f)})
      found |= f
      done_nodes |= n
    useful = len(found) + len(done_nodes)
    r = rw.step_reward(c, well_formed=True, statuses=statuses, useful=useful)
    info = {"phase": step.phase, "statuses": statuses, "useful": useful}
    self._record(step.phase, r, found, done_nodes, calls)
    return "\n".join(blocks), r, info

  def _call(self, phase: str, i: int, call: Any):
    """One call: (observation text, status, gold tools found, nodes completed,
    error code or None)."""
    if i >= MAX_CALLS_PER_STEP:
      return (f"error: at most {MAX_CALLS_PER_STEP} calls per step", "error", set(), set(),
              "too_many_calls")
    if not isinstance(call, Call):
      return "error: not a call", "error", set(), set(), "not_a_call"
    name, args = call.name, call.arguments
    is_meta = isinstance(name, str) and name in META_TOOLS
    if self.enforce_phases and ((phase == "explore" and not is_meta) or (
        phase == "execute" and is_meta)):
      want = "meta-tools (search_tools, get_tool_doc)" if phase == "explore" else "catalog tools"
      return (_dump(error("phase_violation", f"a {phase} step may only call {want}", name)),
              "violation", set(), set(), "phase_violation")
    key = (name + canonical_json(args)) if is_meta else None
    if self.fault_rate > 0 and digest(self.seed, self.task.id, self.turns, i, "fault") / 2.0**64 < self.fault_rate:
      kind = FAULTS[digest(self.task.id, self.turns, i) % len(FAULTS)]
      return (_dump(error(kind, "transient failure, retry the call", name)), "error", set(),
              set(), kind)
    if is_meta:
      text, code, shown = self._meta(name, args)
      if code is not None:
        return text, "error", set(), set(), code
      new = {t for t in shown if t in self._gold_tools and t not in self.known}
      self.known |= set(shown)
      dup = key in self.seen_calls
      self.seen_calls.add(key)
      return text, "duplicate" if dup else "ok", new, set(), None
    # The executor returns the canonical call key with the response: the
    # defaults and canonical JSON are computed once per call, not twice.
    out, ck = self.executor.run_keyed(name, args, self.state)
    if is_error(out):
      return _dump(out), "error", set(), set(), str(out.get("error"))
    if self.executor.catalog is not self.catalog:
      ck = canonical_call(self.catalog[name], args)
    dup = ck in self.seen_calls
    self.seen_calls.add(ck)
    node = self._gold.get(ck)
    done = set()
    if node is not None and node not in self.completed:
      self.completed.add(node)
      done = {node}
    self.known.add(name)
    return _dump(out), "duplicate" if dup else "ok", set(), done, None

  def _meta(self, name: str, args: Any) -> tuple[str, str | None, list[str]]:
    """(observation, error code or None, tool names shown)."""
    if not isinstance(args, dict):
      return (_dump(error("bad_arguments", "arguments must be a JSON object", name)),
              "bad_arguments", [])
    if name == SEARCH_TOOLS:
      q, k = args.get("query"), args.get("top_k", self.top_k)
      extra = set(args) - {"query", "top_k"}
      if not isinstance(q, str) or not q.strip() or extra:
        return _dump(error("bad_arguments", "search_tools takes {\"query\": str, "
                           "\"top_k\": int (optional)}", name)), "bad_arguments", []
      hits = self.index.search(q, k)
      if self.obs_format == "compact":
        text = "\n".join(compact_result_line(self.catalog[n]) for n, _ in hits)
        return text or "no tools found", None, [h for h, _ in hits]
      return self.index.search_text(q, k), None, [h for h, _ in hits]
    tname = args.get("name")
    if set(args) != {"name"} or not isinstance(tname, str):
      return (_dump(error("bad_arguments", "get_tool_doc takes {\"name\": str}", name)),
              "bad_arguments", [])
    doc = get_tool_doc(self.catalog, tname)
    if doc is None:
      return (_dump(error("unknown_tool", f"no tool named {tname[:60]!r}", tname)),
              "unknown_tool", [])
    return _dump(doc), None, [tname]

  def finish(self) -> None:
    """Ends the episode from outside (the rollout ran out of tokens)."""
    if self.task is not None and not self.done:
      self.done = self.truncated = True

  # ---- rewards ---------------------------------------------------------------
  @property
  def success(self) -> bool:
    if self.task is None or self.answer is None:
      return False
    ok = rw.answer_correct([a["value"] for a in self.task.answers], self.answer)
    if ok and self.task.writes:
      ok = state_key(self.state) == self.task.gold_state
    return ok

  def rewards(self) -> EpisodeRewards:
    """Step rewards, phase segments ``(type, reward)``, trajectory reward."""
    task = self.task
    if task is None:
      raise ValueError("no episode: call reset(task) first")
    phase_out = []
    # Replay the log to know what was known / completed at each segment start.
    known: set[str] = set()
    completed: set[str] = set()
    segs = rw.segments([e["phase"] for e in self.log])
    seg_at = {s[1]: s for s in segs}
    cur = None
    for i, e in enumerate(self.log):
      if i in seg_at:
        p, a, b = seg_at[i]
        ready = {j for j, n in self._nodes.items() if j not in completed
                 and all(d in completed for d in n["deps"])}
        needed = {n["tool"] for j, n in self._nodes.items() if j not in completed
                  and (j in ready or not n["late"])} - known
        cur = {"phase": p, "end": b, "n": b - a + 1, "ready": ready, "needed": needed,
               "found": set(), "completed": set()}
      if cur is not None and i <= cur["end"]:
        cur["found"] |= e["found"]
        cur["completed"] |= e["completed"]
      known |= e["found"]
      known |= {self._nodes[j]["tool"] for j in e["completed"]}
      completed |= e["completed"]
      if cur is not None and i == cur["end"]:
        if cur["phase"] == "explore":
          r = rw.explore_segment_reward(cur["needed"], cur["found"], cur["n"])
        else:
          levels = len({self._nodes[j]["level"] for j in cur["completed"]})
          r = rw.execute_segment_reward(cur["ready"], cur["completed"], levels, cur["n"])
        phase_out.append((cur["phase"], r))
        cur = None
    success = self.success
    return EpisodeRewards(
        step=tuple(e["reward"] for e in self.log), phase=tuple(phase_out),
        trajectory=rw.trajectory_reward(self.config, success, self.turns, task.max_turns),
        success=success, turns=self.turns, truncated=self.truncated,
        completed=len(self.completed), nodes=len(task.nodes))


  def diagnosis(self, strategy: str | None = "paraact") -> dict[str, Any]:
    """Why the episode failed and how it acted (`toolenv.diagnosis`).

    Returns ``cause`` (None on success) and ``cause_detail``, the behaviour
    counts of `diagnosis.BEHAVIOUR_FIELDS`, and (``strategy`` not None) the
    same counts of the oracle's plan of this task under that strategy,
    prefixed ``oracle_``, played in a fresh env on the same index.
    """
    task = self.task
    if task is None:
      raise ValueError("no episode: call reset(task) first")
    cause, detail = diag_lib.failure_cause(task.nodes, self.log, success=self.success,
                                           answered=self.answer is not None)
    out: dict[str, Any] = {"cause": cause, "cause_detail": detail,
                           **diag_lib.behaviour(self.log)}
    if strategy is not None:
      shadow = ToolEnv(self.catalog, seed=self.seed, index=self.index, executor=self.executor,
                       reward_config=self.config, enforce_phases=self.enforce_phases,
                       top_k=self.top_k, obs_format=self.obs_format)
      out.update({f"oracle_{k}": v for k, v in
                  diag_lib.oracle_behaviour(shadow, task, strategy).items()})
    return out


class VectorToolEnv:
  """A batch of `ToolEnv` episodes stepped together (one shared index)."""

  def __init__(self, catalog, num_envs: int, **kwargs):
    if not isinstance(num_envs, int) or num_envs < 1:
      raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    self.catalog = catalog
    self._kwargs = kwargs
    kwargs.setdefault("index", SearchIndex.for_catalog(catalog))
    # One executor for the batch: its memo of base records (a pure function
    # of seed, entity and id) then serves every episode, e.g. a GRPO group
    # replaying one task. Episode state stays per env.
    seed = kwargs.get("seed")
    kwargs.setdefault("executor", Executor(
        catalog, seed=catalog.info.get("seed", 0) if seed is None else seed))
    self.envs = [ToolEnv(catalog, **kwargs) for _ in range(num_envs)]

  @property
  def num_envs(self) -> int:
    return len(self.envs)

  def reset(self, tasks: Sequence[Task]) -> list[str]:
    """Starts one episode per task (grows the batch if there are more tasks)."""
    while len(self.envs) < len(tasks):
      self.envs.append(ToolEnv(self.catalog, **self._kwargs))
    self.envs = self.envs[:len(tasks)]
    return [e.reset(t) for e, t in zip(self.envs, tasks)]

  def step(self, steps: Sequence[Any]) -> list[StepResult | None]:
    """One step per episode; ``None`` skips an episode (e.g. already done)."""
    if len(steps) != len(self.envs):
      raise ValueError(f"got {len(steps)} steps for {len(self.envs)} episodes")
    return [None if s is None else e.step(s) for e, s in zip(self.envs, steps)]

  def finish(self, indices: Sequence[int]) -> None:
    """Ends the given episodes (truncation by the rollout)."""
    for i in indices:
      self.envs[i].finish()

  @property
  def done(self) -> list[bool]:
    return [e.done for e in self.envs]

  def rewards(self, i: int) -> EpisodeRewards:
    """Reward parts of episode ``i``."""
    return self.envs[i].rewards()

  def diagnosis(self, i: int, strategy: str | None = "paraact") -> dict[str, Any]:
    """`ToolEnv.diagnosis` of episode ``i``."""
    return self.envs[i].diagnosis(strategy)
