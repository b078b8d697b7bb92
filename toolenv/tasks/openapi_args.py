"""What an OpenAPI task says: argument values a user would give, and its words.

`arg_value` draws a value for a parameter from its schema and name (enums,
ids, dates, emails, limits...), so the simulator accepts it; `action_phrase`,
`words` and `args_text` render an operation's summary and arguments into the
instruction, which states every value (`say`).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from toolenv.catalog import vocab
from toolenv.catalog.valueflow import id_resource, singular
from toolenv.tasks.base import QUERY_WORDS
from toolenv.values import make_id

_VERBS = frozenset(
    "accept activate add analyze apply approve archive assign attach block book "
    "calculate cancel change charge check clear close complete configure confirm "
    "deactivate detach edit enumerate execute follow invoke like link pause pay "
    "print purchase refund reject render reserve resume scan share sign tag "
    "trigger unblock unfollow unlink "
    "compute convert copy count create delete describe detect disable download "
    "enable estimate export fetch find generate get import insert invite join "
    "list lookup look mark merge modify move obtain patch post publish put "
    "query read register remove rename replace report request reset resolve "
    "restore retrieve return revoke run save search send set show start stop "
    "submit subscribe suggest sync test track transfer translate unsubscribe "
    "update upload upsert validate verify view".split())


def words(name: str) -> str:
  """``AuctionValuePPR`` / ``pet_id`` -> ``auction value ppr`` / ``pet id``."""
  s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", str(name))
  s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", s)
  return re.sub(r"[^0-9A-Za-z]+", " ", s).strip().lower() or "value"


def action_phrase(description: str) -> str:
  """A verb phrase from an operation summary: ``Returns a pet`` -> ``return a pet``;
  a noun phrase gets ``get the`` in front."""
  first = re.split(r"(?<=[a-z0-9)])\.\s", description.strip(), maxsplit=1)[0]
  first = first.rstrip(" .;:")
  if len(first) > 110:
    first = first[:110].rsplit(" ", 1)[0].rstrip(",;:") + "..."
  head, _, rest = first.partition(" ")
  low = head.lower()
  base = low[:-1] if low.endswith("s") and low[:-1] in _VERBS else low
  if low.endswith("ies") and low[:-3] + "y" in _VERBS:   # "Queries" -> query
    base = low[:-3] + "y"
  elif low.endswith("es") and low[:-2] in _VERBS:        # "Searches" -> search
    base = low[:-2]
  if base in _VERBS:
    return f"{base} {rest}".strip()
  if len(head) > 1 and head[1:2].islower():
    first = head[0].lower() + head[1:] + (" " + rest if rest else "")
  return f"get the {first}"



def arg_value(name: str, sch: dict[str, Any], rng: random.Random, entity: str = "") -> Any:
  """A value for parameter ``name`` that its schema accepts and a user might say."""
  sch = sch if isinstance(sch, dict) else {}
  if sch.get("enum"):
    return rng.choice(list(sch["enum"]))
  t = sch.get("type", "string")
  n = name.lower()
  if t == "boolean":
    return rng.random() < 0.5
  if t == "array":
    item = sch.get("items") or {}
    return [arg_value(singular(name), item, rng, entity) for _ in range(rng.randint(1, 2))]
  if t == "integer":
    if re.search(r"limit|size|count|per_?page|max|top|num", n):
      return rng.randint(2, 20)
    if re.search(r"page|offset|skip|start", n):
      return rng.randint(1, 5)
    if "year" in n:
      return rng.randint(2015, 2026)
    if "month" in n:
      return rng.randint(1, 12)
    if "day" in n:
      return rng.randint(1, 28)
    return rng.randint(1, 99_999) if id_resource(name) is not None else rng.randint(1, 500)
  if t == "number":
    if n.startswith("lat"):
      return round(rng.uniform(-60, 60), 4)
    if n.startswith(("lon", "lng")):
      return round(rng.uniform(-150, 150), 4)
    return round(rng.uniform(1, 500), 2)
  res = id_resource(name)
  if res is not None:
    prefix = re.sub(r"[^a-z]", "", (res or entity or "id"))[:3] or "id"
    return make_id(prefix, "task", rng.random())
  if "email" in n:
    return f"{rng.choice(vocab.FIRST)}.{rng.choice(vocab.LAST)}@example.com".lower()
  if re.search(r"time|timestamp|datetime|_at$|At$", name):
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
  if "date" in n or n in ("since", "until", "from", "to", "day"):
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
  if re.search(r"url|uri|link|website|callback|href", n):
    return f"https://example.com/{rng.choice(vocab.WORDS)}"
  if "phone" in n:
    return f"+1-555-01{rng.randint(10, 99)}"
  if "country" in n:
    return rng.choice(("US", "DE", "FR", "JP", "BR", "IN", "KE", "NO"))
  if re.search(r"lang|locale", n):
    return rng.choice(("en", "de", "fr", "es", "ja", "pt"))
  if "currency" in n:
    return rng.choice(("USD", "EUR", "GBP", "JPY", "CHF"))
  if "city" in n:
    return rng.choice(vocab.CITIES)
  if re.fullmatch(r"q|query|search|keywords?|term|text|filter", n):
    return rng.choice(QUERY_WORDS)
  if re.search(r"user|owner|login|account|author", n):
    return f"{rng.choice(vocab.WORDS)}{rng.randint(10, 99)}"
  if re.search(r"name|title|label", n):
    return f"{rng.choice(vocab.WORDS).capitalize()} {rng.randint(10, 99)}"
  return rng.choice(vocab.WORDS)


def say(v: Any) -> str:
  """How an argument value is written in an instruction."""
  if isinstance(v, bool):
    return "true" if v else "false"
  if isinstance(v, str):
    return f"'{v}'"
  if isinstance(v, list):
    return "[" + ", ".join(say(x) for x in v) + "]"
  return json.dumps(v)


def args_text(args: dict[str, Any]) -> str:
  """`` with limit 5 and q 'ember'`` for ``{"limit": 5, "q": "ember"}`` (or ``""``)."""
  parts = [f"{words(k)} {say(v)}" for k, v in args.items()]
  if not parts:
    return ""
  return " with " + (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1])


