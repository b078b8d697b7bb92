"""Catalog store, builder registry, procedural catalog and BM25 search (no JAX)."""

import os

import pytest

import toolenv
from toolenv import catalog as catalog_lib
from toolenv.catalog import procedural
from toolenv.catalog.store import Catalog
from toolenv.search import SearchIndex, tokenize, param_signature


def _tool(name, provider="Acme", desc="does things"):
  return toolenv.Tool(name=name, category="misc", provider=provider,
                      description=desc,
                      parameters={"type": "object", "required": ["x"],
                                  "properties": {"x": {"type": "integer"},
                                                 "u": {"type": "string", "enum": ["a", "b"],
                                                       "default": "a"}}})


def test_store_roundtrip_and_lazy_decode(tmp_path):
  cat = Catalog([_tool("t1"), _tool("t2", "Beta")], name="mini")
  cat.save(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["columns.json", "manifest.json", "tools.jsonl"]
  back = Catalog.load(str(tmp_path))
  assert len(back) == 2 and back.names == ["t1", "t2"] and "t2" in back
  assert back._tools == [None, None]          # nothing decoded yet
  assert back["t2"] == cat["t2"] and back.get("nope") is None and back.get(3) is None
  assert back.fingerprint == cat.fingerprint
  assert back.providers() == {"Acme": ["t1"], "Beta": ["t2"]}
  with pytest.raises(ValueError):
    cat.add(_tool("t1"))
  os.unlink(tmp_path / "manifest.json")       # an unfinished build is not read
  with pytest.raises(FileNotFoundError):
    Catalog.load(str(tmp_path))


def test_registry_dispatch_and_cache(tmp_path):
  calls = []

  def build(seed=0, n=3):
    calls.append(seed)
    return [_tool(f"x{seed}_{i}") for i in range(n)]

  catalog_lib.register_builder("unit_test_builder", build, version="1")
  a = toolenv.load_catalog("unit_test_builder", seed=4, cache_dir=str(tmp_path))
  b = toolenv.load_catalog("unit_test_builder", seed=4, cache_dir=str(tmp_path))
  assert calls == [4] and len(a) == len(b) == 3 and b.names[0] == "x4_0"
  toolenv.load_catalog("unit_test_builder", seed=4, n=2, cache_dir=str(tmp_path))
  assert calls == [4, 4]                       # kwargs are part of the cache key
  with pytest.raises(KeyError):
    toolenv.load_catalog("no_such_catalog_xyz")


def test_procedural_catalog_size_and_determinism():
  small = procedural.build_catalog(seed=0, size=3000)
  again = procedural.build_catalog(seed=0, size=3000)
  other = procedural.build_catalog(seed=1, size=3000)
  assert len(small) == 3000 and small.fingerprint == again.fingerprint
  assert other.fingerprint != small.fingerprint
  kinds = {t.meta["kind"] for t in small}
  assert {"search", "list", "get", "create", "update", "delete", "stats"} <= kinds
  get = next(t for t in small if t.meta["kind"] == "get")
  idf = get.meta["id_field"]
  assert get.required == [idf] and get.meta["consumes"][idf].startswith(get.provider)
  lister = next(t for t in small if t.provider == get.provider and
                t.meta.get("entity") == get.meta["entity"] and t.meta["kind"] in ("search", "list"))
  assert get.meta["consumes"][idf] in lister.meta["produces"].values()


@pytest.mark.slow
def test_full_catalog_is_exactly_50011(tmp_path):
  cat = toolenv.load_catalog("procedural", seed=0, cache_dir=str(tmp_path))
  assert len(cat) == 50011 and len(set(cat.names)) == 50011
  assert len(set(cat.column("category"))) >= 45


def test_tokenize_and_signature_by_hand():
  assert tokenize("Get the weatherStations_list for Paris") == [
      "get", "weather", "station", "list", "paris"]
  assert param_signature(_tool("t")) == "(x*: int, u: a|b = a)"


def test_search_finds_tool_by_brand_and_capability():
  cat = procedural.build_catalog(seed=0, size=2000)
  idx = SearchIndex.build(cat)
  tool = next(t for t in cat if t.meta["kind"] == "stats")
  hits = [n for n, _ in idx.search(f"{tool.provider} {tool.meta['entity']} statistics", 5)]
  assert hits[0] == tool.name
  assert idx.search("", 5) == [] and idx.search(None, 5) == [] and idx.search("zzqx", 3) == []
  assert len(idx.search("get details", 50)) == 10      # top_k is capped
  lines = idx.search_text(f"{tool.provider} {tool.meta['entity']} statistics", 2).splitlines()
  assert len(lines) == 2 and lines[0].startswith(tool.name + ": ")
  assert lines[0].endswith("period*: day|week|month|year)")
