"""OpenAPI tasks: generator on 10 hand-written specs, oracle, determinism; and on a
catalog built from a generated OpenAPI directory by the real build (`tests/openapi_directory.py`).

The fixture (tests/fixtures/openapi_tasks) has 31 operations in 10 providers; the
expected pools below are counted by hand from the specs:

* chains (producer field -> consumer parameter, same tag and JSON type):
  crm list->get, create->get; music list->get, create_playlist->get_playlist;
  library search->get_book, get_book.authorId->get_author; petstore list->show,
  create->show; hotels, jobs, recipes, tickets, transit list->get: 13.
  Fanouts (the producer field is in a list): one per provider but weather,
  and music (string ``id``s, repeated by the simulator across items): 8.
* weather list_stations gives an integer stationId, get_station wants a
  string: no pair. petstore show_pet_by_id returns ``id`` for the ``petId`` it
  was given: it starts no chain.
* excluded: upload_photo (octet-stream body), create_deal and subscribe_alerts
  (required object argument), delete_pet (no response field to ask about).
"""

import collections
import hashlib
import json
import os
import random
import re

import pytest

from tests import openapi_directory
import toolenv
from toolenv import oracle
from toolenv.catalog import openapi
from toolenv.catalog.store import Catalog
from toolenv.executor import lookup, validate
from toolenv.schema import Tool
from toolenv.tasks import KINDS, SPLITS, BaseTaskGenerator, OpenAPITaskGenerator
from toolenv.tasks import openapi_args as to

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "openapi_tasks")


def fixture_catalog():
  return Catalog(openapi.parse_source(DATA), name="openapi")


@pytest.fixture(scope="module")
def cat():
  return fixture_catalog()


@pytest.fixture(scope="module")
def gen(cat):
  return toolenv.TaskGenerator(cat, seed=0)


@pytest.fixture(scope="module")
def tasks(gen):
  return {s: gen.generate(100, split=s) for s in SPLITS}


def run_oracle(cat, tasks, strategy):
  env = toolenv.VectorToolEnv(cat, num_envs=len(tasks), **oracle.env_options(strategy))
  env.reset(tasks)
  plans = [oracle.solve(t, strategy) for t in tasks]
  observations = [[] for _ in tasks]
  for k in range(max(len(p) for p in plans)):
    steps = [p[k] if k < len(p) and not d else None for p, d in zip(plans, env.done)]
    for i, res in enumerate(env.step(steps)):
      if res is not None:
        observations[i].append(res.observation)
  return [env.rewards(i) for i in range(len(tasks))], observations


def test_dispatch_and_hand_counted_pools(cat, gen):
  assert type(gen) is OpenAPITaskGenerator and isinstance(gen, BaseTaskGenerator)
  assert gen.stats["tools"] == 31 and gen.stats["callable"] == 28
  assert gen.stats["answerable"] == 27
  assert gen.stats["excluded"] == {"binary_body": 1, "no_answer_field": 1,
                                   "required_object_param": 2}
  # music's list of string "id"s feeds a fanout too: each list item is drawn
  # from its own key, so its ids differ (they once repeated: 8 pairs then).
  assert gen.stats["chain_pairs"] == 13 and gen.stats["fanout_pairs"] == 9
  pairs = {(p, c) for s in SPLITS for v in gen._pools["chain"][s].values()  # pylint: disable=protected-access
           for p, _, c, _ in v}
  assert ("petstore_create_pet", "petstore_show_pet_by_id") in pairs
  assert ("library_get_book", "library_get_author") in pairs
  assert not any(p == "weather_list_stations" for p, _ in pairs)
  assert not any(p == "petstore_show_pet_by_id" for p, _ in pairs)
  assert not any("upload_photo" in c or "delete_pet" in c for _, c in pairs)


