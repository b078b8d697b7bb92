"""Turns through the tokenizer's own chat template, token-exact across turns.

The ``qwen3`` protocol format renders every turn with the HF tokenizer's chat
template (``apply_chat_template(messages, tools=...)``), so a real Qwen3
tokenizer and template give the tokens the model saw in pre-training. A
multi-turn rollout never re-tokenises its history: after each turn it appends
the template's new suffix. That is exact only if the template has the prefix
property: the rendering of the conversation up to turn k+1 starts with the
rendering up to turn k (as text and as token ids). `Conversation` checks it at
every turn and raises `TemplatePrefixError` naming the turn when it fails
(templates that drop thinking blocks from earlier turns or otherwise re-render
history do); `TemplateTurns.check` runs the same checks on a probe conversation
once, before anything is trained.

    turns = TemplateTurns(tokenizer)
    conv = turns.start([{"role": "system", ...}, {"role": "user", ...}])
    ids = conv.ids                       # the prompt, ending in the assistant opening
    suffix = conv.advance(text, {"role": "assistant", "content": text},
                          [{"role": "tool", "content": obs}], written_ids=out_ids)
"""

from __future__ import annotations

from typing import Any, Sequence

from toolenv.schema import Call, Step

from paraagent_jax import config_utils
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.paraact import qwen3_format

_SHOW = 60


class TemplatePrefixError(config_utils.ConfigError):
  """The chat template renders an earlier turn differently once later turns
  follow (a config error: the template is the run's choice; one line)."""


def _first_difference(a: Sequence, b: Sequence) -> int:
  n = min(len(a), len(b))
  return next((i for i in range(n) if a[i] != b[i]), n)


