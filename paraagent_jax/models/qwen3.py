"""Qwen3 dense decoder in Flax NNX, numerically matching `transformers.Qwen3`.

Architecture (as in Hugging Face `Qwen3ForCausalLM`), one function each:
token embedding (`Qwen3.embed`); `decoder_layer` x num_layers:

    x = x + attention(rms_norm(x))       # `attention`: grouped-query, per-head
                                         #   q/k RMSNorm, split-halves RoPE
    x = x + mlp(rms_norm(x))             # `mlp`: SwiGLU

then the final RMSNorm (`Qwen3.hidden`) and the LM head (`Qwen3.head`, tied to
the embedding or not). `attention` is `keys_values` and `queries` (projection,
norm, RoPE), the attention itself (`paraagent_jax.models.attention`, by
`config.attention`: reference einsum, blocked, chunked flash, XLA, cuDNN,
Pallas splash, tokamax) and `attention_out` (the output projection).

Parameters are stored in einsum layouts with named dimensions:
  B batch, T query positions, S key positions / cache slots, D model width,
  N query heads, K kv heads, G = N / K, H head dim, F MLP width, V vocab, L layers.
Every parameter carries its logical axis names in `out_sharding` metadata (eager
sharding off: `sharding.shard_model` maps the names to a mesh through a rules
table; the trainer refuses axes that do not divide). With `scan_layers` the layer parameters are
stacked along a leading "layers" axis and the stack runs under `jax.lax.scan`.

This file is the cache-free forward (training, scoring). The forward over a
KV cache (prefill, decode, continuation), the cache's layouts and the CPU
decode step's weight layouts live with the sampler
(`paraagent_jax.sampling.cached_forward`, `paraagent_jax.sampling.kv_cache`),
built from the same blocks (`keys_values`, `queries`, `attention_out`, `mlp`).
Token log-probs for the losses are computed from `hidden` and `head` by
`paraagent_jax.learner.logprobs` (in sequence chunks, `config.logits_chunk`,
so that no [B,T,V] fp32 logits exist in a training step).
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax import sharding as shd
from paraagent_jax.models import attention as attn
# The architecture config and its presets (re-exported: qwen3.Qwen3Config).
from paraagent_jax.models.qwen3_config import Qwen3Config  # pylint: disable=unused-import


def rms_norm(x, w, eps):
  """HF Qwen3RMSNorm: statistics in fp32, scale applied in the input dtype."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return w.astype(x.dtype) * normed.astype(x.dtype)