def test_split_by_provider_hash_rederived(cat, gen, tasks):
  def split(provider):   # the rule of TaskGenerator.split_of, recomputed
    h = hashlib.blake2b("\x1f".join(["split", "0", provider]).encode(), digest_size=8)
    return "test" if int.from_bytes(h.digest(), "little") % 1000 < 200 else "train"

  for s in SPLITS:
    provs = {cat[n["tool"]].provider for t in tasks[s] for n in t.nodes}
    assert provs and all(split(p) == s for p in provs)
  train = {cat[n["tool"]].provider for t in tasks["train"] for n in t.nodes}
  test = {cat[n["tool"]].provider for t in tasks["test"] for n in t.nodes}
  assert train.isdisjoint(test)


def test_tasks_are_valid_and_every_value_is_in_the_instruction(cat, tasks):
  for s in SPLITS:
    assert collections.Counter(t.kind for t in tasks[s]) == {k: 20 for k in KINDS}
    for t in tasks[s]:
      assert t.split == s and t.answers
      providers = [cat[n["tool"]].provider for n in t.nodes if not n["deps"]]
      if t.kind in ("parallel", "mixed"):
        assert len(set(providers)) == len(providers) >= 2
      for n in t.nodes:
        tool = cat[n["tool"]]
        assert validate(tool, n["arguments"]) is None, (t.id, n)
        assert set(tool.required) <= set(n["arguments"])
        for k, v in n["arguments"].items():
          sch = tool.properties[k]
          if "enum" in sch:
            assert v in sch["enum"]
          if n["deps"] and k in (tool.meta.get("consumes") or {}):
            continue          # comes from the producer's response, not the user
          for x in (v if isinstance(v, list) else [v]):
            shown = json.dumps(x) if not isinstance(x, str) else x
            assert shown in t.instruction, (t.id, k, x, t.instruction)
      if t.kind == "fanout":
        assert len(t.nodes) in (3, 4) and all(n["deps"] == ["n0"] for n in t.nodes[1:])
      if t.kind == "chain":
        assert [n["level"] for n in t.nodes] == list(range(len(t.nodes)))


def test_argument_values_by_name_and_schema():
  rng = random.Random(0)
  for _ in range(20):
    assert re.fullmatch(r"2026-\d\d-\d\d", to.arg_value("due_date", {"type": "string"}, rng))
    assert re.fullmatch(r"[a-z]+\.[a-z]+@example\.com", to.arg_value("email", {}, rng))
    assert to.arg_value("units", {"type": "string", "enum": ["metric", "imperial"]}, rng) in (
        "metric", "imperial")
    assert 2 <= to.arg_value("limit", {"type": "integer"}, rng) <= 20
    assert re.fullmatch(r"pet-[0-9a-f]{6}", to.arg_value("petId", {"type": "string"}, rng))
    assert isinstance(to.arg_value("public", {"type": "boolean"}, rng), bool)
    tags = to.arg_value("tags", {"type": "array", "items": {"type": "string"}}, rng)
    assert isinstance(tags, list) and 1 <= len(tags) <= 2


def test_action_phrases_from_summaries():
  assert to.action_phrase("List all pets") == "list all pets"
  assert to.action_phrase("Returns a pet. Needs auth.") == "return a pet"
  assert to.action_phrase("Queries a single customer") == "query a single customer"
  assert to.action_phrase("Info for a specific pet") == "get the info for a specific pet"
  assert to.words("AuctionValuePPR") == "auction value ppr"
  assert to.words("pet_id") == "pet id"


def test_oracle_succeeds_on_every_task_and_strategy(cat, tasks):
  for s in SPLITS:
    for strategy in oracle.STRATEGIES:
      sub = tasks[s] if strategy == "paraact" else tasks[s][:50]
      parts, _ = run_oracle(cat, sub, strategy)
      failed = [t.id for t, p in zip(sub, parts) if not p.success]
      assert not failed, (s, strategy, failed[:5])
      assert all(p.completed == p.nodes and not p.truncated for p in parts)


