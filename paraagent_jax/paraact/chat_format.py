"""The text and token format of a ParaAct episode, for one tokenizer and strategy.

A rollout builds each episode's token stream turn by turn and never
re-tokenises history. `ChatFormat` says what those turns are:

    prompt_ids(task_text)          system turn + user turn + "<|im_start|>assistant\\n"
    <policy tokens>                the step, ending at a stop string
    observation_ids(obs, max, last) "<|im_end|>\\n" + tool turn + "<|im_start|>assistant\\n"
    <policy tokens> ...
    close_ids(last)                "<|im_end|>\\n" after the final step

so that the ids of an episode are the concatenation of those pieces, and the
text is `tokenizer.render_messages` of the same conversation (every piece
starts and ends at a special token, so concatenated ids equal the ids of the
concatenated text). The step text (render / parse) is the strategy's
(`paraagent_jax.paraact.strategies`); token kinds come from
`protocol.classify_spans`.

That is the ``tags`` protocol format. With ``protocol_format="qwen3"`` the
steps are Qwen3 tool calls (`qwen3_format`) and every turn goes through the
tokenizer's own chat template (`template_turns`), which needs per-episode
state: a rollout asks `conversation` for each episode's stream, which in
both formats gives the prompt, the ids after a step and the closing ids.

    fmt = ChatFormat(tokenizer, "paraact")
    ids = fmt.prompt_ids(env.reset([task])[0])
    conv = fmt.conversation(task_text)     # either format
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Sequence

from paraagent_jax import fileio
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.paraact import formats
from paraagent_jax.paraact import protocol
from paraagent_jax.paraact import qwen3_format
from paraagent_jax.paraact import strategies
from paraagent_jax.paraact import template_turns
from toolenv.schema import Step

CUT_NOTE = "\n...(observation cut)"


@dataclasses.dataclass(frozen=True)
class ProtocolSpec:
  """``config.protocol``, read once at a stage's door.

  Attributes:
    format: ``tags`` or ``qwen3`` (`formats.FORMAT_NAMES`).
    chat_template: a Jinja file used instead of the tokenizer's template
      ("" = the tokenizer's; qwen3 only).
  """
  format: str = formats.TAGS
  chat_template: str = ""

  def __post_init__(self):
    formats.get_format(self.format)   # ValueError names the known ones
    if self.chat_template and not formats.get_format(self.format).chat_template:
      raise ValueError(f"chat_template is read by the qwen3 format only "
                       f"(format={self.format!r})")

  @classmethod
  def checked(cls, format: str, chat_template: str = "") -> "ProtocolSpec":  # pylint: disable=redefined-builtin
    """The spec of ``config.protocol``'s values; ValueError (one line) for a
    bad format, a template with the tags format or a missing template file."""
    spec = cls(format=str(format), chat_template=str(chat_template or ""))
    if spec.chat_template and not fileio.isfile(spec.chat_template):
      raise ValueError(f"chat_template={spec.chat_template}: no such file")
    return spec

  def chat_format(self, tokenizer, strategy: str = "paraact") -> "ChatFormat":
    """The `ChatFormat` of ``tokenizer`` and ``strategy`` in this protocol."""
    template = None
    if self.chat_template:
      with fileio.open(self.chat_template) as f:
        template = f.read()
    return ChatFormat(tokenizer, strategy, protocol_format=self.format,
                      chat_template=template)


class ChatFormat:
  """Chat template + strategy step format + token kinds for one tokenizer.

  Attributes:
    tokenizer: a HF fast tokenizer (ours from `train_bpe_tokenizer`, or Qwen3's).
    strategy: the `strategies.Strategy`.
    step_format: the `formats.StepFormat` (``tags`` or ``qwen3``).
    encoder: the `tokenizer.ChatEncoder` that renders turns to ids (tags).
    turns: the `template_turns.TemplateTurns` (qwen3; None for tags).
    pad_id: padding id of batches.
    stop_sequences: token sequences that end an assistant turn.
  """

  def __init__(self, tokenizer, strategy: str = "paraact",
               system_prompt: str | None = None, protocol_format: str = formats.TAGS,
               chat_template: str | None = None):
    """Raises `template_turns.TemplatePrefixError` when a qwen3 chat template
    fails the probe (`TemplateTurns.check`)."""
    self.tokenizer = tokenizer
    self.strategy = strategies.get_strategy(strategy)
    self.step_format = formats.get_format(protocol_format)
    self.encoder = tok_lib.ChatEncoder(tokenizer)
    self._system = system_prompt if system_prompt is not None else (
        self.strategy.system_prompt(self.step_format))
    pad = getattr(tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else 0
    self.turns = None
    if self.step_format.chat_template:
      self.turns = template_turns.TemplateTurns(tokenizer, chat_template=chat_template)
      self.turns.check(self._system)
      self.stop_sequences = [self.encode(s) for s in self.step_format.stop_strings +
                             (tok_lib.IM_END,)]
    else:
      self.stop_sequences: list[list[int]] = self.encoder.stop_sequences()
    self._end_ids = self.encoder.end_of_turn_ids()
    self._gen_ids = self.encoder.generation_prompt_ids()
    im_end = self.encode(tok_lib.IM_END)
    self._im_end_id = im_end[0] if len(im_end) == 1 else None
    self._nl_ids = self.encode("\n")
    self._system_ids = self.encoder.turn_ids("system", self._system)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    self._literal = {i for t, i in vocab.items()
                     if t in tok_lib.SPECIAL_TOKENS + tok_lib.ADDED_TOKENS}

  # ---- text <-> ids ------------------------------------------------------
  def encode(self, text: str) -> list[int]:
    """Token ids of ``text`` (no BOS/EOS added)."""
    return self.encoder.encode(text)

  def decode(self, ids: Sequence[int]) -> str:
    """Text of ``ids``, special tokens kept (so offsets stay exact)."""
    return self.tokenizer.decode(list(ids), skip_special_tokens=False,
                                 clean_up_tokenization_spaces=False)

  # ---- the conversation ----------------------------------------------------
  @property
  def system_text(self) -> str:
    """The system prompt of this strategy."""
    return self._system

  def prompt_messages(self, task_text: str) -> list[dict[str, Any]]:
    """System and user messages that open an episode (API policies)."""
    return [{"role": "system", "content": self._system},
            {"role": "user", "content": str(task_text)}]

  def prompt_ids(self, task_text: str) -> list[int]:
    """Ids of the system turn, the user turn and the assistant turn opening."""
    return (self._system_ids + self.encoder.turn_ids("user", str(task_text)) +
            self._gen_ids)

  def close_ids(self, last_ids: Sequence[int] = ()) -> list[int]:
    """Ids that end an assistant turn after the policy's ``last_ids``.

    If the policy itself wrote ``<|im_end|>`` (a stop string), only the
    newline that follows it in the template is added.
    """
    if self._im_end_id is not None and len(last_ids) and last_ids[-1] == self._im_end_id:
      return list(self._nl_ids)
    return list(self._end_ids)

  def observation_content(self, observation: str, max_tokens: int | None = None) -> str:
    """The tool turn's content, cut to about ``max_tokens`` tokens."""
    text = protocol.render_observation(observation)
    if max_tokens is not None and max_tokens > 0:
      ids = self.encode(text)
      if len(ids) > max_tokens:
        text = self.decode(ids[:max_tokens]) + CUT_NOTE
    return text

  def observation_messages(self, observation: str,
                           max_tokens: int | None = None) -> list[dict[str, Any]]:
    """The observation as a tool message (API policies)."""
    return [{"role": "tool", "content": self.observation_content(observation, max_tokens)}]

  def observation_ids(self, observation: str, max_tokens: int | None = None,
                      last_ids: Sequence[int] = ()) -> list[int]:
    """Ids after a non-final step: close it, the tool turn, reopen the assistant."""
    content = self.observation_content(observation, max_tokens)
    return (self.close_ids(last_ids) + self.encoder.turn_ids("tool", content) +
            self._gen_ids)

  def episode_text(self, task_text: str, turns: Sequence[tuple[str, str | None]]) -> str:
    """Reference text of a whole episode via `tokenizer.render_messages`.

    Args:
      task_text: the first observation.
      turns: ``(assistant_text, observation or None)`` pairs.

    Returns:
      The text whose encoding the pieces above concatenate to (used by tests
      and by demonstration export).
    """
    msgs = self.prompt_messages(task_text)
    for step_text, obs in turns:
      msgs.append({"role": "assistant", "content": step_text})
      if obs is not None:
        msgs.append({"role": "tool", "content": obs})
    return tok_lib.render_messages(msgs)

  def conversation(self, task_text: str) -> "TagsConversation | TemplateConversation":
    """One episode's token stream in this format (`rollout` keeps one per episode)."""
    if self.turns is None:
      return TagsConversation(self, task_text)
    return TemplateConversation(self, task_text)

  def encode_conversation(self, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """Ids and loss mask of a whole demonstration through the chat template
    (qwen3 format; the tags format's is `data.rows.encode_demonstrations`)."""
    if self.turns is None:
      raise ValueError("encode_conversation is the qwen3 format's")
    return self.turns.encode_messages(messages)

  # ---- steps ---------------------------------------------------------------
  def render(self, step: Step) -> str:
    """Text of a step in the strategy's form of the protocol format."""
    return self.strategy.render_step(step, self.step_format)

  def parse(self, text: Any) -> Step:
    """Parses an assistant turn (a trailing ``<|im_end|>`` is ignored); never raises."""
    if isinstance(text, str):
      text = text.split(tok_lib.IM_END, 1)[0]
    return self.strategy.parse_step(text, self.step_format)

  def token_kinds(self, ids: Sequence[int], text: str | None = None) -> list[int]:
    """Kind (plan 0 / action 1 / answer 2) of each policy token.

    Character offsets come from the byte length of each token (byte-level BPE:
    one vocabulary character per byte); when they do not add up to ``text``
    (odd tokenizer, broken UTF-8) they come from decoding prefixes instead.
    """
    ids = [int(i) for i in ids]
    if not ids:
      return []
    if text is None:
      text = self.decode(ids)
    spans = protocol.classify_spans(text, self.step_format.call_open)
    offsets = self._byte_offsets(ids, text)
    if offsets is None:
      starts = [len(self.decode(ids[:i])) for i in range(len(ids))]
    else:
      # byte offset -> character offset
      char_bytes, acc = [], 0
      for ch in text:
        char_bytes.append(acc)
        acc += len(ch.encode("utf-8"))
      starts = [max(0, bisect.bisect_right(char_bytes, b) - 1) for b in offsets]
    return protocol.token_kinds([(s, s) for s in starts], spans)

  def _byte_offsets(self, ids: list[int], text: str) -> list[int] | None:
    pieces = self.tokenizer.convert_ids_to_tokens(ids)
    out, acc = [], 0
    for i, p in zip(ids, pieces):
      if p is None:
        return None
      out.append(acc)
      acc += len(p.encode("utf-8")) if i in self._literal else len(p)
    return out if acc == len(text.encode("utf-8")) else None


class TagsConversation:
  """An episode's stream in the tags format: the stateless pieces of `ChatFormat`."""

  def __init__(self, fmt: ChatFormat, task_text: str):
    self._fmt = fmt
    self.prompt_ids = fmt.prompt_ids(task_text)

  def observation_ids(self, out_ids: Sequence[int], out_text: str, observation: str,
                      max_tokens: int | None) -> list[int]:
    """Ids after a non-final step: close it, the tool turn, reopen the assistant."""
    del out_text
    return self._fmt.observation_ids(observation, max_tokens, out_ids)

  def close_ids(self, out_ids: Sequence[int], out_text: str) -> list[int]:
    """Ids that end the final assistant turn."""
    del out_text
    return self._fmt.close_ids(out_ids)


class TemplateConversation:
  """An episode's stream through the chat template (qwen3 format): each turn
  appends the template's new suffix, checked for the prefix property."""

  def __init__(self, fmt: ChatFormat, task_text: str):
    self._fmt = fmt
    self._conv = fmt.turns.start(fmt.prompt_messages(task_text))
    self.prompt_ids = list(self._conv.ids)

  def _advance(self, out_ids, out_text, tools, final) -> list[int]:
    content = out_text.split(tok_lib.IM_END, 1)[0]
    return self._conv.advance(out_text, {"role": "assistant", "content": content}, tools,
                              final=final, written_ids=out_ids)

  def observation_ids(self, out_ids: Sequence[int], out_text: str, observation: str,
                      max_tokens: int | None) -> list[int]:
    """The template's suffix after a step: its close, the tool turn (a tool
    message per call, `qwen3_format.tool_messages`), the next opening."""
    content = self._fmt.observation_content(observation, max_tokens)
    calls = self._fmt.parse(out_text).calls
    n = len(calls) if isinstance(calls, list) else 0
    return self._advance(out_ids, out_text, qwen3_format.tool_messages(content, n), False)

  def close_ids(self, out_ids: Sequence[int], out_text: str) -> list[int]:
    """The template's close of the final assistant turn."""
    return self._advance(out_ids, out_text, [], True)
