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
thoughts ("full", "plan", "needs" or "none": see `orchestrator.Orchestrator`),
answer_style (the scripted answerer's, "label" or "json": see
`toolenv.oracle.answer_text`), obs_format (ToolEnv's observation format, "full" or "compact"; the policy's
evaluation and RL must use the same one).
"""

from __future__ import annotations

import os
import time
from typing import Any

from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import api_client
from paraagent_jax.coldstart import chat_roles
import toolenv
from paraagent_jax.coldstart import orchestrator as orch_lib
from paraagent_jax.coldstart import roles as roles_lib

CONTRACT_KEYS = ("id", "task_id", "kind", "split", "strategy", "messages", "roles",
                 "success", "turns", "calls")


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


def to_contract(record: dict) -> dict:
  """The demonstration line of an orchestrator record (contract keys only)."""
  row = dict(record, id=f"demo-{record['task_id']}")
  return {k: row[k] for k in CONTRACT_KEYS}


def make_roles(data_cfg, catalog, seed: int) -> roles_lib.RoleSet:
  """The role backend named by ``data_cfg.backend``."""
  data_cfg = config_utils.with_defaults(data_cfg, config_utils.demonstration_defaults())
  backend = data_cfg.backend
  if backend == "scripted":
    top_k = int(data_cfg.search_top_k) or None
    return roles_lib.scripted_roles(catalog, imperfection_from(
        data_cfg.imperfection), seed=seed, search_top_k=top_k,
        answer_style=str(data_cfg.answer_style))
  if backend == "chat":
    chat = data_cfg.chat
    chat = dict(chat.items()) if hasattr(chat, "items") else {}
    client = api_client.make_client(chat.get("base_url") or None,
                                    chat.get("api_key_env", "OPENAI_API_KEY"),
                                    max_retries=int(chat.get("max_retries", 4)))
    model = api_client.ChatModel(client, model=chat.get("model", "gpt-4.1"))
    return chat_roles.chat_roles(model, cache_dir=chat.get("cache_dir") or None,
                                 max_workers=int(chat.get("max_workers", 8)),
                                 temperature=float(chat.get("temperature", 0.0)))
  raise ValueError(f"config.data.backend must be 'scripted' or 'chat', got {backend!r}")


def build_demonstrations(config, out_dir: str) -> dict:
  """Builds demonstrations and tasks for both splits into ``out_dir``.

  Args:
    config: the ml_collections config (reads ``config.data`` and
      ``config.protocol.format``).
    out_dir: output directory (created).

  Returns:
    The statistics dict (also written to ``stats.json``).
  """
  data = config_utils.with_defaults(config.data, config_utils.demonstration_defaults())
  seed = int(data.seed)
  num_tasks = int(data.num_tasks)
  num_test = int(data.test_tasks) if data.test_tasks >= 0 else max(8, num_tasks // 10)
  kinds = tuple(data.kinds or toolenv.KINDS)   # () = all
  t0 = time.time()
  catalog = toolenv.load_catalog(data.catalog, seed=seed)
  gen = toolenv.TaskGenerator(catalog, seed=seed)
  roles = make_roles(data, catalog, seed)
  orch = orch_lib.Orchestrator(catalog, roles, batch_size=int(data.batch_size),
                               verbose=True, thoughts=str(data.thoughts),
                               obs_format=str(data.obs_format),
                               protocol_format=str((config.get("protocol") or {}).get(
                                   "format", "tags")))
  fileio.makedirs(out_dir)
  stats: dict[str, Any] = {"backend": roles.name, "seed": seed}
  for split, n in (("train", num_tasks), ("test", num_test)):
    tasks = gen.generate(n, split=split, kinds=kinds)
    kept, st = orch.run(tasks)
    fileio.write_jsonl_atomic(os.path.join(out_dir, f"tasks_{split}.jsonl"),
                              (t.to_dict() for t in tasks))
    fileio.write_jsonl_atomic(os.path.join(out_dir, f"demonstrations_{split}.jsonl"),
                              (to_contract(r) for r in kept))
    print(f"[coldstart] split {split}: " + orch_lib.format_statistics(st), flush=True)
    stats[split] = st
  stats["build_seconds"] = round(time.time() - t0, 2)
  fileio.write_json_atomic(os.path.join(out_dir, "stats.json"), stats)
  print(f"[coldstart] wrote {out_dir} in {stats['build_seconds']:.1f}s", flush=True)
  return stats
