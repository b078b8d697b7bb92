"""Demonstrations as token rows, and the padded lengths rows are batched at.

`encode_demonstrations` turns chat conversations into token ids and loss masks
(1 on assistant content and its ``<|im_end|>``); `bucket_lengths` parses
``data.length_bucket`` (and ``rl.length_buckets``) into sorted padded lengths.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from paraagent_jax import config_utils
from paraagent_jax import tokenizer as tokenizer_lib
from paraagent_jax.paraact import formats


def encode_demonstrations(encoder: tokenizer_lib.ChatEncoder, conversations
                          ) -> list[tuple[np.ndarray, np.ndarray]]:
  """Token ids and loss masks (1 on assistant content + ``<|im_end|>``).

  Each message is encoded as `ChatEncoder` does in a rollout (a non-assistant
  message as ``turn_ids``, an assistant one as ``generation_prompt_ids() +
  encode(content) + end_of_turn_ids()``); all texts go to the tokenizer in one
  batch call, which is several times faster than one call per message.

  Args:
    encoder: a `ChatEncoder`.
    conversations: lists of dicts with ``role`` and ``content``.

  Returns:
    Per conversation (ids int32 [n], mask float32 [n]).
  """
  header = encoder.generation_prompt_ids()
  eot = encoder.end_of_turn_ids()
  end = encoder.encode(tokenizer_lib.IM_END)
  # Learn the end-of-turn token itself; the newline after it is template.
  n_learn = len(end) if eot[:len(end)] == end else len(eot)
  texts = [m["content"] if m["role"] == "assistant" else
           encoder.turn_text(m["role"], m["content"])
           for msgs in conversations for m in msgs]
  backend = getattr(encoder.tokenizer, "backend_tokenizer", None)
  if backend is not None:  # the Rust tokenizer: half the wrapper's time
    encoded = iter([e.ids for e in backend.encode_batch(
        texts, add_special_tokens=False)])
  else:
    encoded = iter(encoder.tokenizer(texts, add_special_tokens=False)[
        "input_ids"] if texts else [])
  out = []
  for msgs in conversations:
    ids, mask = [], []
    for m in msgs:
      body = list(next(encoded))
      if m["role"] == "assistant":
        ids += header + body + eot
        mask += ([0] * len(header) + [1] * (len(body) + n_learn)
                 + [0] * (len(eot) - n_learn))
      else:
        ids += body
        mask += [0] * len(body)
    out.append((np.asarray(ids, np.int32), np.asarray(mask, np.float32)))
  return out


def encode_conversations(tokenizer, conversations, protocol=None
                         ) -> list[tuple[np.ndarray, np.ndarray]]:
  """Ids and loss masks of demonstrations in the run's protocol format.

  ``protocol`` (a `paraact.chat_format.ProtocolSpec`; None = tags): the tags
  format is `encode_demonstrations`; qwen3 renders each conversation through
  the tokenizer's chat template turn by turn, as its rollouts do
  (`ChatFormat.encode_conversation`: the loss on what each assistant turn
  writes and its ``<|im_end|>``).

  Raises:
    ConfigError: the demonstrations are in the other format;
      `template_turns.TemplatePrefixError` (a ConfigError): the chat template
      breaks the prefix property.
  """
  conversations = list(conversations)
  name = formats.TAGS if protocol is None else protocol.format
  in_qwen3 = any("tool_calls" in m for msgs in conversations for m in msgs)
  if in_qwen3 != (name == formats.QWEN3) and conversations:
    found = formats.QWEN3 if in_qwen3 else formats.TAGS
    raise config_utils.ConfigError(
        f"protocol.format={name} but the demonstrations are in the {found} format: "
        f"rebuild them (stage demos) with protocol.format={name}")
  if name == formats.TAGS:
    return encode_demonstrations(tokenizer_lib.ChatEncoder(tokenizer), conversations)
  fmt = protocol.chat_format(tokenizer)
  encoded = [fmt.encode_conversation(msgs) for msgs in conversations]
  return [(np.asarray(ids, np.int32), np.asarray(mask, np.float32)) for ids, mask in encoded]


def bucket_lengths(spec: int | str | Sequence[int], seq_len: int) -> list[int]:
  """Sorted padded lengths of ``data.length_bucket`` ([] = no buckets).

  Raises:
    ValueError: a negative or non-integer bucket.
  """
  if isinstance(spec, str):
    try:
      lengths = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
      raise ValueError(f"length_bucket={spec!r}: expected an int or comma-"
                       "separated ints") from None
  elif isinstance(spec, (int, np.integer)):
    if spec < 0:
      raise ValueError(f"length_bucket={spec} must be >= 0")
    lengths = list(range(int(spec), seq_len, int(spec))) if spec else []
  else:
    lengths = [int(x) for x in spec]
  if not lengths:
    return []
  if min(lengths) <= 0:
    raise ValueError(f"length_bucket={spec!r}: lengths must be > 0")
  return sorted({x for x in lengths if x < seq_len} | {seq_len})
