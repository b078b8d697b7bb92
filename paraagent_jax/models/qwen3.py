"""Qwen3 dense decoder in Flax NNX, numerically matching `transformers.Qwen3`.

Architecture (as in Hugging Face `Qwen3ForCausalLM`): token embedding, decoder
layers of [RMSNorm -> grouped-query attention with per-head q/k RMSNorm and
split-halves RoPE -> residual -> RMSNorm -> SwiGLU MLP -> residual], final
RMSNorm, LM head (tied to the embedding or not).

Parameters are stored in einsum layouts with named dimensions:
  B batch, T query positions, S key positions / cache slots, D model width,
  N query heads, K kv heads, G = N / K, H head dim, F MLP width, V vocab, L layers.
Every parameter carries its logical axis names in `out_sharding` metadata (eager
sharding off: `sharding.shard_model` maps the names to a mesh through a rules
table; the trainer refuses axes that do not divide). With `scan_layers` the layer parameters are
stacked along a leading "layers" axis and the stack runs under `jax.lax.scan`.

The KV cache is a plain pytree `{"k", "v", "lengths": [B]}`: with
`scan_layers` "k"/"v" are stacked [L, ...] arrays (the scan slices a layer),
else tuples of L per-layer arrays, one buffer per layer, so that a decode step
reads a layer in place (slicing it out of a stack copied it: 0.13 of 0.99 CPU s
per call of the b32 sampler bench). Per layer, values are [B, K, S, H] and keys
[B, K, H, S], slots last: a decode step's scores are then a [G, H] x [H, S]
product per kv head with the slots as the wide, contiguous axis (XLA CPU ran
the [S, H] form at half the speed), and its values a [G, S] x [S, H] one. Slots
come after the kv heads in both (with slots first XLA CPU transposed the whole
cache layer every step: ~4x slower decode attention). `cache_layers` gives
either as a stacked [L, B, K, S, H] view and `cache_capacity` the slots;
`forward_chunk` appends a right-padded chunk per row and serves prefill, decode
and multi-turn continuation (see its docstring for the contract).

Attention itself lives in `paraagent_jax.models.attention`: the cache-free
forward dispatches on `config.attention` (reference einsum, chunked flash,
XLA, cuDNN, Pallas splash). Token log-probs for the losses are computed from
`hidden` and `head` by `paraagent_jax.learner.logprobs` (in sequence chunks,
`config.logits_chunk`, so that no [B,T,V] fp32 logits exist in a training
step).
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

def cache_capacity(cache: dict) -> int:
  """Slots per row of a cache from `Qwen3.init_cache` (either layout)."""
  return int(jax.tree.leaves(cache["v"])[0].shape[-2])


def cache_layers(cache: dict, name: str):
  """`cache[name]` ("k" or "v") as one [L, B, K, S, H] array.

  A copy when the cache keeps one buffer per layer; keys, stored slots last
  ([.., H, S]), come back with their last two axes swapped.
  """
  arrays = cache[name]
  if isinstance(arrays, (list, tuple)):
    arrays = jnp.stack(arrays)
  return jnp.swapaxes(arrays, -1, -2) if name == "k" else arrays


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


# The most memory `Qwen3.decode_weights` spends on copies (1 GiB: the MLP of
# Qwen3-0.6B in fp32 fits).
DECODE_COPY_MAX_BYTES = 1 << 30


def _layer(p, x, rope_tab, mask, cfg: Qwen3Config, ctx, kv_write=None,
           select=None):
  """One decoder layer as a pure function of its parameter arrays `p`.

  Args:
    p: layer parameter arrays (see `_LAYER_AXES`).
    x: [B,T,D] residual stream (compute dtype).
    rope_tab: `rope_tables` of the chunk's positions.
    mask: which keys each query sees: (attention_mask [B,T] or None,
      segment_ids [B,T] or None) in the cache-free forward; (positions [B,T],
      bound) with a cache: query i sees slots <= positions[:, i], and no real
      query reads a slot at or past the int32 scalar `bound`.
    cfg: model config.
    ctx: (mesh, rules) for activation constraints, or None.
    kv_write: None for a cache-free forward (S = T); else (k_cache, v_cache,
      layer, b_idx, slot) with values [L,B,K,S,H] and keys [L,B,K,H,S] (or
      one layer's [B,K,S,H] / [B,K,H,S] when `layer` is None): the chunk's
      keys/values are scattered to `slot` (out-of-range slots are dropped)
      and attention reads the layer's slots up to the longest live row, in
      place (`attention.cache_attention`).
    select: None, or (with `kv_write`) [B] int32, one chunk position per row:
      the layer writes the keys and values of every position but computes
      the rest (queries, attention, MLP) at that position only, and returns x
      [B,1,D]. `forward_chunk` uses it in the last layer of a chunk whose
      logits are wanted at one position per row.

  Returns:
    (x, k_cache, v_cache); the caches are None in the cache-free forward.
  """
  dt = x.dtype
  con = functools.partial(_constrain, ctx=ctx)
  h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
  k = _dense(h, p["k_proj"].astype(dt))
  v = _dense(h, p["v_proj"].astype(dt))
  k = con(k, ("batch", "seq", "act_kv_heads", None))
  by_matmul = kv_write is not None          # the cache path (see apply_rope)
  k = apply_rope(rms_norm(k, p["k_norm"], cfg.rms_norm_eps), rope_tab, by_matmul)
  if select is not None:
    def take(a):                # a [B,T,...] -> [B,1,...] at `select`
      at = select.reshape(-1, *([1] * (a.ndim - 1)))
      return jnp.take_along_axis(a, at, axis=1)
    x, h, rope_tab = take(x), take(h), tuple(take(a) for a in rope_tab)
    mask = (take(mask[0]), mask[1])
  q = _dense(h, p["q_proj"].astype(dt))
  q = con(q, ("batch", "seq", "act_heads", None))
  q = apply_rope(rms_norm(q, p["q_norm"], cfg.rms_norm_eps), rope_tab, by_matmul)
  if kv_write is None:
    k_all = v_all = None
    attention_mask, segment_ids = mask
    att = attn.self_attention(
        q, k, v, attention_mask=attention_mask, segment_ids=segment_ids,
        impl=cfg.attention, block=cfg.attention_chunk,
        reference_block=cfg.attention_block, ctx=ctx, dtype=cfg.dtype)
  else:
    k_all, v_all, layer, b_idx, slot = kv_write
    # Advanced indices split by the kv-head slice: the update is [B,T,K,H].
    at = (b_idx, slice(None), slot) if layer is None else (
        layer, b_idx, slice(None), slot)
    # Keys are stored [B,K,H,S] (slots last): the same rows, one more slice.
    k_at = at[:-1] + (slice(None), slot)
    k_all = _scatter_rows(k_all, k_at, k)
    v_all = _scatter_rows(v_all, at, v)
    positions, bound = mask
    if cfg.attention == "reference":
      k_l, v_l = (k_all, v_all) if layer is None else (k_all[layer], v_all[layer])
      k_l, v_l = attn.from_storage(k_l), attn.from_storage(v_l)
      k_l = jnp.swapaxes(k_l, -1, -2)
      s = k_l.shape[2]
      vis = jnp.arange(s, dtype=jnp.int32)[None, None, :] <= positions[:, :, None]
      att = attn.reference(q, k_l.astype(dt), v_l.astype(dt), vis, "BKSH")
    else:       # reads the cache in place, block by block (no layer copy)
      att = attn.cache_attention(q, k_all, v_all, positions, bound,
                                 cfg.attention_chunk, layer)
  # One contraction over N*H (both reshapes are free): written "BTNH,NHD",
  # XLA:CPU contracted H-major and transposed o_proj every call (every decode step).
  o_proj = p["o_proj"].astype(dt)
  x = x + _dense(att.reshape(*att.shape[:2], -1),
                 o_proj.reshape(-1, o_proj.shape[-1]))
  x = con(x, ("batch", "seq", "act_embed"))
  h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
  if "down_t" in p:           # a CPU decode step (`Qwen3.decode_weights`)
    return x + _mlp_out_major(h, p, dt), k_all, v_all
  gate = _dense(h, p["gate_proj"].astype(dt))
  up = _dense(h, p["up_proj"].astype(dt))
  hidden = con(jax.nn.silu(gate) * up, ("batch", "seq", "act_mlp"))
  x = x + _dense(hidden, p["down_proj"].astype(dt))
  x = con(x, ("batch", "seq", "act_embed"))
  return x, k_all, v_all


def _out_major(y_t, lead):
  """y_t [Out, M] (an out-major product) as [*lead, Out].

  The barrier keeps XLA from folding the transpose into the product: the
  folded product would write [M, Out], the slow form (`Qwen3.decode_weights`).
  """
  return jax.lax.optimization_barrier(y_t).T.reshape(*lead, -1)


def _mlp_out_major(h, p, dt):
  """The MLP's output for `h` [.., D], from out-major weights.

  The same products as the MLP of `_layer`, on `Qwen3.decode_weights`' copies
  ([F, D] gate and up, [D, F] down) with the activations [F, M] in between.
  """
  h2 = h.reshape(-1, h.shape[-1])
  gate = jnp.einsum("FD,MD->FM", p["gate_t"].astype(dt), h2)
  up = jnp.einsum("FD,MD->FM", p["up_t"].astype(dt), h2)
  out = jnp.einsum("DF,FM->DM", p["down_t"].astype(dt), jax.nn.silu(gate) * up)
  return _out_major(out, h.shape[:-1])


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


def _scatter_rows(cache, at, new):
  """`cache.at[at].set(new)` in cache storage (out-of-range slots dropped)."""
  return cache.at[at].set(attn.to_storage(new, cache.dtype), mode="drop")


def _constrain(x, axes, ctx):
  if ctx is None:
    return x
  return shd.constrain(x, axes, ctx[0], ctx[1])


def _maybe_remat(fn, remat: str):
  if remat == "full":
    return jax.checkpoint(fn)
  if remat == "dots":
    return jax.checkpoint(
        fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  return fn


class Qwen3(nnx.Module):
  """Qwen3 causal LM. See the module docstring for layouts and the cache."""

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

  # -- internals --------------------------------------------------------------

  def _embed(self, input_ids):
    dt = jnp.dtype(self.config.dtype)
    x = jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(dt)
    return _constrain(x, ("batch", "seq", "act_embed"), self.sharding_ctx)

  def _run_layers(self, x, positions, mask, cache=None, b_idx=None, slot=None,
                  select=None, layer_weights=None):
    """Runs all layers (loop or scan); threads the [L,...] caches if given.

    `select` ([B] chunk positions, with a cache, unscanned layers only): the
    last layer computes its output at those positions only (`_layer`).
    `layer_weights`: None, or `decode_weights()["layers"]` (out-major MLP
    weights, added to each layer's arrays).
    """
    cfg, ctx = self.config, self.sharding_ctx

    rope_tab = rope_tables(positions, cfg.head_dim, cfg.rope_theta)

    def one(p, x, k_all, v_all, layer, select=None):
      kv = None if k_all is None else (k_all, v_all, layer, b_idx, slot)
      return _layer(p, x, rope_tab, mask, cfg, ctx, kv, select)

    one = _maybe_remat(one, cfg.remat)
    k_all = v_all = None
    if cache is not None:
      k_all, v_all = cache["k"], cache["v"]
    if cfg.scan_layers:
      def body(carry, xs):
        x, k_all, v_all = carry
        p, layer = xs
        x, k_all, v_all = one(p, x, k_all, v_all, layer)
        return (x, k_all, v_all), None
      xs = ({**self.layers.arrays(), **(layer_weights or {})},
            jnp.arange(cfg.num_layers))
      (x, k_all, v_all), _ = jax.lax.scan(body, (x, k_all, v_all), xs)
    else:       # per-layer caches (a tuple each): read and written in place
      ks, vs = [], []
      last = len(self.layers) - 1
      for i, layer in enumerate(self.layers):
        k_i = v_i = None
        if k_all is not None:
          k_i, v_i = k_all[i], v_all[i]
        p = layer.arrays()
        if layer_weights is not None:
          p.update(layer_weights[i])
        x, k_i, v_i = one(p, x, k_i, v_i, None, select if i == last else None)
        ks.append(k_i)
        vs.append(v_i)
      if k_all is not None:
        k_all, v_all = tuple(ks), tuple(vs)
    return x, k_all, v_all

  # -- public API -------------------------------------------------------------

  def hidden(self, input_ids, attention_mask=None, positions=None,
             segment_ids=None):
    """The final hidden states [B,T,D] (after the last RMSNorm), no LM head.

    Same arguments as `__call__`.
    """
    b, t = input_ids.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    x, _, _ = self._run_layers(self._embed(input_ids), positions,
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

  def decode_weights(self, max_copy_bytes: int = DECODE_COPY_MAX_BYTES):
    """Out-major copies of the weights a CPU decode step multiplies, or None.

    A decode step multiplies [B, In] activations (B = the batch, 32 in the
    sampler bench) by each weight. XLA:CPU runs that product at ~105-112
    GFLOP/s with the weight [In, Out] and at ~137-154 with it [Out, In] and
    the product written [Out, B] ("OI,BI->OB"); written [B, Out] it is the
    slowest form, ~90 (docs/records/sampler_speed.md). The tied LM head's weight, the
    embedding [V, D], is out-major already; the MLP's are copied, transposed.
    `sampling.Sampler` builds these once per set of weights (holding a second
    copy of the MLP's weights while they are current) and its decode loop
    passes them to `forward_chunk(decode_weights=...)`; the prefill, whose
    products have thousands of rows, keeps the parameters' layout.

    Args:
      max_copy_bytes: the most the copies may take. Above it (a CPU model of
        more than ~0.6B parameters in fp32) the MLP keeps the parameters'
        layout, and so does an untied head.

    Returns:
      None off the CPU, for a sharded model (the dry run's stand-in for
      accelerators), and for an untied model whose copies exceed
      `max_copy_bytes`; else {"head": None (tied: the embedding) or the untied
      head as [V, D], "layers": None (over `max_copy_bytes`) or per layer
      {"gate_t": [F, D], "up_t": [F, D], "down_t": [D, F]} (a tuple; stacked
      [L, ...] arrays for scanned layers)}.
    """
    cfg = self.config
    if jax.default_backend() != "cpu" or self.sharding_ctx is not None:
      return None
    dt = jnp.dtype(cfg.dtype)
    copy_bytes = dt.itemsize * (
        3 * cfg.num_layers * cfg.hidden_size * cfg.intermediate_size
        + (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size))
    if copy_bytes > max_copy_bytes:
      return {"head": None, "layers": None} if cfg.tie_embeddings else None

    def out_major(p):
      return {"gate_t": jnp.swapaxes(p["gate_proj"], -1, -2).astype(dt),
              "up_t": jnp.swapaxes(p["up_proj"], -1, -2).astype(dt),
              "down_t": jnp.swapaxes(p["down_proj"], -1, -2).astype(dt)}

    if cfg.scan_layers:
      layers = out_major(self.layers.arrays())
    else:
      layers = tuple(out_major(layer.arrays()) for layer in self.layers)
    head = None if cfg.tie_embeddings else self.lm_head[...].T.astype(dt)
    return {"head": head, "layers": layers}

  def head(self, h, decode_weights=None):
    """LM-head logits [...,V] float32 of final hidden states `h` [...,D].

    `decode_weights`: None, or `decode_weights()` (the product written
    [V, rows], then transposed).
    """
    cfg = self.config
    if decode_weights is not None:
      w = decode_weights["head"]
      w = self.embed_tokens[...] if w is None else w
      logits = _out_major(
          jnp.einsum("VD,MD->VM", w.astype(h.dtype), h.reshape(-1, h.shape[-1]),
                     preferred_element_type=jnp.float32), h.shape[:-1])
    elif cfg.tie_embeddings:
      logits = _dense(h, self.embed_tokens[...].astype(h.dtype),
                      w_out_first=True, out_dtype=jnp.float32)
    else:
      logits = _dense(h, self.lm_head[...].astype(h.dtype),
                      out_dtype=jnp.float32)
    if logits.ndim == 3:
      logits = _constrain(logits, ("batch", "seq", "act_vocab"), self.sharding_ctx)
    return logits.astype(jnp.float32)

  def init_cache(self, batch_size: int, max_len: int, dtype=None) -> dict:
    """An empty KV cache: {"k","v": zeros, "lengths": [B] int32}.

    "v" is an [L,B,K,S,H] array with `scan_layers`, else a tuple of L
    [B,K,S,H] arrays; "k" the same with slots last, [.., H, S] (see the
    module docstring; `cache_layers` gives either as [L,B,K,S,H]).

    A bfloat16 cache is stored as uint16 bits (`attention.STORAGE`); read it
    with `attention.from_storage`.
    """
    cfg = self.config
    dtype = attn.storage_dtype(dtype or cfg.dtype)
    shape = (batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
    k_shape = shape[:2] + shape[:1:-1]          # keys [B,K,H,S]: slots last
    if cfg.scan_layers:
      zeros = lambda shape: jnp.zeros((cfg.num_layers,) + shape, dtype)
    else:
      zeros = lambda shape: tuple(jnp.zeros(shape, dtype)
                                  for _ in range(cfg.num_layers))
    cache = {"k": zeros(k_shape), "v": zeros(shape),
             "lengths": jnp.zeros((batch_size,), jnp.int32)}
    return self.constrain_cache(cache)

  def constrain_cache(self, cache: dict) -> dict:
    """Applies the cache's logical sharding (batch over data/fsdp, kv heads)."""
    ctx = self.sharding_ctx
    axes = ("batch", "act_kv_heads", "cache_seq", None)
    k_axes = axes[:2] + axes[:1:-1]

    def con(arrays, axes):
      if isinstance(arrays, (list, tuple)):
        return tuple(_constrain(a, axes, ctx) for a in arrays)
      return _constrain(arrays, ("layers",) + axes, ctx)

    return {"k": con(cache["k"], k_axes), "v": con(cache["v"], axes),
            "lengths": cache["lengths"]}

  def resize_cache(self, cache: dict, capacity: int) -> dict:
    """`cache` with room for `capacity` slots per row (it can only grow).

    The filled slots and the lengths are kept; the new slots are zeros. A
    sampler that starts small and grows its cache when a row needs more
    (`sampling.Sampler(cache_steps=...)`) runs its decode steps over the
    slots its rows can reach, not over the whole capacity.
    """
    s = cache_capacity(cache)
    if capacity < s:
      raise ValueError(f"cannot shrink a cache of {s} slots to {capacity}")

    def pad(arrays, axis):
      def one(a):
        widths = [(0, 0)] * a.ndim
        widths[axis % a.ndim] = (0, capacity - s)
        return jnp.pad(a, widths)
      if isinstance(arrays, (list, tuple)):
        return tuple(one(a) for a in arrays)
      return one(arrays)
    # Keys are [.., H, S] (slots last), values [.., S, H].
    return self.constrain_cache({"k": pad(cache["k"], -1),
                                 "v": pad(cache["v"], -2),
                                 "lengths": cache["lengths"]})

  def forward_chunk(self, input_ids, cache, num_new, logits_at=None,
                    decode_weights=None):
    """Appends a right-padded chunk to each row of the cache.

    Token i of row b is written to slot lengths[b]+i with position lengths[b]+i
    and attends to slots j <= lengths[b]+i. Tokens i >= num_new[b] are padding:
    they are not written (their logits are garbage and must be ignored).

    Args:
      input_ids: [B,T] int chunk (right-padded).
      cache: the pytree from `init_cache` (or a previous call).
      num_new: [B] int32, real tokens per row (0 leaves the row untouched).
      logits_at: optional [B] int, one chunk position per row: only its logits
        are computed (a prefill needs the last token's; the LM head over every
        position would be a quarter of the prefill's work at vocab 4096).
      decode_weights: None, or `decode_weights()` (out-major weights for a
        decode step's LM head and MLP; the logits are the same up to float
        rounding).

    Returns:
      (logits [B,T,V] float32 ([B,1,V] with `logits_at`), cache with
      lengths += num_new).
    """
    b, t = input_ids.shape
    s = cache_capacity(cache)
    lengths = cache["lengths"].astype(jnp.int32)
    num_new = jnp.asarray(num_new, jnp.int32)
    offs = jnp.arange(t, dtype=jnp.int32)[None, :]
    positions = lengths[:, None] + offs                                 # [B,T]
    slot = jnp.where(offs < num_new[:, None], positions, s)  # s = dropped write
    b_idx = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], (b, t))
    # The longest live row after this chunk: attention reads no slot past it.
    bound = jnp.max(lengths + num_new)
    at = None
    if logits_at is not None:
      at = jnp.clip(jnp.asarray(logits_at, jnp.int32), 0, t - 1)
    # Unscanned, the last layer computes its output at `at` only: the other
    # positions' outputs would be thrown away (~23% of the demo's prefill).
    select = None if self.config.scan_layers or t == 1 else at
    x, k_all, v_all = self._run_layers(self._embed(input_ids), positions,
                                       (positions, bound), cache, b_idx, slot,
                                       select, None if decode_weights is None
                                       else decode_weights["layers"])
    new_cache = self.constrain_cache(
        {"k": k_all, "v": v_all, "lengths": lengths + num_new})
    if at is not None and select is None:
      x = jnp.take_along_axis(x, at[:, None, None], axis=1)
    return self.head(rms_norm(x, self.norm[...], self.config.rms_norm_eps),
                     decode_weights), new_cache
