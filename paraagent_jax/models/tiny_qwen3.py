"""A tiny Qwen3-architecture HF directory made here: the stand-in for a real Qwen3.

`make_tiny_qwen3(out_dir)` writes what ``init_from=`` and ``protocol.format=qwen3``
read from a real Qwen3 directory, at toy size:

* random weights of ``transformers.Qwen3ForCausalLM`` (2 layers, hidden 32 by
  default), saved by transformers (``config.json`` + safetensors);
* a byte-level BPE tokenizer trained with HF ``tokenizers`` on a little text,
  with Qwen3's pre-tokenizer pattern and special tokens (``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>``; ``<tool_call>``, ``</tool_call>``,
  ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>`` as
  single added tokens);
* `QWEN3_STYLE_TEMPLATE`, a chat template written by the project after Qwen3's
  public one: the tools listed in the system turn inside ``<tools></tools>``,
  assistant ``tool_calls`` as ``<tool_call>`` JSON blocks, ``tool`` messages as
  ``<tool_response>`` blocks inside a user turn. It leaves out Qwen3's handling
  of thinking blocks (``<think>`` in history), which breaks the prefix property
  that multi-turn rollouts need (docs/protocol.md, "Formats").

    python -c "from paraagent_jax.models import tiny_qwen3; tiny_qwen3.make_tiny_qwen3('/tmp/q3')"
"""

from __future__ import annotations

import os
from typing import Iterable

from paraagent_jax import tokenizer as tok_lib

QWEN3_STYLE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>"
    "<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2/Qwen3's pre-tokenizer pattern (tokenizer.json of the public models).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                "<think>", "</think>")

_TEXT = (
    "Find the tools you need in a large catalog, then call them. search_tools "
    "get_tool_doc query top_k name arguments explore execute answer weather city "
    "currency amount convert time result error status created updated",
    '{"name": "search_tools", "arguments": {"query": "weather forecast city"}}',
    "[1] get_weather: Current weather of a city. city*: string, units: string",
    "0123456789 {}[]()<>:;,.!?\"'-_/\\@#$%^&*+=|~` \n\t",
)


def toolenv_texts(num_tasks: int = 40, seed: int = 0) -> list[str]:
  """Training text from ToolEnv: task instructions, the oracle's calls as
  JSON, the template and a few words of the prompts (so that a tiny
  vocabulary still gives episodes of a few hundred tokens)."""
  # pylint: disable=g-import-not-at-top
  import json
  import toolenv
  from toolenv.catalog import procedural
  gen = toolenv.TaskGenerator(procedural.build_catalog(seed=seed, size=2000), seed=seed)
  texts = list(_TEXT) + [QWEN3_STYLE_TEMPLATE] * 3
  for task in gen.generate(num_tasks, "train"):
    texts.append(task.instruction)
    for step in toolenv.oracle.solve(task, "paraact"):
      texts += [json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
                for c in step.calls]
      texts.append(str(step.answer or ""))
  return texts


def train_tokenizer(texts: Iterable[str] = _TEXT, vocab_size: int = 512):
  """A byte-level BPE with Qwen3's pre-tokenizer and special tokens, as a
  `transformers.PreTrainedTokenizerFast` carrying `QWEN3_STYLE_TEMPLATE`."""
  fast = tok_lib.train_byte_bpe(list(texts), vocab_size, QWEN_SPLIT, SPECIAL_TOKENS,
                                ADDED_TOKENS)
  fast.chat_template = QWEN3_STYLE_TEMPLATE
  return fast


def make_tiny_qwen3(out_dir: str, *, texts: Iterable[str] | None = None,
                    vocab_size: int = 1024,
                    layers: int = 2, hidden: int = 32, seed: int = 0) -> str:
  """Writes a tiny Qwen3-architecture HF directory (weights, tokenizer, template).

  Args:
    out_dir: the directory (created).
    texts: the tokenizer's training text (None: `toolenv_texts`).
    vocab_size: the BPE's vocabulary (added tokens included).
    layers, hidden: the model's depth and width (4 query heads, 2 KV heads).
    seed: torch's seed for the random weights.

  Returns:
    ``out_dir``.
  """
  # pylint: disable=g-import-not-at-top
  import torch
  import transformers
  tok = train_tokenizer(toolenv_texts() if texts is None else texts, vocab_size)
  cfg = transformers.Qwen3Config(
      vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
      head_dim=hidden // 4, tie_word_embeddings=True, max_position_embeddings=4096,
      rope_theta=1e6, bos_token_id=None, eos_token_id=tok.eos_token_id,
      pad_token_id=tok.pad_token_id)
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  os.makedirs(out_dir, exist_ok=True)
  model.save_pretrained(out_dir)
  tok.save_pretrained(out_dir)
  return out_dir