class TemplateTurns:
  """The tokenizer's chat template with the meta-tools, one conversation at a time.

  Attributes:
    tokenizer: a HF tokenizer with a chat template.
    tools: function schemas listed in the system turn.
    template: the Jinja template used (the tokenizer's unless one is given).
  """

  def __init__(self, tokenizer, tools: Sequence[dict] = qwen3_format.META_TOOL_SCHEMAS,
               chat_template: str | None = None):
    self.tokenizer = tokenizer
    self.tools = [dict(t) for t in tools]
    self.template = chat_template or getattr(tokenizer, "chat_template", None)
    if not self.template:
      raise ValueError("protocol.format=qwen3 needs a chat template: the tokenizer "
                       "has none and protocol.chat_template is empty")
    self._special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(
        tokenizer.get_added_vocab().values())

  def text(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
    """The template's rendering of ``messages``."""
    return self.tokenizer.apply_chat_template(
        list(messages), tools=self.tools, chat_template=self.template, tokenize=False,
        add_generation_prompt=add_generation_prompt)

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text``, no BOS/EOS added."""
    return list(self.tokenizer.encode(text, add_special_tokens=False))

  def last_special_end(self, ids: Sequence[int]) -> int:
    """One past the last special or added token in ``ids`` (0 if none)."""
    return next((i + 1 for i in range(len(ids) - 1, -1, -1) if ids[i] in self._special), 0)

  def start(self, messages: Sequence[dict]) -> "Conversation":
    """A conversation opened by ``messages`` (system, user), ready for the assistant."""
    return Conversation(self, messages)

  def encode_messages(self, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """Ids of a whole conversation and its loss mask (1 on what each assistant
    turn writes, up to and including its ``<|im_end|>``), built turn by turn
    as a rollout builds them (so they are also the template's ids: checked).

    Raises:
      TemplatePrefixError: the template breaks the prefix property.
    """
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"),
                 len(messages))
    conv = self.start(messages[:first])
    mask = [0] * len(conv.ids)
    i = first
    while i < len(messages):
      j = i + 1
      while j < len(messages) and messages[j]["role"] != "assistant":
        j += 1
      n_before = len(conv.ids)
      written = conv.advance(None, messages[i], messages[i + 1:j], final=j == len(messages))
      n_written = len(written)
      mask += [1] * n_written + [0] * (len(conv.ids) - n_before - n_written)
      i = j
    return conv.ids, mask

  def check(self, system: str) -> None:
    """Runs a probe episode (three turns, parallel calls, an answer) through
    the template and checks the prefix property and that each step renders as
    `qwen3_format.render_step` writes it.

    Raises:
      TemplatePrefixError: with the turn and the first differing text.
    """
    steps = [
        Step("explore", [Call("search_tools", {"query": "weather <city>"}),
                         Call("search_tools", {"query": "currency rate", "top_k": 3})],
             thought="find both tools"),
        Step("execute", [Call("get_weather", {"city": "Zürich"}),
                         Call("convert", {"amount": 100, "from": "EUR"}),
                         Call("get_time", {})], thought="all independent"),
        Step("answer", answer="12 C; 108 USD; 10:00")]
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "Weather in Zürich, 100 EUR in USD, time?"}]
    conv = self.start(messages)
    for k, step in enumerate(steps):
      message = qwen3_format.assistant_message(step)
      before = conv.text
      tools = [] if step.phase == "answer" else qwen3_format.tool_messages(
          "\n".join(f"[{j + 1}] {c.name}: result {k}" for j, c in enumerate(step.calls)),
          len(step.calls))
      conv.advance(None, message, tools, final=not tools)
      written = conv.last_written
      want = qwen3_format.render_step(step)
      if not written.startswith(want) or written[len(want):] != tok_lib.IM_END:
        raise TemplatePrefixError(
            f"chat template: assistant turn {k + 1} of the probe renders as "
            f"{conv.text[len(before):][:2 * _SHOW]!r}; the qwen3 format writes "
            f"{want[:2 * _SHOW]!r} then {tok_lib.IM_END}: the template's tool-call "
            f"layout is not Qwen3's")


class Conversation:
  """One conversation's token stream, extended turn by turn with the template's suffixes.

  Attributes:
    ids: the stream so far (the policy's tokens as it wrote them).
    text: the template's rendering of the conversation so far.
    turn: assistant turns taken.
    last_written: the text of the last assistant turn as written.
  """

  def __init__(self, turns: TemplateTurns, messages: Sequence[dict]):
    self._turns = turns
    self.messages = [dict(m) for m in messages]
    self.text = turns.text(self.messages, True)
    self._template_ids = turns.encode(self.text)
    self.ids = list(self._template_ids)
    self.turn = 0
    self.last_written = ""
    # While every turn's ids are the tokenizer's ids of its text, the stream
    # must equal the template's ids exactly.
    self._canonical = True

  def _fail(self, what: str, expected, got) -> None:
    i = _first_difference(expected, got)
    raise TemplatePrefixError(
        f"chat template breaks the prefix property at assistant turn {self.turn + 1}: "
        f"{what} differs at position {i}: the turns so far give "
        f"{expected[i:i + _SHOW]!r}, the template renders {got[i:i + _SHOW]!r}. "
        f"A rollout appends each turn's tokens and never re-renders history, so "
        f"the template must render earlier turns alike at every length (one that "
        f"drops thinking blocks or re-renders history does not); set "
        f"protocol.chat_template to one that does")

  def advance(self, written: str | None, message: dict[str, Any],
              new_messages: Sequence[dict], *, final: bool,
              written_ids: Sequence[int] | None = None) -> list[int]:
    """Appends an assistant turn and what follows it; returns the new ids.

    Args:
      written: the text the policy wrote (its decoded tokens; may end with
        ``<|im_end|>``), or None to take the template's rendering of ``message``
        up to its ``<|im_end|>`` (demonstrations).
      message: the assistant message the template renders for that turn.
      new_messages: the messages after it (tool results), may be empty.
      final: no more assistant turns (no generation prompt at the end).
      written_ids: the policy's ids of ``written`` (default: its encoding).

    Returns:
      The ids of the written turn (when ``written`` was None) or of the
      suffix after it: the template's closing of the turn, the tool turn and
      the next assistant opening. `ids` grows by the written ids and the suffix.

    Raises:
      TemplatePrefixError: the template does not extend the previous rendering.
    """
    msgs = self.messages + [dict(message)]
    from_template = written is None
    if from_template:
      alone = self._turns.text(msgs, False)
      if not alone.startswith(self.text):
        self._fail("the assistant turn's text", self.text, alone[:len(self.text)])
      written = alone[len(self.text):]
      end = written.find(tok_lib.IM_END)
      written = written if end < 0 else written[:end + len(tok_lib.IM_END)]
    msgs += [dict(m) for m in new_messages]
    full = self._turns.text(msgs, not final)
    expected = self.text + written
    if not full.startswith(expected):
      self._fail("the text", expected, full[:len(expected)])
    full_ids = self._turns.encode(full)
    # History's ids up to its last special token must stay; after it, BPE may
    # join the template's last piece with what the policy wrote (its business).
    n = self._turns.last_special_end(self._template_ids)
    if full_ids[:n] != self._template_ids[:n]:
      self._fail("the token ids", self._template_ids[:n], full_ids[:n])
    own_ids = self._turns.encode(written)
    written_ids = own_ids if written_ids is None else [int(i) for i in written_ids]
    self._canonical = self._canonical and written_ids == own_ids and (
        self._turns.encode(expected) == self._template_ids + own_ids)
    suffix_ids = self._turns.encode(full[len(expected):])
    stream = self.ids + written_ids + suffix_ids
    if self._canonical and stream != full_ids:
      self._fail("the token ids of the whole conversation", full_ids, stream)
    self.messages, self.text, self._template_ids = msgs, full, full_ids
    self.ids = stream
    self.turn += 1
    self.last_written = written
    return list(written_ids) if from_template else suffix_ids
