"""Tokenizers: load a local HF tokenizer, train the demo BPE, the chat template.

The chat format is Qwen3's: ``<|im_start|>role\\n...<|im_end|>\\n`` per turn,
and tool results as a user turn wrapping each result in
``<tool_response>\\n...\\n</tool_response>`` (consecutive tool messages share one
user turn, as in Qwen3). It exists twice, and a test keeps them identical:

* `CHAT_TEMPLATE`, a Jinja string saved as the tokenizer's ``chat_template``,
  so HF ``apply_chat_template`` and exported checkpoints render the same text;
* `ChatEncoder`, which renders turn by turn straight to token ids, because a
  multi-turn rollout appends tokens per turn and never re-tokenises history.

Every turn starts and ends at a special token, so the ids of a conversation
are the concatenation of the ids of its turns.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterable, Sequence

from paraagent_jax import checksums
from paraagent_jax import fileio

# The ParaAct protocol's tags (`paraagent_jax.paraact.protocol` renders and
# parses them): single added tokens of the demo tokenizer, so the stop
# sequence of a turn is one token.
EXPLORE_OPEN = "<explore>"
EXECUTE_OPEN = "<execute>"
CALL_OPEN = "<call>"
CALL_CLOSE = "</call>"
STEP_CLOSE = "</step>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
PROTOCOL_TOKENS = (EXPLORE_OPEN, EXECUTE_OPEN, CALL_OPEN, CALL_CLOSE, STEP_CLOSE,
                   ANSWER_OPEN, ANSWER_CLOSE)
# The sampler stops a turn on any of these (the chat template then closes it).
STOP_STRINGS = (STEP_CLOSE, ANSWER_CLOSE)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
# Added (single-token, kept on decode) but not "special": they are text the
# model writes and reads, so skip_special_tokens must not drop them.
ADDED_TOKENS = (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE) + PROTOCOL_TOKENS
ROLES = ("system", "user", "assistant", "tool")
# The demo BPE's pre-tokenizer: runs of characters other than letters, digits
# and "-" are pieces of their own (see `train_bpe_tokenizer`), so an id such as
# ``exo-43bf76`` stays one word and tokenizes alike wherever it appears.
COPYABLE_SPLIT = r"[^\p{L}\p{N}-]+"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _tool_block(content: str) -> str:
  return f"\n{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"


def render_messages(messages: Sequence[dict], add_generation_prompt=False) -> str:
  """Python rendering of `CHAT_TEMPLATE` (same string, checked by a test).

  Args:
    messages: dicts with ``role`` (system/user/assistant/tool) and ``content``.
    add_generation_prompt: append the opening of an assistant turn.

  Returns:
    The conversation text.
  """
  out = []
  for i, m in enumerate(messages):
    role, content = m["role"], m["content"]
    if role not in ROLES:
      raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    if role == "tool":
      if i == 0 or messages[i - 1]["role"] != "tool":
        out.append(f"{IM_START}user")
      out.append(_tool_block(content))
      if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
        out.append(f"{IM_END}\n")
    else:
      out.append(f"{IM_START}{role}\n{content}{IM_END}\n")
  if add_generation_prompt:
    out.append(f"{IM_START}assistant\n")
  return "".join(out)


class ChatEncoder:
  """Renders a conversation turn by turn to token ids.

  A rollout uses it as: ``ids = enc.turn_ids("system", s) +
  enc.turn_ids("user", u) + enc.generation_prompt_ids()``, then the sampled
  step tokens, then ``enc.end_of_turn_ids()``, then
  ``enc.turn_ids("tool", observation) + enc.generation_prompt_ids()`` and so
  on. Each tool message is its own turn here (the environment returns one
  observation per step).
  """

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  def encode(self, text: str) -> list[int]:
    """Token ids of text, with no BOS/EOS added."""
    return list(self.tokenizer.encode(text, add_special_tokens=False))

  def turn_text(self, role: str, content: str) -> str:
    """Text of one complete turn."""
    return render_messages([{"role": role, "content": content}])

  def turn_ids(self, role: str, content: str) -> list[int]:
    """Token ids of one complete turn."""
    return self.encode(self.turn_text(role, content))

  def generation_prompt_ids(self) -> list[int]:
    """Ids of ``<|im_start|>assistant\\n``, which the model continues."""
    return self.encode(f"{IM_START}assistant\n")

  def end_of_turn_ids(self) -> list[int]:
    """Ids appended after a sampled assistant step: ``<|im_end|>\\n``."""
    return self.encode(f"{IM_END}\n")

  def stop_sequences(self) -> list[list[int]]:
    """Token sequences that end an assistant turn (one token each in the demo
    tokenizer; possibly several with a foreign tokenizer)."""
    return [self.encode(s) for s in STOP_STRINGS + (IM_END,)]


def load_tokenizer(path: str):
  """Loads a tokenizer from a local HF directory (ours or a real Qwen3's).

  The ParaAct chat template is set when the directory has none. The protocol
  tags are not added to a foreign vocabulary (that would need resized
  embeddings): with a Qwen3 tokenizer they are ordinary multi-token text.

  Args:
    path: directory with ``tokenizer.json`` / ``tokenizer_config.json``.

  Returns:
    A `transformers.PreTrainedTokenizerFast`.

  Raises:
    FileNotFoundError: no such directory.
    ValueError: a file differs from the directory's SHA256SUMS.
  """
  if not fileio.isdir(path):
    raise FileNotFoundError(f"tokenizer directory not found: {path}")
  checksums.verify_checksums(path)   # a shipped directory lists its files
  # transformers takes seconds to import: only the functions that build or load
  # a tokenizer pay for it, not the modules that read the token constants.
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  with _local_copy(path) as local:
    tok = AutoTokenizer.from_pretrained(local, local_files_only=True)
  if not getattr(tok, "chat_template", None):
    tok.chat_template = CHAT_TEMPLATE
  return tok


@contextlib.contextmanager
def _local_copy(path: str):
  """``path`` itself, or for a bucket a temporary local copy of its files
  (transformers reads tokenizers from local directories only), removed
  after the block."""
  if not fileio.is_remote(path):
    yield path
    return
  with tempfile.TemporaryDirectory(prefix="paraagent-tokenizer-") as tmp:
    for name in fileio.listdir(path):
      if fileio.isfile(os.path.join(path, name)):
        fileio.copy(os.path.join(path, name), os.path.join(tmp, name))
    yield tmp


def save_tokenizer(tok, out_dir: str) -> None:
  """``tok.save_pretrained(out_dir)``, also for a bucket (written locally to
  a temporary directory, then each file uploaded whole)."""
  if not fileio.is_remote(out_dir):
    fileio.makedirs(out_dir)
    tok.save_pretrained(out_dir)
    return
  with tempfile.TemporaryDirectory(prefix="paraagent-tokenizer-") as tmp:
    tok.save_pretrained(tmp)
    for name in sorted(os.listdir(tmp)):
      fileio.copy(os.path.join(tmp, name), os.path.join(out_dir, name))


def train_byte_bpe(texts: Iterable[str], vocab_size: int, split_pattern: str,
                   special_tokens: Sequence[str], added_tokens: Sequence[str],
                   additional_special_tokens: Sequence[str] = ()):
  """A byte-level BPE trained on ``texts``: pieces split by ``split_pattern``
  first, ``special_tokens`` (the first ``<|endoftext|>``-like pad, eos
  ``<|im_end|>``) and ``added_tokens`` single tokens kept on decode.

  Returns:
    A `transformers.PreTrainedTokenizerFast` without a chat template.
  """
  # Heavy (transformers takes seconds to import): see `load_tokenizer`.
  # pylint: disable=g-import-not-at-top
  from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                          pre_tokenizers, processors, trainers)
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  # trim_offsets=False keeps offsets exact for token-kind labelling.
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(special_tokens) + list(added_tokens),
      show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer=trainer)
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in special_tokens])
  tok.add_tokens([AddedToken(t, special=False, normalized=False)
                  for t in added_tokens])
  kwargs = {"additional_special_tokens": list(additional_special_tokens)} if (
      additional_special_tokens) else {}
  return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END,
                                 pad_token=END_OF_TEXT, **kwargs)


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 4096,
                        out_dir: str | None = None):
  """Trains the byte-level BPE of the CPU demo, with the ParaAct tokens.

  Args:
    texts: training text (ToolEnv catalog/tasks, rendered demonstrations).
    vocab_size: total vocabulary size, special and added tokens included.
    out_dir: if given, save there in HF format (``tokenizer.json``,
      ``tokenizer_config.json`` with the chat template, special tokens map).

  Returns:
    A `transformers.PreTrainedTokenizerFast`.
  """
  # Copyable pieces: runs of characters other than letters, digits and "-"
  # are pieces of their own, so BPE merges only inside words (ids such as
  # ``exo-43bf76`` included) and a name gets the same ids wherever it stands
  # (`` Triraon``, ``"Triraon``, ``_triraon`` all contain the ids of
  # ``Triraon``). With the
  # GPT-2 regex a leading space or quote joined the word and the policy's
  # copies (instruction -> query, observation -> call) moved between ids.
  fast = train_byte_bpe(texts, vocab_size, COPYABLE_SPLIT, SPECIAL_TOKENS, ADDED_TOKENS,
                        additional_special_tokens=[IM_START])
  fast.chat_template = CHAT_TEMPLATE
  if out_dir is not None:
    save_tokenizer(fast, out_dir)
  return fast
