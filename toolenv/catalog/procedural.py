"""A seeded procedural catalog organised like an API marketplace.

About 50 categories (``vocab.CATEGORIES``); within each, providers with a
one-word brand (``Skyraly``) offer operations on two or three of the
category's resources: ``search``, ``list``, ``get``, ``create``, ``update``,
``delete``, ``stats``, and sometimes a unit ``convert``. Names look like
``skyraly_get_station``; descriptions name the brand and the capability.

Value flow: a resource's id field (``station_id``) is produced by search/list
results and create responses and consumed by get/update/delete/stats of the
same provider. Builders of real catalogs need not say so (the flow analysis
matches field names), but this one records it in ``Tool.meta``:

    meta = {"kind": "get", "entity": "station", "id_field": "station_id",
            "id_prefix": "sta", "produces": {"station_id": TAG},
            "consumes": {"station_id": TAG}}

with ``TAG = "<provider>/station_id"`` and produces keys written as response
paths (``results[].station_id``).

    toolenv.load_catalog("procedural", seed=0)   # 50,011 tools, cached
"""

from __future__ import annotations

import random
from typing import Any

from toolenv.catalog import vocab
from toolenv.catalog.store import Catalog
from toolenv.schema import Tool

DEFAULT_SIZE = 50_011
CATALOG_VERSION = "2"
OPS = ("search", "list", "get", "create", "update", "delete", "stats")
# Probability that a provider offers each operation on a resource it covers.
_OP_PROB = {"search": 0.75, "list": 0.75, "get": 1.0, "create": 0.45,
            "update": 0.45, "delete": 0.3, "stats": 0.45}
_GEN_OF = {"city": "city", "country": "country", "person": "person",
           "word": "word", "code": "code", "date": "date"}


def _field_schema(ftype: str, fname: str) -> dict[str, Any]:
  """JSON Schema of one resource field (with an ``x-gen`` value hint)."""
  if "|" in ftype:
    return {"type": "string", "enum": ftype.split("|")}
  if ftype == "int":
    return {"type": "integer", "minimum": 0, "maximum": 5000}
  if ftype == "num":
    return {"type": "number", "minimum": 0, "maximum": 1000}
  if ftype == "lat":
    return {"type": "number", "minimum": -60, "maximum": 70, "x-gen": "lat"}
  if ftype == "lon":
    return {"type": "number", "minimum": -180, "maximum": 180, "x-gen": "lon"}
  if ftype == "date":
    return {"type": "string", "format": "date"}
  if ftype in _GEN_OF:
    return {"type": "string", "x-gen": _GEN_OF[ftype]}
  raise ValueError(f"bad field type {ftype!r} for {fname}")


def parse_resource(spec: str) -> dict[str, Any]:
  """Parses ``"noun: f=a|b; g:int"`` into noun, fields, filter and update field."""
  noun, _, rest = spec.partition(":")
  fields: list[tuple[str, str]] = []
  for part in rest.split(";"):
    part = part.strip()
    if not part:
      continue
    if "=" in part:
      name, ftype = part.split("=", 1)
    else:
      name, ftype = part.split(":", 1)
    fields.append((name.strip(), ftype.strip()))
  enum_field = next(f for f, t in fields if "|" in t)
  upd_field = next(f for f, t in fields if "|" not in t)
  return {"noun": noun.strip(), "fields": fields, "filter": enum_field,
          "update": upd_field}


def _words(noun: str) -> str:
  return noun.replace("_", " ")


def _plural(noun: str) -> str:
  w = _words(noun)
  if w.endswith("y") and w[-2:-1] not in "aeiou":
    return w[:-1] + "ies"
  if w.endswith(("s", "x", "ch", "sh")):
    return w + "es"
  return w + "s"


def _pick(rng: random.Random, options: tuple[str, ...]) -> str:
  return options[rng.randrange(len(options))]


_DESC = {
    "search": ("{B}: search {P} by keyword and return the top matches with their ids.",
               "Search {B} {P} matching a free-text query; returns ids and names.",
               "{B} {N} search: find {P} whose name matches keywords."),
    "list": ("{B}: list {P} filtered by {F}; returns ids and names.",
             "List {B} {P} with a given {F}.",
             "{B} {N} listing: browse {P} by {F}."),
    "get": ("{B}: get the details of a {N} by its id ({D}).",
            "Look up one {B} {N} by id and return its details: {D}.",
            "{B} {N} details by id: {D}."),
    "create": ("{B}: create a new {N} with a name and {U}; returns the new id.",
               "Create a {B} {N} (name, {U}).",
               "{B}: register a new {N} given its name and {U}."),
    "update": ("{B}: update the {U} of an existing {N}.",
               "Change the {U} of a {B} {N} by id.",
               "{B}: set a new {U} on a {N}."),
    "delete": ("{B}: delete a {N} by its id.",
               "Remove (cancel) a {B} {N} by id.",
               "{B}: permanently delete one {N}."),
    "stats": ("{B}: statistics of a {N} for a period (count and average).",
              "Period statistics (count, average) of a {B} {N} by id.",
              "{B} {N} statistics: count and average over a day, week, month or year."),
    "convert": ("{B}: convert a {Q} amount between units ({UL}).",
                "Convert {Q} values on {B}: {UL}.",
                "{B} {Q} converter ({UL})."),
}


