"""Tasks: the `Task` record, helpers every generator shares, and their base class.

A task is an instruction, a gold DAG of calls (nodes with concrete arguments
and the ids of the nodes whose outputs they use) and the gold answer values.
Gold argument values are resolved by running the gold DAG through the
`Executor` (`BaseTaskGenerator._finish`), so the gold answer values are
exactly what a correct episode observes. Write calls (create, update) make
the final episode state part of the gold.

Kinds (every generator draws the same five):

    single    one call
    parallel  k = 2..4 independent calls       (different providers)
    chain     each call uses the previous output
    fanout    one call, then k that use its output
    mixed     a chain or fanout plus independent calls

Splits: providers are split by a hash (``TEST_FRACTION`` of them are test-only,
`BaseTaskGenerator.split_of`), so test tasks use tools and whole providers
that no train task uses.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Any, Sequence

from toolenv.executor import Executor, lookup, state_key
from toolenv.validation import is_error
from toolenv.values import OBS_JSON, canonical_json, digest

KINDS: tuple[str, ...] = ("single", "parallel", "chain", "fanout", "mixed")
MULTI_TOOL_KINDS: tuple[str, ...] = ("parallel", "fanout", "mixed")
SPLITS: tuple[str, ...] = ("train", "test")
TEST_FRACTION = 0.2
WRITE_PROB = 0.15
# Words the generators put in search queries and new records' names.
QUERY_WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet",
               "harbor", "indigo", "juniper", "kestrel", "lotus", "meadow",
               "nimbus", "onyx", "pebble", "quartz", "raven", "sierra", "tundra")


@dataclasses.dataclass
class Task:
  """One task: instruction, gold DAG, gold answer values and gold state.

  ``nodes`` are dicts ``{"id", "tool", "arguments", "deps", "level", "query",
  "late"}``: ``arguments`` are concrete (refs resolved), ``deps`` the ids of
  nodes whose outputs they use, ``query`` what an explorer would search for,
  ``late`` whether the need only appears after earlier results (the oracle
  then explores it after executing them). ``answers`` are ``{"label",
  "value"}`` dicts; success needs every value in the final answer.
  """

  id: str
  kind: str
  split: str
  instruction: str
  nodes: list[dict[str, Any]]
  answers: list[dict[str, str]]
  gold_state: str = ""          # `executor.state_key` of the gold final state
  writes: bool = False
  max_turns: int = 16
  seed: int = 0

  @property
  def gold_tools(self) -> list[str]:
    """Distinct tools of the gold DAG, in node order."""
    return list(dict.fromkeys(n["tool"] for n in self.nodes))

  @property
  def depth(self) -> int:
    return 1 + max(n["level"] for n in self.nodes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Task":
    return cls(**d)


def fmt_value(v: Any) -> str:
  """How an answer value is written (as it appears in the JSON observation)."""
  if isinstance(v, str):
    return v
  return canonical_json(v)


def answer_key(path: str) -> str:
  """The response field an answer path ends in: ``items[0].name`` -> ``name``."""
  return re.sub(r"\[\d*\]", "", path.split(".")[-1])


def plural(w: str) -> str:
  """``entity`` -> ``entities``, ``box`` -> ``boxes``, ``pet`` -> ``pets``."""
  if w.endswith("y") and w[-2:-1] not in "aeiou":
    return w[:-1] + "ies"
  if w.endswith(("s", "x", "ch", "sh")):
    return w + "es"
  return w + "s"


class BaseTaskGenerator(abc.ABC):
  """What every task generator shares: splits, `generate`, the gold-DAG runner.

  A subclass indexes its catalog in ``_index`` and draws one task in
  ``task(index, split, kind)`` (a pure function of its arguments and the
  seed), returning ``_finish(parts, ...)`` on the parts it drew. Which class a
  catalog gets is `toolenv.tasks.registry.TaskGenerator`'s business.
  """

  def __init__(self, catalog, seed: int = 0, executor: Executor | None = None):
    self.catalog = catalog
    self.seed = seed
    self.executor = executor or Executor(catalog, seed=catalog.info.get("seed", 0))
    self._index()

  def split_of(self, provider: str) -> str:
    """Which split a provider belongs to (stable for a given generator seed)."""
    return "test" if digest("split", self.seed, provider) % 1000 < TEST_FRACTION * 1000 else "train"

  @abc.abstractmethod
  def _index(self) -> None:
    """Reads the catalog into the pools that ``task`` draws from."""

  # ---- public ------------------------------------------------------------
  def generate(self, n: int, split: str = "train",
               kinds: Sequence[str] = KINDS) -> list[Task]:
    """``n`` tasks of ``split``, kinds dealt round-robin (stable prefixes)."""
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
      raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds!r}")
    return [self.task(i, split, kinds[i % len(kinds)]) for i in range(n)]

  @abc.abstractmethod
  def task(self, index: int, split: str, kind: str) -> Task:
    """Task number ``index`` of ``kind`` in ``split`` (a pure function of them)."""

  # ---- resolving -------------------------------------------------------------
  def _finish(self, parts, task_id: str, kind: str, split: str) -> Task:
    """Runs the gold DAG, resolving refs, and builds the `Task`."""
    state = self.executor.new_state()
    nodes, answers, texts = [], [], []
    for part in parts:
      base = len(nodes)
      outs = []
      for j, (tool, args) in enumerate(part["calls"]):
        deps, concrete = [], {}
        for k, v in args.items():
          if isinstance(v, tuple) and v and v[0] == "$ref":
            deps.append(nodes[base + v[1]]["id"])
            concrete[k] = lookup(outs[v[1]], v[2])
          else:
            concrete[k] = v
        out = self.executor.run(tool.name, concrete, state)
        if is_error(out):
          raise RuntimeError(f"gold call failed: {tool.name}({concrete}): {out}")
        outs.append(out)
        level = 1 + max((nodes[int(d[1:])]["level"] for d in deps), default=-1)
        q = part["queries"][min(j, len(part["queries"]) - 1)]
        nodes.append({"id": f"n{len(nodes)}", "tool": tool.name, "arguments": concrete,
                      "deps": sorted(set(deps)), "level": level, "query": q,
                      "late": bool(part.get("late")) and level > 0})
      for j, path, label in part["answers"]:
        v = lookup(outs[j], path)
        answers.append({"label": label, "value": fmt_value(v),
                        "key": answer_key(path), "json": OBS_JSON(v)})
      texts.append(part["text"])
    writes = any(self.catalog[n["tool"]].effect == "write" for n in nodes)
    instruction = " ".join(texts) if len(texts) == 1 else " Also: ".join(texts)
    return Task(id=task_id, kind=kind, split=split, instruction=instruction,
                nodes=nodes, answers=answers,
                gold_state=state_key(state) if writes else "", writes=writes,
                max_turns=min(40, 2 * len(nodes) + 6), seed=self.seed)

