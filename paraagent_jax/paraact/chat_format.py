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

    fmt = ChatFormat(tokenizer, "paraact")
    ids = fmt.prompt_ids(env.reset([task])[0])
"""

from __future__ import annotations

import bisect
from typing import Any, Sequence

from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.paraact import protocol
from paraagent_jax.paraact import strategies
from toolenv.schema import Step

CUT_NOTE = "\n...(observation cut)"


class ChatFormat:
  """Chat template + strategy step format + token kinds for one tokenizer.

  Attributes:
    tokenizer: a HF fast tokenizer (ours from `train_bpe_tokenizer`, or Qwen3's).
    strategy: the `strategies.Strategy`.
    encoder: the `tokenizer.ChatEncoder` that renders turns to ids.
    pad_id: padding id of batches.
    stop_sequences: token sequences that end an assistant turn.
  """

  def __init__(self, tokenizer, strategy: str = "paraact",
               system_prompt: str | None = None):
    self.tokenizer = tokenizer
    self.strategy = strategies.get_strategy(strategy)
    self.encoder = tok_lib.ChatEncoder(tokenizer)
    self._system = system_prompt if system_prompt is not None else (
        self.strategy.system_prompt())
    pad = getattr(tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else 0
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

  # ---- steps ---------------------------------------------------------------
  def render(self, step: Step) -> str:
    """Text of a step in the strategy's format."""
    return self.strategy.render_step(step)

  def parse(self, text: Any) -> Step:
    """Parses an assistant turn (a trailing ``<|im_end|>`` is ignored); never raises."""
    if isinstance(text, str):
      text = text.split(tok_lib.IM_END, 1)[0]
    return self.strategy.parse_step(text)

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
    spans = protocol.classify_spans(text)
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
