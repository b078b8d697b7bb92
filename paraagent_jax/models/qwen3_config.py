"""The Qwen3 architecture config: sizes, dtypes, options, and the named presets.

`Qwen3Config.preset("qwen3-4b")` gives the sizes of the Hugging Face release
(from its config.json); `from_hf_dict` / `to_hf_dict` convert both ways.
`paraagent_jax.models.qwen3` builds the model from it (and re-exports it).
"""

from __future__ import annotations

import dataclasses
from typing import Any


_PRESETS: dict[str, dict[str, Any]] = {
    # Sizes from the Hugging Face config.json of the Qwen3 releases.
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                       tie_embeddings=True),
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                       tie_embeddings=True),
    "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                     num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                     tie_embeddings=True),
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                     tie_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 max_position_embeddings=2048),
    "demo": dict(vocab_size=4096, hidden_size=256, intermediate_size=768,
                 num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                 max_position_embeddings=4096),
}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
  """Qwen3 hyper-parameters plus our execution options (dtypes, scan, remat)."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1e6
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = True
  max_position_embeddings: int = 40960
  param_dtype: str = "float32"
  dtype: str = "float32"          # compute dtype (bf16 on TPU)
  scan_layers: bool = False
  remat: str = "none"             # "none" | "full" | "dots"
  # "reference": > 0 = the cache-free (training) forward attends in causal
  # query blocks of this many tokens, each over its key prefix only (exact;
  # skips the upper triangle); 0 = one dense [T,T] score matrix. "blocked":
  # its query block (0 = `attention.CPU_QUERY_BLOCK`).
  attention_block: int = 0
  # Attention implementation (`paraagent_jax.models.attention`): "auto" (splash
  # on TPU, cuDNN on GPU for bf16/fp16, on the CPU blocked for rows up to
  # 2,048 tokens and chunked beyond), "reference" (the einsum path, autodiff),
  # "blocked" (reference blocks, written VJP), "chunked", "xla", "cudnn",
  # "splash", "tokamax" (opt-in package). The KV-cache path is chunked
  # unless this is "reference".
  attention: str = "auto"
  # Block size of the chunked/splash kernels and of the cache attention.
  attention_chunk: int = 256
  # > 0: `learner.logprobs.model_logprobs` runs the LM head + log-softmax over this many
  # positions at a time (never a [B,T,V] fp32 array). 0 = all at once.
  logits_chunk: int = 512
  # > 0: `model_logprobs(..., at=mask)` runs the LM head + log-softmax only at
  # the positions in `mask`, gathered into rows of this fraction of the
  # sequence (rounded up to 8); a batch with a fuller row takes the
  # all-positions path (exact either way). 0 = all positions.
  logits_capacity: float = 0.0

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if self.remat not in ("none", "full", "dots"):
      raise ValueError(f"remat={self.remat!r}; expected 'none', 'full' or 'dots'")
    if self.attention_block < 0:
      raise ValueError(f"attention_block={self.attention_block} must be >= 0")
    known = ("auto", "reference", "blocked", "chunked", "xla", "cudnn", "splash",
             "tokamax")
    if self.attention not in known:
      raise ValueError(f"attention={self.attention!r}; expected one of {known}")
    if self.attention_chunk < 1:
      raise ValueError(f"attention_chunk={self.attention_chunk} must be >= 1")
    if self.logits_chunk < 0:
      raise ValueError(f"logits_chunk={self.logits_chunk} must be >= 0")
    if not 0.0 <= self.logits_capacity <= 1.0:
      raise ValueError(f"logits_capacity={self.logits_capacity} must be in "
                       "[0, 1] (a fraction of the sequence)")

  @classmethod
  def preset(cls, name: str, **overrides) -> "Qwen3Config":
    """A named size ("qwen3-0.6b", ..., "qwen3-8b", "tiny", "demo") + overrides."""
    if name not in _PRESETS:
      raise ValueError(f"unknown preset {name!r}; known: {sorted(_PRESETS)}")
    return cls(**{**_PRESETS[name], **overrides})

  def replace(self, **changes) -> "Qwen3Config":
    """A copy with some fields changed."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides) -> "Qwen3Config":
    """Builds a config from a Hugging Face Qwen3 `config.json` dict.

    Raises:
      ValueError: the dict describes something this model does not implement
        (another architecture, attention bias, sliding window, RoPE scaling).
    """
    archs = d.get("architectures") or ["Qwen3ForCausalLM"]
    if d.get("model_type") != "qwen3" or "Qwen3ForCausalLM" not in archs:
      raise ValueError(
          f"unsupported architecture: model_type={d.get('model_type')!r} "
          f"architectures={archs}; only Qwen3ForCausalLM (model_type 'qwen3')")
    if d.get("attention_bias"):
      raise ValueError("unsupported Qwen3 config: attention_bias=true")
    if d.get("use_sliding_window"):
      raise ValueError("unsupported Qwen3 config: use_sliding_window=true")
    if d.get("hidden_act", "silu") != "silu":
      raise ValueError(f"unsupported Qwen3 config: hidden_act={d['hidden_act']!r}")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
      raise ValueError(f"unsupported Qwen3 config: rope_type={rope_type!r}")
    theta = rope.get("rope_theta", d.get("rope_theta", 1e6))
    heads = d["num_attention_heads"]
    fields = dict(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_layers=d["num_hidden_layers"], num_heads=heads,
        num_kv_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads,
        rope_theta=float(theta), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=int(d.get("max_position_embeddings", 40960)))
    fields.update(overrides)
    return cls(**fields)

  def to_hf_dict(self) -> dict[str, Any]:
    """The Hugging Face `config.json` dict for this architecture."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
        "hidden_act": "silu", "max_position_embeddings": self.max_position_embeddings,
        "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
        "tie_word_embeddings": self.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "initializer_range": 0.02, "use_cache": True,
        "dtype": self.param_dtype,
    }


# ----------------------------------------------------------------------------
# Numerics shared by every code path.
# ----------------------------------------------------------------------------
