"""Clause fusion in `SearchIndex.search`: several needs in one query.

* `split_clauses` on hand-written queries (sentence ends, ``;``, ``Also:``,
  not at ``then``, not inside ``gitlab.com,``).
* On a hand-made catalog where one need's four near-duplicate tools fill
  the top of plain BM25, the fused ranking puts each clause's tool first;
  its scores equal a re-derivation by hand: numpy BM25 per clause (Lucene
  formula, provider words x `PROVIDER_WEIGHT`), then reciprocal-rank fusion
  ``sum w / (RRF_K + rank)`` with the whole query weighted `RRF_FULL_WEIGHT`.
* A query whose only other clause is short ("Tell me the id.") and a
  one-clause query keep their plain BM25 scores; ``clause_fusion=False``
  gives plain BM25 on a multi-clause query.
"""

import numpy as np
import pytest

import toolenv
from toolenv import search
from toolenv.search import SearchIndex, split_clauses, tokenize
from tests.toolenv.test_toolenv_search import _bm25_reference, _tool  # pylint: disable=g-bad-import-order


# The one hand-written Lucene BM25 of the search tests, and their tool maker.
_bm25 = _bm25_reference


@pytest.fixture(scope="module")
def catalog():
  tools = [
      _tool("acme_list_merge_requests", "Acme", "List the merge requests of a project."),
      _tool("acme_get_merge_request", "Acme", "Show one merge request of a project by id."),
      _tool("acme_merge_request_changes", "Acme", "Show the changes of a merge request."),
      _tool("acme_merge_request_notes", "Acme", "Show the notes of a merge request of a project."),
      _tool("acme_approve_merge_request", "Acme", "Approve a merge request."),
      _tool("geodb_find_cities", "Geodb", "Find cities by name prefix."),
      _tool("geodb_get_country", "Geodb", "Get a country by its name."),
      _tool("zorbo_list_cities", "Zorbo", "List cities by name."),
      _tool("zorbo_list_invoices", "Zorbo", "List invoices of a customer by name."),
      _tool("kaiam_get_city", "Kaiam", "Get a city by name."),
  ]
  return toolenv.Catalog(tools, name="custom")


def test_split_clauses_by_hand():
  q = ("On gitlab.com, show the merge request changes with id 'cha-1'; then use its "
       "id as the note id and show the note. Tell me the author? Also: Using the "
       "geodb API, find cities. also list invoices")
  assert split_clauses(q) == [
      "On gitlab.com, show the merge request changes with id 'cha-1';",
      "then use its id as the note id and show the note.",
      "Tell me the author?",
      "Using the geodb API, find cities.",
      "list invoices"]
  assert split_clauses("On Skyraly, find the station, then tell me its city.") == [
      "On Skyraly, find the station, then tell me its city."]
  assert split_clauses("  ") == []


def _reference(catalog, clauses, full):
  """Fused (name -> score) and the plain BM25 scores of ``full``, by hand."""
  docs = SearchIndex.documents(catalog)
  brands = {"acme", "geodb", "zorbo", "kaiam"}
  weights = lambda text: {t: (search.PROVIDER_WEIGHT if t in brands else 1.0)
                          for t in dict.fromkeys(tokenize(text))}
  plain = _bm25(docs, weights(full))
  fused = {}
  for w, sc in [(search.RRF_FULL_WEIGHT, plain)] + [(1.0, _bm25(docs, weights(c)))
                                                     for c in clauses]:
    ranked = sorted((i for i in range(len(docs)) if sc[i] > 0), key=lambda i: (-sc[i], i))
    for r, i in enumerate(ranked[:search.RRF_DEPTH]):
      fused[catalog.names[i]] = fused.get(catalog.names[i], 0.0) + w / (search.RRF_K + r)
  return fused, plain


def test_two_needs_each_get_a_slot(catalog):
  idx = SearchIndex.build(catalog)
  c1 = "On Acme, show the changes of one merge request of the project by id."
  c2 = "find cities by name prefix."
  q = f"{c1} Also: {c2}"
  fused, plain = _reference(catalog, [c1, c2], q)
  # Plain BM25: four Acme merge-request tools (acme x1.5, merge, request,
  # show, change, project, id) outscore the cities tool (city, name, prefix):
  # it is 4th.
  plain_top = [catalog.names[i] for i in np.argsort(-plain, kind="stable")[:4]]
  assert plain_top[0] == "acme_get_merge_request" and plain_top[3] == "geodb_find_cities"
  idx.clause_fusion = False
  assert [n for n, _ in idx.search(q, 4)] == plain_top
  idx.clause_fusion = True
  # Same (query, top_k) as the plain search just above, no cache_clear: the
  # setting is part of the memo key, so this is the fused ranking.
  assert [n for n, _ in idx.search(q, 4)][:2] == ["acme_get_merge_request", "geodb_find_cities"]
  got = idx.search(q, 10)
  # Fused: each clause's best tool is first in its own list, so both lead.
  assert [n for n, _ in got[:2]] == ["acme_get_merge_request", "geodb_find_cities"]
  want = sorted(fused.items(), key=lambda kv: (-kv[1], catalog.names.index(kv[0])))[:10]
  assert [n for n, _ in got] == [n for n, _ in want]
  for (_, s), (_, ref) in zip(got, want):
    assert s == pytest.approx(ref, abs=1e-4)
  # By hand: acme_get_merge_request is rank 0 of the whole query and of
  # clause 1, absent from clause 2 (no shared word); geodb_find_cities is
  # rank 3 of the whole query and rank 0 of clause 2.
  k, w = search.RRF_K, search.RRF_FULL_WEIGHT
  assert dict(got)["acme_get_merge_request"] == pytest.approx(w / k + 1 / k, abs=1e-4)
  assert dict(got)["geodb_find_cities"] == pytest.approx(w / (k + 3) + 1 / k, abs=1e-4)


def test_short_clause_and_single_clause_keep_bm25(catalog):
  idx = SearchIndex.build(catalog)
  docs = SearchIndex.documents(catalog)
  for q in ("On Acme, show the merge request changes. Tell me the id.",
            "On Acme, show the merge request changes, then tell me the author"):
    brands = {"acme", "geodb", "zorbo", "kaiam"}
    ref = _bm25(docs, {t: (search.PROVIDER_WEIGHT if t in brands else 1.0)
                       for t in dict.fromkeys(tokenize(q))})
    got = dict(idx.search(q, 10))
    assert len(got) == int((ref > 0).sum())
    for i, name in enumerate(catalog.names):
      assert got.get(name, 0.0) == pytest.approx(ref[i], abs=2e-4), (q, name)


def test_fusion_off_is_plain_bm25(catalog):
  idx = SearchIndex.build(catalog)
  idx.clause_fusion = False
  docs = SearchIndex.documents(catalog)
  q = "On Acme, show the merge request changes. Also: using Geodb, find cities by name."
  ref = _bm25(docs, {t: (search.PROVIDER_WEIGHT if t in {"acme", "geodb", "zorbo", "kaiam"} else 1.0)
                     for t in dict.fromkeys(tokenize(q))})
  got = dict(idx.search(q, 10))
  for i, name in enumerate(catalog.names):
    assert got.get(name, 0.0) == pytest.approx(ref[i], abs=2e-4), name
