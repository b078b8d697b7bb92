"""Builds the cold-start demonstrations dataset (stage ``demos`` of train.py).

    python -m paraagent_jax.train --config=configs/demo.py:stage=demos --workdir=/tmp/d

writes into ``out_dir``::

    demonstrations_train.jsonl   kept (successful) demonstrations, train split
    demonstrations_test.jsonl    a small test-split set (unseen providers)
    tasks_train.jsonl            every task attempted (Task.to_dict())
    tasks_test.jsonl
    stats.json                   statistics per split (see orchestrator.statistics)

Each demonstration line is::

    {"id", "task_id", "kind", "split", "strategy": "paraact",
     "messages": [{"role": "system"|"user"|"assistant"|"tool", "content"}...],
     "roles": [role per assistant message], "success", "turns", "calls"}

Config keys (``config.data``): catalog, num_tasks, backend ("scripted" or
"chat"), seed; optional: test_tasks (default max(8, num_tasks // 10)),
imperfection (dict of `roles.Imperfection` fields or a float scaling the
default mix; default the default mix), kinds, batch_size, chat (dict:
base_url, model, cache_dir, max_workers, temperature), search_top_k (the
scripted explorers pass it to ``search_tools``; 0 = the env's default 5),
thoughts ("full", "plan" or "none": see `orchestrator.Orchestrator`),
answer_style (the scripted answerer's, "label" or "json": see
`toolenv.oracle.answer_text`), obs_format (ToolEnv's observation format, "full" or "compact"; the policy's
evaluation and RL must use the same one).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Iterable

import toolenv
from paraagent_jax.coldstart import orchestrator as orch_lib
from paraagent_jax.coldstart import roles as roles_lib

CONTRACT_KEYS = ("id", "task_id", "kind", "split", "strategy", "messages", "roles",
                 "success", "turns", "calls")


def _get(cfg, key: str, default: Any) -> Any:
  getter = getattr(cfg, "get", None)
  if getter is not None:
    value = getter(key, default)
  else:
    value = getattr(cfg, key, default)
  return default if value is None else value


def imperfection_from(value: Any) -> roles_lib.Imperfection:
  """An `Imperfection` from a config value (None, float scale, or dict)."""
  if value is None:
    return roles_lib.Imperfection.default()
  if isinstance(value, (int, float)):
    d = roles_lib.Imperfection.default()
    return roles_lib.Imperfection(*(min(1.0, float(value) * x) for x in (
        d.vague_search, d.split_level, d.wrong_argument)))
  items = dict(value.items()) if hasattr(value, "items") else dict(value)
  return roles_lib.Imperfection(**items)


def write_jsonl_atomic(path: str, rows: Iterable[dict]) -> int:
  """Writes rows as JSON lines to ``path`` via a temp file and rename."""
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".jsonl")
  n = 0
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
      n += 1
  os.chmod(tmp, 0o644)  # mkstemp makes 0600; readers may be other users.
  os.replace(tmp, path)
  return n


def write_json_atomic(path: str, obj: Any) -> None:
  """Writes one JSON document atomically."""
  d = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.chmod(tmp, 0o644)
  os.replace(tmp, path)


def to_contract(record: dict) -> dict:
  """The demonstration line of an orchestrator record (contract keys only)."""
  row = dict(record, id=f"demo-{record['task_id']}")
  return {k: row[k] for k in CONTRACT_KEYS}


def make_roles(data_cfg, catalog, seed: int) -> roles_lib.RoleSet:
  """The role backend named by ``data_cfg.backend``."""
  backend = _get(data_cfg, "backend", "scripted")
  if backend == "scripted":
    top_k = int(_get(data_cfg, "search_top_k", 0)) or None
    return roles_lib.scripted_roles(catalog, imperfection_from(
        _get(data_cfg, "imperfection", None)), seed=seed, search_top_k=top_k,
        answer_style=str(_get(data_cfg, "answer_style", "label")))
  if backend == "chat":
    from paraagent_jax.api_client import ChatClient  # pylint: disable=g-import-not-at-top
    from paraagent_jax.coldstart import chat_roles  # pylint: disable=g-import-not-at-top
    chat = _get(data_cfg, "chat", {})
    chat = dict(chat.items()) if hasattr(chat, "items") else {}
    client = ChatClient(base_url=chat.get("base_url") or None,
                        model=chat.get("model", "gpt-4.1"))
    return chat_roles.chat_roles(client, cache_dir=chat.get("cache_dir") or None,
                                 max_workers=int(chat.get("max_workers", 8)),
                                 temperature=float(chat.get("temperature", 0.0)))
  raise ValueError(f"config.data.backend must be 'scripted' or 'chat', got {backend!r}")


def build_demonstrations(config, out_dir: str) -> dict:
  """Builds demonstrations and tasks for both splits into ``out_dir``.

  Args:
    config: the ml_collections config (reads ``config.data``).
    out_dir: output directory (created).

  Returns:
    The statistics dict (also written to ``stats.json``).
  """
  data = config.data
  seed = int(_get(data, "seed", 0))
  num_tasks = int(_get(data, "num_tasks", 100))
  num_test = int(_get(data, "test_tasks", max(8, num_tasks // 10)))
  kinds = tuple(_get(data, "kinds", ()) or toolenv.KINDS)   # () = all
  t0 = time.time()
  catalog = toolenv.load_catalog(_get(data, "catalog", "procedural"), seed=seed)
  gen = toolenv.TaskGenerator(catalog, seed=seed)
  roles = make_roles(data, catalog, seed)
  orch = orch_lib.Orchestrator(catalog, roles, batch_size=int(_get(data, "batch_size", 256)),
                               verbose=True, thoughts=str(_get(data, "thoughts", "full")),
                               obs_format=str(_get(data, "obs_format", "full")))
  os.makedirs(out_dir, exist_ok=True)
  stats: dict[str, Any] = {"backend": roles.name, "seed": seed}
  for split, n in (("train", num_tasks), ("test", num_test)):
    tasks = gen.generate(n, split=split, kinds=kinds)
    kept, st = orch.run(tasks)
    write_jsonl_atomic(os.path.join(out_dir, f"tasks_{split}.jsonl"),
                       (t.to_dict() for t in tasks))
    write_jsonl_atomic(os.path.join(out_dir, f"demonstrations_{split}.jsonl"),
                       (to_contract(r) for r in kept))
    print(f"[coldstart] split {split}: " + orch_lib.format_statistics(st), flush=True)
    stats[split] = st
  stats["build_seconds"] = round(time.time() - t0, 2)
  write_json_atomic(os.path.join(out_dir, "stats.json"), stats)
  print(f"[coldstart] wrote {out_dir} in {stats['build_seconds']:.1f}s", flush=True)
  return stats
