"""Chat backend of the role agents: each role prompts an OpenAI-compatible model.

    chat = api_client.ChatModel(api_client.make_client("http://127.0.0.1:8000/v1"),
                                model="gpt-4.1")
    roles = chat_roles(chat, cache_dir="/tmp/cs_cache", max_workers=8)
    kept, stats = Orchestrator(catalog, roles).run(tasks)

Every role sends a system prompt that starts with ``[role:<name>]`` (so a
scripted test server can route requests) and the task text, and reads back a
small JSON object (planner, explorer) or a ParaAct step (executor) or plain
text (answerer). Retries on transient failures are the openai SDK's; answers
are cached on disk, one JSON file per request, keyed by the SHA-256 of the
model, temperature and messages, so a rebuild costs no requests. Explorers
of one episode run in a thread pool, and the orchestrator advances the
episodes of a batch in threads as well.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import threading
from typing import Any, Callable, Iterable, Sequence

from paraagent_jax import fileio
from paraagent_jax.coldstart.roles import Context, Role, RoleOutput, RoleSet, SubGoal
from paraagent_jax.paraact import protocol
from toolenv.schema import SEARCH_TOOLS, Call

_JSON_RE = re.compile(r"\{.*\}", re.S)


class ResponseCache:
  """On-disk cache of chat answers: ``<dir>/<sha256>.json`` per request."""

  def __init__(self, directory: str):
    self.directory = directory
    fileio.makedirs(directory)

  @staticmethod
  def key(payload: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the request."""
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()

  def get(self, key: str) -> str | None:
    """The cached answer text, or None."""
    try:
      return fileio.read_json(os.path.join(self.directory, key + ".json"))["content"]
    except (FileNotFoundError, ValueError, KeyError):
      return None

  def put(self, key: str, content: str) -> None:
    """Stores an answer (temp file + rename, safe across threads)."""
    fileio.write_json_atomic(os.path.join(self.directory, key + ".json"),
                             {"content": content}, indent=None, default=None)


class ChatBackend:
  """Sends role prompts through an `api_client.ChatModel`, with the response cache."""

  def __init__(self, chat, cache_dir: str | None = None, temperature: float = 0.0,
               max_tokens: int | None = 512):
    self.chat = chat
    self.cache = ResponseCache(cache_dir) if cache_dir else None
    self.temperature = temperature
    self.max_tokens = max_tokens
    self.hits = 0
    self.misses = 0
    self._lock = threading.Lock()

  def ask(self, role: str, system: str, user: str) -> str:
    """The model's answer text to one role prompt."""
    messages = [{"role": "system", "content": f"[role:{role}] {system}"},
                {"role": "user", "content": user}]
    key = ResponseCache.key({"model": self.chat.model, "temperature": self.temperature,
                             "messages": messages})
    if self.cache is not None:
      hit = self.cache.get(key)
      if hit is not None:
        with self._lock:
          self.hits += 1
        return hit
    message = self.chat.complete(messages, temperature=self.temperature,
                                 max_tokens=self.max_tokens)
    content = message.get("content") or ""
    with self._lock:
      self.misses += 1
    if self.cache is not None:
      self.cache.put(key, content)
    return content


def parse_json_object(text: str) -> dict[str, Any] | None:
  """The first JSON object in a model answer (code fences and chatter allowed)."""
  m = _JSON_RE.search(text or "")
  if m is None:
    return None
  try:
    obj = json.loads(m.group(0))
  except ValueError:
    return None
  return obj if isinstance(obj, dict) else None


def _task_text(ctx: Context) -> str:
  return f"Task: {ctx.task.instruction}"


class ChatPlanner(Role):
  """Asks for sub-goals ``{"id", "need", "after"}``; levels from ``after``."""

  name = "planner"
  SYSTEM = ("You are the planner of a tool-using team. Split the task into sub-goals, "
            "one per tool call it needs. Reply with JSON only: {\"subgoals\": [{\"id\": "
            "\"s1\", \"need\": \"a search query for the tool\", \"after\": [ids of "
            "sub-goals whose results it needs]}]}")

  def __init__(self, backend: ChatBackend):
    self.backend = backend

  def act(self, context: Context) -> RoleOutput:
    obj = parse_json_object(self.backend.ask(self.name, self.SYSTEM, _task_text(context)))
    raw = obj.get("subgoals") if obj else None
    goals: list[SubGoal] = []
    if isinstance(raw, list):
      for i, g in enumerate(raw):
        if isinstance(g, dict) and isinstance(g.get("need"), str):
          after = g.get("after") if isinstance(g.get("after"), list) else []
          goals.append(SubGoal(id=str(g.get("id", f"s{i + 1}")), need=g["need"],
                               deps=[str(a) for a in after]))
    if not goals:  # An unusable plan: one sub-goal, the whole task.
      goals = [SubGoal(id="s1", need=context.task.instruction[:120])]
    ids = {g.id for g in goals}
    level: dict[str, int] = {}
    for _ in goals:  # Longest-path levels; unknown or cyclic deps are dropped.
      for g in goals:
        g.deps = [d for d in g.deps if d in ids and d != g.id]
        level[g.id] = 1 + max((level.get(d, 0) for d in g.deps), default=-1)
    for g in goals:
      g.level = min(level[g.id], len(goals) - 1)
    return RoleOutput(self.name, plan=goals,
                      thought=f"Plan: {len(goals)} sub-goal(s).")