def _item_schema(res: dict[str, Any]) -> dict[str, Any]:
  idf = res["noun"] + "_id"
  f0 = res["filter"]
  ftype = dict(res["fields"])[f0]
  return {"type": "object",
          "properties": {idf: {"type": "string"},
                         "name": {"type": "string", "x-gen": "title"},
                         f0: _field_schema(ftype, f0)}}


def _tool(brand: str, provider: str, category: str, op: str,
          res: dict[str, Any] | None, rng: random.Random,
          conv: tuple[str, tuple[str, ...]] | None = None) -> Tool:
  """One operation of one provider as a `Tool` (one draw from ``rng``: the
  description's wording)."""
  if op == "convert":
    return _convert_tool(brand, provider, category, conv, rng)
  noun = res["noun"]
  idf = noun + "_id"
  desc = _pick(rng, _DESC[op]).format(
      B=provider, N=_words(noun), P=_plural(noun), F=_words(res["filter"]),
      U=_words(res["update"]), D=", ".join(_words(f) for f in dict(res["fields"])))
  if op not in _ENTITY_OPS:
    raise ValueError(op)
  name, props, req, resp, effect = _ENTITY_OPS[op](brand, res)
  # The id's value flow: search/list results and create responses produce
  # it, get/update/delete/stats consume it (get also returns it).
  tag = f"{provider}/{idf}"
  produces: dict[str, str] = {}
  consumes: dict[str, str] = {}
  if op in ("search", "list"):
    produces[f"{'results' if op == 'search' else 'items'}[].{idf}"] = tag
  if op in ("get", "create"):
    produces[idf] = tag
  if op in ("get", "update", "delete", "stats"):
    consumes[idf] = tag
  return Tool(name=name, category=category, provider=provider, description=desc,
              parameters={"type": "object", "properties": props, "required": req},
              response=resp, effect=effect, source="procedural",
              meta={"kind": op, "entity": noun, "id_field": idf,
                    "id_prefix": noun[:3], "produces": produces,
                    "consumes": consumes, "update_field": res["update"],
                    "filter_field": res["filter"]})


def _convert_tool(brand: str, provider: str, category: str,
                  conv: tuple[str, tuple[str, ...]], rng: random.Random) -> Tool:
  """A provider's unit converter for the quantity ``conv = (q, units)``."""
  q, units = conv
  desc = _pick(rng, _DESC["convert"]).format(B=provider, Q=_words(q),
                                               UL=", ".join(units))
  params = {"type": "object", "required": ["amount", "from_unit", "to_unit"],
            "properties": {
                "amount": {"type": "number", "description": f"The {_words(q)} amount."},
                "from_unit": {"type": "string", "enum": list(units),
                              "description": "Unit of the amount."},
                "to_unit": {"type": "string", "enum": list(units),
                            "description": "Unit to convert to."},
                "precision": {"type": "integer", "default": 2, "minimum": 0,
                              "maximum": 6, "description": "Decimal places."}}}
  resp = {"type": "object", "properties": {
      "result": {"type": "number"}, "to_unit": {"type": "string", "enum": list(units)},
      "rate": {"type": "number"}}}
  return Tool(name=f"{brand}_convert_{q}", category=category, provider=provider,
              description=desc, parameters=params, response=resp, effect="read",
              source="procedural",
              meta={"kind": "convert", "quantity": q, "units": list(units),
                    "produces": {}, "consumes": {}})


# Each entity operation's (name, parameter properties, required, response
# schema, effect), from the brand and the parsed resource.

def _id_param(res) -> dict[str, Any]:
  return {"type": "string",
          "description": f"Id of the {_words(res['noun'])} (e.g. from a search)."}


def _search_or_list(op: str):
  def build(brand, res):
    noun, fields = res["noun"], dict(res["fields"])
    key = "results" if op == "search" else "items"
    if op == "search":
      props = {"query": {"type": "string",
                         "description": f"Keywords to match in {_words(noun)} names."}}
      req = ["query"]
    else:
      f0 = res["filter"]
      props = {f0: {**_field_schema(fields[f0], f0),
                    "description": f"Only {_plural(noun)} with this {_words(f0)}."}}
      req = [f0]
    props["limit"] = {"type": "integer", "default": 3, "minimum": 1, "maximum": 5,
                      "description": "How many results to return."}
    resp = {"type": "object", "properties": {
        key: {"type": "array", "maxItems": 5, "items": _item_schema(res)},
        "count": {"type": "integer", "minimum": 0, "maximum": 500}}}
    return (f"{brand}_{op}_{_plural(noun).replace(' ', '_')}", props, req, resp,
            "read")
  return build


