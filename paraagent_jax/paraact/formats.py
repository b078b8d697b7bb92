"""Protocol formats (``protocol.format``): how a ParaAct step is written.

* ``tags`` (the default; the CPU demo and its shipped policy): ``<call>{...}</call>``
  per call and ``</step>`` (`paraagent_jax.paraact.protocol`), turns through
  the project's chat template (`paraagent_jax.tokenizer.ChatEncoder`).
* ``qwen3``: one ``<tool_call>`` block per call, tool results as ``tool``
  messages, every turn through the tokenizer's own chat template
  (`paraagent_jax.paraact.qwen3_format`, `paraagent_jax.paraact.template_turns`).

A `StepFormat` is the step half (render, parse, the system prompt, where the
calls start); `chat_format.ChatFormat` pairs it with the turns.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from toolenv.schema import Step

from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.paraact import protocol
from paraagent_jax.paraact import qwen3_format

TAGS = "tags"
QWEN3 = "qwen3"


@dataclasses.dataclass(frozen=True)
class StepFormat:
  """The text of one step in one protocol format.

  Attributes:
    name: ``tags`` or ``qwen3`` (a config value).
    call_open: the text that opens a call (token kinds: action from there).
    render: `toolenv.Step` -> text of the assistant turn.
    parse: text -> `toolenv.Step`; never raises.
    system_prompt: extra paragraph -> the system prompt.
    stop_strings: strings that end a turn besides ``<|im_end|>``.
    chat_template: whether turns go through the tokenizer's chat template
      (else the project's `ChatEncoder`).
  """
  name: str
  call_open: str
  render: Callable[[Step], str]
  parse: Callable[[Any], Step]
  system_prompt: Callable[[str], str]
  stop_strings: tuple[str, ...]
  chat_template: bool


_REGISTRY = {
    TAGS: StepFormat(TAGS, protocol.CALL_OPEN, protocol.render_step, protocol.parse_step,
                     protocol.system_prompt, tok_lib.STOP_STRINGS, False),
    QWEN3: StepFormat(QWEN3, qwen3_format.TOOL_CALL_OPEN, qwen3_format.render_step,
                      qwen3_format.parse_step, qwen3_format.system_prompt, (), True),
}
FORMAT_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_format(name: str) -> StepFormat:
  """The format registered under ``name``."""
  if name not in _REGISTRY:
    raise ValueError(f"unknown protocol format {name!r}; expected one of "
                     f"{list(FORMAT_NAMES)}")
  return _REGISTRY[name]