class ChatExplorer(Role):
  """Proposes a search query, then picks a tool from the results or retries."""

  name = "explorer"
  SYSTEM = ("You are an explorer: find the catalog tool for one sub-goal. Reply with "
            "JSON only: {\"query\": \"search words\"} to search, or {\"tool\": \"name\"} "
            "once a listed tool does the sub-goal.")

  def __init__(self, backend: ChatBackend, max_attempts: int = 3):
    self.backend = backend
    self.max_attempts = max_attempts

  def act(self, context: Context) -> RoleOutput:
    sg = context.subgoal
    user = f"{_task_text(context)}\nSub-goal {sg.id}: {sg.need}"
    if context.search_block is not None:
      user += f"\nSearch results:\n{context.search_block}"
    obj = parse_json_object(self.backend.ask(self.name, self.SYSTEM, user)) or {}
    if context.search_block is not None and isinstance(obj.get("tool"), str):
      return RoleOutput(self.name, tool=obj["tool"])
    if context.attempt >= self.max_attempts:
      return RoleOutput(self.name)
    query = obj.get("query") if isinstance(obj.get("query"), str) else sg.need
    return RoleOutput(self.name, call=Call(SEARCH_TOOLS, {"query": query}))


class ChatExecutor(Role):
  """Asks for one ParaAct execute step: one call per listed sub-goal, in order."""

  name = "executor"
  SYSTEM = ("You are the executor. Write ONE execute step with one call per listed "
            "sub-goal, in the listed order, using earlier results for dependent "
            "values. Format:\n<execute> short thought\n<call>{\"name\": \"tool\", "
            "\"arguments\": {...}}</call>\n</step>")

  def __init__(self, backend: ChatBackend):
    self.backend = backend

  def act(self, context: Context) -> RoleOutput:
    run = [s for s in context.ready if s.id in context.errors] if context.errors else list(
        context.ready)
    lines = [_task_text(context), "Tools:"]
    for s in run:
      tool = context.tools.get(s.id, "?")
      lines.append(f"- {context.tool_info.get(tool, tool)}")
    if context.results:
      lines.append("Results so far:")
      lines += [f"- {sid}: {block[:600]}" for sid, block in context.results.items()]
    for sid, (call, block) in context.errors.items():
      lines.append(f"Failed: {sid}: {protocol.dump_call_json(call)} -> {block[:300]}")
    lines.append("RUN: " + json.dumps([s.id for s in run]))
    lines += [f"- {s.id}: {s.need} (tool {context.tools.get(s.id, '?')})" for s in run]
    step = protocol.parse_step(self.backend.ask(self.name, self.SYSTEM, "\n".join(lines)))
    calls = list(step.calls) if isinstance(step.calls, list) else []
    return RoleOutput(self.name, calls=[(s.id, c) for s, c in zip(run, calls)],
                      thought=step.thought or f"Run {len(calls)} call(s) together.")


class ChatAnswerer(Role):
  """Writes the final answer from the successful results."""

  name = "answerer"
  SYSTEM = ("You are the answerer. Using the results, answer the task in one short "
            "line that states every requested value exactly as it appears.")

  def __init__(self, backend: ChatBackend):
    self.backend = backend

  def act(self, context: Context) -> RoleOutput:
    lines = [_task_text(context), "Results:"]
    lines += [f"- {sid}: {block[:800]}" for sid, block in context.results.items()]
    text = self.backend.ask(self.name, self.SYSTEM, "\n".join(lines))
    text = text.replace(protocol.ANSWER_OPEN, "").replace(protocol.ANSWER_CLOSE, "")
    return RoleOutput(self.name, answer=" ".join(text.split()))


class _PoolMap:
  """``map`` over a shared thread pool (explorers of one episode at once)."""

  def __init__(self, max_workers: int):
    self.pool = concurrent.futures.ThreadPoolExecutor(max_workers,
                                                      thread_name_prefix="explorer")

  def __call__(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    items = list(items)
    if len(items) <= 1:
      return [fn(x) for x in items]
    return list(self.pool.map(fn, items))


def chat_roles(chat, cache_dir: str | None = None, max_workers: int = 8,
               temperature: float = 0.0, concurrent_episodes: int | None = None) -> RoleSet:
  """The chat backend over ``chat`` (an `api_client.ChatModel`)."""
  backend = ChatBackend(chat, cache_dir=cache_dir, temperature=temperature)
  roles = RoleSet(planner=ChatPlanner(backend), explorer=ChatExplorer(backend),
                  executor=ChatExecutor(backend), answerer=ChatAnswerer(backend),
                  map=_PoolMap(max_workers),
                  concurrent_episodes=max_workers if concurrent_episodes is None
                  else concurrent_episodes, name="chat")
  roles.backend = backend  # type: ignore[attr-defined]  # for hit/miss counts
  return roles


def run_ids(prompt: str) -> Sequence[str]:
  """The sub-goal ids of an executor prompt's ``RUN:`` line (for test servers)."""
  m = re.search(r"^RUN: (\[.*\])$", prompt, re.M)
  return json.loads(m.group(1)) if m else []