def rope_tables(positions, head_dim: int, theta: float):
  """(cos, sin) [B,T,1,H/2] of split-halves RoPE; computed once per forward."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                              / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq     # [B,T,H/2]
  return jnp.cos(freqs)[:, :, None, :], jnp.sin(freqs)[:, :, None, :]


def apply_rope(x, tables, by_matmul: bool = False):
  """Rotates x [B,T,n,H] by the `rope_tables` of its positions.

  With `by_matmul`, the halves' swap (x1, x2) -> (-x2, x1) is a product with
  a constant signed permutation matrix, [.., H] x [H, H] at full precision,
  instead of a split and a concatenate. The values are the same to the bit,
  up to the sign of zeros (each output is one input times +-1 plus zeros,
  then the same multiplies and adds). The cache path uses it: XLA:CPU ran
  the concatenate, fused with the q/k norms, at ~5 ns an element, and the
  product made the batch-32 decode call ~5-7% faster
  (docs/records/sampler_speed.md). The cache-free forward (training) keeps the
  concatenate, which accelerators fuse for free.
  """
  cos, sin = tables
  xf = x.astype(jnp.float32)
  if by_matmul:
    h = x.shape[-1]
    rotated = jnp.einsum("...i,ij->...j", xf, _rotate_half_matrix(h),
                         precision=jax.lax.Precision.HIGHEST)
    out = (xf * jnp.concatenate([cos, cos], axis=-1) +
           rotated * jnp.concatenate([sin, sin], axis=-1))
    return out.astype(x.dtype)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


@functools.lru_cache(maxsize=None)
def _rotate_half_matrix_np(h: int) -> np.ndarray:
  half = np.arange(h // 2)
  r = np.zeros((h, h), np.float32)
  r[half + h // 2, half] = -1.0          # out[j] = -x[j + H/2]  (j < H/2)
  r[half, half + h // 2] = 1.0           # out[j + H/2] = x[j]
  return r


def _rotate_half_matrix(h: int):
  """[H, H] R with x @ R = concatenate([-x2, x1]) for x = (x1, x2)."""
  return jnp.asarray(_rotate_half_matrix_np(h))


def rope(x, positions, theta):
  """Split-halves rotary embedding. x [B,T,n,H], positions [B,T] int."""
  return apply_rope(x, rope_tables(positions, x.shape[-1], theta))


# Logical axis names of one decoder layer's parameters (without "layers").
_LAYER_AXES: dict[str, tuple[str | None, ...]] = {
    "attn_norm": ("norm",),
    "q_proj": ("embed", "heads", "head_dim"),
    "k_proj": ("embed", "kv_heads", "head_dim"),
    "v_proj": ("embed", "kv_heads", "head_dim"),
    "o_proj": ("heads", "head_dim", "embed"),
    "q_norm": ("head_dim",),
    "k_norm": ("head_dim",),
    "mlp_norm": ("norm",),
    "gate_proj": ("embed", "mlp"),
    "up_proj": ("embed", "mlp"),
    "down_proj": ("mlp", "embed"),
}


def _layer_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
  d, n, k, h, f = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim, cfg.intermediate_size)
  return {"attn_norm": (d,), "q_proj": (d, n, h), "k_proj": (d, k, h),
          "v_proj": (d, k, h), "o_proj": (n, h, d), "q_norm": (h,),
          "k_norm": (h,), "mlp_norm": (d,), "gate_proj": (d, f),
          "up_proj": (d, f), "down_proj": (f, d)}


def _param(rngs, shape, axes, dtype, ones=False):
  """A Param with logical axis names; eager sharding off (shard_model maps)."""
  if ones:
    value = jnp.ones(shape, dtype)
  else:
    value = (0.02 * jax.random.normal(rngs.params(), shape)).astype(dtype)
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


class DecoderLayers(nnx.Module):
  """The parameters of one decoder layer, or of all layers stacked (scan)."""

  def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs,
               num_stacked: int | None = None):
    dtype = jnp.dtype(cfg.param_dtype)
    lead = () if num_stacked is None else (num_stacked,)
    lead_axes = () if num_stacked is None else ("layers",)
    for name, shape in _layer_shapes(cfg).items():
      setattr(self, name, _param(rngs, lead + shape, lead_axes + _LAYER_AXES[name],
                                 dtype, ones=name.endswith("norm")))

  def arrays(self) -> dict[str, jax.Array]:
    """The parameter arrays by name (what the pure layer function takes)."""
    return {name: getattr(self, name)[...] for name in _LAYER_AXES}


# --------------------------------------------------------------------------
# The blocks of a decoder layer, as pure functions of its parameter arrays
# `p` (see `_LAYER_AXES`). `ctx` is (mesh, rules) for activation constraints,
# or None.

def keys_values(p, h, rope_tab, cfg: Qwen3Config, ctx, by_matmul: bool = False):
  """Keys and values [B,T,K,H] of the normed residual `h` [B,T,D].

  The keys get their per-head RMSNorm and RoPE (`rope_tab`: `rope_tables` of
  the positions; `by_matmul`: see `apply_rope`).
  """
  dt = h.dtype
  k = _dense(h, p["k_proj"].astype(dt))
  v = _dense(h, p["v_proj"].astype(dt))
  k = constrain(k, ("batch", "seq", "act_kv_heads", None), ctx)
  k = apply_rope(rms_norm(k, p["k_norm"], cfg.rms_norm_eps), rope_tab, by_matmul)
  return k, v


def queries(p, h, rope_tab, cfg: Qwen3Config, ctx, by_matmul: bool = False):
  """Queries [B,T,N,H] of `h` [B,T,D]: projection, per-head RMSNorm, RoPE."""
  q = _dense(h, p["q_proj"].astype(h.dtype))
  q = constrain(q, ("batch", "seq", "act_heads", None), ctx)
  return apply_rope(rms_norm(q, p["q_norm"], cfg.rms_norm_eps), rope_tab,
                    by_matmul)


def attention_out(p, att, dtype):
  """The output projection of attention's [B,T,N,H] result: [B,T,D].

  One contraction over N*H (both reshapes are free): written "BTNH,NHD",
  XLA:CPU contracted H-major and transposed o_proj every call (every decode
  step).
  """
  o_proj = p["o_proj"].astype(dtype)
  return _dense(att.reshape(*att.shape[:2], -1),
                o_proj.reshape(-1, o_proj.shape[-1]))


def attention(p, h, rope_tab, mask, cfg: Qwen3Config, ctx):
  """Causal grouped-query self-attention of `h` [B,T,D] (no cache): [B,T,D].

  `mask` is (attention_mask [B,T] or None, segment_ids [B,T] or None); the
  implementation is `cfg.attention` (`attention.self_attention`).
  """
  k, v = keys_values(p, h, rope_tab, cfg, ctx)
  q = queries(p, h, rope_tab, cfg, ctx)
  attention_mask, segment_ids = mask
  att = attn.self_attention(
      q, k, v, attention_mask=attention_mask, segment_ids=segment_ids,
      impl=cfg.attention, block=cfg.attention_chunk,
      reference_block=cfg.attention_block, ctx=ctx, dtype=cfg.dtype)
  return attention_out(p, att, h.dtype)


def mlp(p, h, ctx):
  """The SwiGLU MLP of `h` [B,T,D]: down(silu(gate(h)) * up(h)), [B,T,D]."""
  dt = h.dtype
  gate = _dense(h, p["gate_proj"].astype(dt))
  up = _dense(h, p["up_proj"].astype(dt))
  hidden = constrain(jax.nn.silu(gate) * up, ("batch", "seq", "act_mlp"), ctx)
  return _dense(hidden, p["down_proj"].astype(dt))


def decoder_layer(p, x, rope_tab, mask, cfg: Qwen3Config, ctx):
  """One decoder layer of the cache-free forward: x [B,T,D] -> [B,T,D]."""
  h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
  x = constrain(x + attention(p, h, rope_tab, mask, cfg, ctx),
                ("batch", "seq", "act_embed"), ctx)
  h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
  return constrain(x + mlp(p, h, ctx), ("batch", "seq", "act_embed"), ctx)


def _dense(x, w, w_out_first: bool = False, out_dtype=None):
  """x [..., In] times a weight [In, *Out] (or [Out, In]): [..., *Out].

  Both sides are flattened to 2-D matrices first (free reshapes). Written as
  a batched einsum ("BTD,DF->BTF"), the weight gradient that autodiff derives
  contracts over (B, T) of two 3-D arrays, and XLA:CPU ran it as a slow dot
  plus transposes of the activations: the demo's SFT step spent ~40% more
  time in its MLP (benchmarks/train_step_bench.py). As 2-D dots the
  gradient is one plain [In, M] x [M, Out] product.
  """
  lead = x.shape[:-1]
  x2 = x.reshape(-1, x.shape[-1])
  if w_out_first:        # [Out, In]: the tied LM head (the embedding)
    return jnp.einsum("MD,VD->MV", x2, w,
                      preferred_element_type=out_dtype).reshape(*lead, -1)
  out = w.shape[1:]
  y = jnp.dot(x2, w.reshape(w.shape[0], -1), preferred_element_type=out_dtype)
  return y.reshape(*lead, *out)


def constrain(x, axes, ctx):
  """`x` constrained to the logical `axes` under ctx = (mesh, rules); no-op
  without a ctx (an unsharded model)."""
  if ctx is None:
    return x
  return shd.constrain(x, axes, ctx[0], ctx[1])


def maybe_remat(fn, remat: str):
  """`fn` under `jax.checkpoint` as `Qwen3Config.remat` says ("none": as is)."""
  if remat == "full":
    return jax.checkpoint(fn)
  if remat == "dots":
    return jax.checkpoint(
        fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  return fn


class Qwen3(nnx.Module):
  """Qwen3 causal LM. See the module docstring for the blocks and layouts."""

  def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
    """Random initialisation (normal(0.02) kernels, ones for norms)."""
    self.config = config
    cfg = config
    dtype = jnp.dtype(cfg.param_dtype)
    self.embed_tokens = _param(rngs, (cfg.vocab_size, cfg.hidden_size),
                               ("vocab", "embed"), dtype)
    if cfg.scan_layers:
      self.layers = DecoderLayers(cfg, rngs=rngs, num_stacked=cfg.num_layers)
    else:
      self.layers = nnx.List([DecoderLayers(cfg, rngs=rngs)
                              for _ in range(cfg.num_layers)])
    self.norm = _param(rngs, (cfg.hidden_size,), ("norm",), dtype, ones=True)
    if not cfg.tie_embeddings:
      self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size),
                            ("embed", "vocab"), dtype)
    # (mesh, rules) used for activation constraints; set by sharding.shard_model.
    self.sharding_ctx = None

  def embed(self, input_ids):
    """Token embeddings [B,T,D] of `input_ids` [B,T], in the compute dtype."""
    dt = jnp.dtype(self.config.dtype)
    x = jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(dt)
    return constrain(x, ("batch", "seq", "act_embed"), self.sharding_ctx)

  def _run_layers(self, x, positions, mask):
    """Runs every `decoder_layer` (a loop, or a scan over stacked layers)."""
    cfg, ctx = self.config, self.sharding_ctx
    rope_tab = rope_tables(positions, cfg.head_dim, cfg.rope_theta)

    def layer(p, x):
      return decoder_layer(p, x, rope_tab, mask, cfg, ctx)

    layer = maybe_remat(layer, cfg.remat)
    if cfg.scan_layers:
      x, _ = jax.lax.scan(lambda x, p: (layer(p, x), None), x,
                          self.layers.arrays())
      return x
    for layer_params in self.layers:
      x = layer(layer_params.arrays(), x)
    return x

  def hidden(self, input_ids, attention_mask=None, positions=None,
             segment_ids=None):
    """The final hidden states [B,T,D] (after the last RMSNorm), no LM head.

    Same arguments as `__call__`.
    """
    b, t = input_ids.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    x = self._run_layers(self.embed(input_ids), positions,
                         (attention_mask, segment_ids))
    return rms_norm(x, self.norm[...], self.config.rms_norm_eps)

  def __call__(self, input_ids, attention_mask=None, positions=None,
               segment_ids=None):
    """Full causal forward.

    Args:
      input_ids: [B,T] int token ids.
      attention_mask: optional [B,T], 1 = real token (a key padding mask,
        combined with the causal mask).
      positions: optional [B,T] RoPE positions; default arange(T) per row (as
        transformers does when `position_ids` is not given). Packed rows pass
        positions that restart at 0 in every segment.
      segment_ids: optional [B,T] int: a token attends only to earlier tokens
        of its own segment (packed rows). None = one segment per row.

    Returns:
      [B,T,V] float32 logits.
    """
    return self.head(self.hidden(input_ids, attention_mask, positions,
                                 segment_ids))

  def head(self, h):
    """LM-head logits [...,V] float32 of final hidden states `h` [...,D]."""
    if self.config.tie_embeddings:
      logits = _dense(h, self.embed_tokens[...].astype(h.dtype),
                      w_out_first=True, out_dtype=jnp.float32)
    else:
      logits = _dense(h, self.lm_head[...].astype(h.dtype),
                      out_dtype=jnp.float32)
    return self.constrain_logits(logits)

  def constrain_logits(self, logits):
    """`logits` [B,T,V] on the activation sharding, as float32 (any other
    rank: only the dtype)."""
    if logits.ndim == 3:
      logits = constrain(logits, ("batch", "seq", "act_vocab"), self.sharding_ctx)
    return logits.astype(jnp.float32)