def _get(brand, res):
  noun, idf = res["noun"], res["noun"] + "_id"
  record = {"type": "object", "properties": {
      idf: {"type": "string"}, "name": {"type": "string", "x-gen": "title"},
      **{f: _field_schema(t, f) for f, t in res["fields"]}}}
  return f"{brand}_get_{noun}", {idf: _id_param(res)}, [idf], record, "read"


def _create(brand, res):
  noun, idf, upd = res["noun"], res["noun"] + "_id", res["update"]
  props = {"name": {"type": "string", "description": f"Name of the new {_words(noun)}."},
           upd: {**_field_schema(dict(res["fields"])[upd], upd),
                 "description": f"The {_words(upd)} of the new {_words(noun)}."}}
  resp = {"type": "object", "properties": {
      idf: {"type": "string"}, "status": {"type": "string", "enum": ["created"]}}}
  return f"{brand}_create_{noun}", props, ["name", upd], resp, "write"


def _update(brand, res):
  noun, idf, upd = res["noun"], res["noun"] + "_id", res["update"]
  props = {idf: _id_param(res),
           upd: {**_field_schema(dict(res["fields"])[upd], upd),
                 "description": f"New {_words(upd)}."}}
  resp = {"type": "object", "properties": {
      idf: {"type": "string"}, upd: _field_schema(dict(res["fields"])[upd], upd),
      "status": {"type": "string", "enum": ["updated"]}}}
  return f"{brand}_update_{noun}_{upd}", props, [idf, upd], resp, "write"


def _delete(brand, res):
  noun, idf = res["noun"], res["noun"] + "_id"
  props = {idf: _id_param(res),
           "reason": {"type": "string", "description": "Optional note kept in the log."}}
  resp = {"type": "object", "properties": {
      idf: {"type": "string"}, "status": {"type": "string", "enum": ["deleted"]}}}
  return f"{brand}_delete_{noun}", props, [idf], resp, "write"


def _stats(brand, res):
  noun, idf = res["noun"], res["noun"] + "_id"
  periods = ["day", "week", "month", "year"]
  props = {idf: _id_param(res),
           "period": {"type": "string", "enum": periods,
                      "description": "Aggregation period."}}
  resp = {"type": "object", "properties": {
      idf: {"type": "string"},
      "period": {"type": "string", "enum": list(periods)},
      "count": {"type": "integer", "minimum": 0, "maximum": 900},
      "average": {"type": "number", "minimum": 0, "maximum": 100}}}
  return f"{brand}_get_{noun}_stats", props, [idf, "period"], resp, "read"


_ENTITY_OPS = {"search": _search_or_list("search"), "list": _search_or_list("list"),
               "get": _get, "create": _create, "update": _update,
               "delete": _delete, "stats": _stats}


def brand_names(rng: random.Random) -> list[str]:
  """All distinct one-token brand names, shuffled by ``rng``."""
  out = sorted({a + b + c for a in vocab.BRAND_ONSETS for b in vocab.BRAND_MIDDLES
                for c in vocab.BRAND_ENDINGS})
  rng.shuffle(out)
  return out


def build_catalog(seed: int = 0, size: int = DEFAULT_SIZE) -> Catalog:
  """Builds ``size`` tools deterministically from ``seed``.

  Providers are dealt round-robin over the categories until ``size`` tools
  exist; the last provider is cut to make the count exact.
  """
  rng = random.Random(f"procedural-{seed}")
  cats = list(vocab.CATEGORIES)
  parsed = {c: [parse_resource(s) for s in vocab.CATEGORIES[c][0]] for c in cats}
  brands = iter(brand_names(rng))
  tools: list[Tool] = []
  k = 0
  while len(tools) < size:
    cat = cats[k % len(cats)]
    k += 1
    brand = next(brands)
    provider = brand.capitalize()
    resources = parsed[cat]
    chosen = rng.sample(resources, rng.choice((2, 2, 3)))
    for res in chosen:
      for op in OPS:
        if op == "get" or rng.random() < _OP_PROB[op]:
          tools.append(_tool(brand, provider, cat, op, res, rng))
      if not any(t.meta.get("entity") == res["noun"] and t.meta["kind"] in ("search", "list")
                 and t.provider == provider for t in tools[-8:]):
        tools.append(_tool(brand, provider, cat, "search", res, rng))
    conv = vocab.CATEGORIES[cat][1]
    if conv is not None and rng.random() < 0.35:
      tools.append(_tool(brand, provider, cat, "convert", None, rng, conv))
  return Catalog(tools[:size], name="procedural",
                 info={"builder": "procedural", "seed": seed, "size": size,
                       "version": CATALOG_VERSION})