def test_chain_argument_is_read_from_the_observed_response(cat, gen):
  # What the agent reads: the JSON block of the producer's call in the env's
  # observation; the consumer's gold id must be at the producer path there.
  pairs = {(p, c): (path, q) for s in SPLITS for v in gen._pools["chain"][s].values()  # pylint: disable=protected-access
           for p, path, c, q in v}
  seen = 0
  for i in range(20):
    t = gen.task(i, "train", "fanout" if i % 2 else "chain")
    _, obs = run_oracle(cat, [t], "react")
    blocks = [o.split(": ", 1) for o in obs[0] if o.startswith("[1] ")]
    responses = {}                       # tool -> responses in call order
    for head, body in blocks:
      if not head.endswith("search_tools"):
        responses.setdefault(head[4:], []).append(json.loads(body))
    prod = t.nodes[0]
    for j, n in enumerate(t.nodes[1:]):
      if n["deps"] != ["n0"]:
        continue
      path, param = pairs[(prod["tool"], n["tool"])]
      want = lookup(responses[prod["tool"]][0],
                    path.replace("[]", f"[{j if t.kind == 'fanout' else 0}]"))
      assert want is not None and n["arguments"][param] == want
      seen += 1
  assert seen >= 20


def _digest(tasks):
  h = hashlib.sha256()
  for t in tasks:
    h.update(json.dumps(t.to_dict(), sort_keys=True).encode())
  return h.hexdigest()


def test_same_seed_same_tasks_other_seed_differs(gen, tasks):
  again = toolenv.TaskGenerator(fixture_catalog(), seed=0)
  for s in SPLITS:
    assert _digest(again.generate(100, split=s)) == _digest(tasks[s])
    assert _digest(again.generate(100, split=s)[:7]) == _digest(tasks[s][:7])
  # generate deals kinds round-robin: task 39 is the 8th mixed one, task(39, .., "mixed").
  assert gen.task(39, "test", "mixed").to_dict() == tasks["test"][39].to_dict()
  other = toolenv.TaskGenerator(fixture_catalog(), seed=1)
  assert _digest(other.generate(100, split="train")) != _digest(tasks["train"])


def test_built_catalog_oracle_sample(tmp_path_factory):
  # The registry's catalog built from a generated directory and loaded from its
  # cache (lazy store), as the 50,011-tool catalog is: the generator's pools
  # and the oracle work at that end of the pipeline too.
  cat = openapi_directory.build(str(tmp_path_factory.mktemp("openapi_dir")))
  gen = toolenv.TaskGenerator(cat, seed=0)
  assert type(gen) is OpenAPITaskGenerator
  # The real catalog: > 80% callable, chain pairs > 20% of the tools.
  assert gen.stats["callable"] > 0.8 * len(cat) and gen.stats["chain_pairs"] > 0.2 * len(cat)
  # Only the uploads (every fourth small provider) are left out.
  assert gen.stats["excluded"] == {"binary_body": openapi_directory.NUM_SMALL // 4}
  for s in SPLITS:
    sample = gen.generate(40, split=s)
    parts, _ = run_oracle(cat, sample, "paraact")
    assert all(p.success and p.completed == p.nodes for p in parts), s


def test_ranges_in_order_and_shared_arguments_kept(gen):
  s = {"type": "string"}
  tool = Tool("x_report", "c", "x.test", "Get a report", source="openapi", parameters={
      "type": "object", "required": ["startDate", "EndDate", "admin", "photo", "org_id"],
      "properties": {"startDate": s, "EndDate": s, "admin": s, "photo": s, "org_id": s}})
  g = gen
  for i in range(30):
    args = g._args(random.Random(i), tool, same={"org_id": "org-000001"})  # pylint: disable=protected-access
    assert args["startDate"] <= args["EndDate"]        # ISO dates compare as strings
    assert args["org_id"] == "org-000001"
  # "admin" / "photo" are no range ends: left as drawn (not always ordered).
  drawn = [g._args(random.Random(i), tool) for i in range(30)]  # pylint: disable=protected-access
  assert any(a["admin"] > a["photo"] for a in drawn)
