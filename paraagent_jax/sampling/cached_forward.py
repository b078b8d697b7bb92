"""The Qwen3 forward over a KV cache, and the CPU decode step's weight layouts.

`forward_chunk(model, input_ids, cache, num_new)` appends a right-padded chunk
to each row of a cache (`kv_cache.init_cache`) and serves prefill, decode and
multi-turn continuation (see its docstring for the contract). Its decoder
layer, `cached_layer`, is the model's (`qwen3.keys_values`, `qwen3.queries`,
`qwen3.attention_out`, `qwen3.mlp`) with the chunk's keys and values written
to the cache and the queries attending to it (`kv_cache.write`,
`kv_cache.attend`).

On the CPU a decode step multiplies [B, In] activations by each weight;
`decode_weights(model)` gives out-major copies of the weights for which that
product is faster, and `forward_chunk(..., decode_weights=...)` runs the MLP
and the LM head on them (`_mlp_out_major`, `_head`). The sampler builds them
once per set of weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from paraagent_jax.models import qwen3
from paraagent_jax.sampling import kv_cache

# The most memory `decode_weights` spends on copies (1 GiB: the MLP of
# Qwen3-0.6B in fp32 fits).
DECODE_COPY_MAX_BYTES = 1 << 30


def forward_chunk(model, input_ids, cache, num_new, logits_at=None,
                  decode_weights=None):
  """Appends a right-padded chunk to each row of the cache.

  Token i of row b is written to slot lengths[b]+i with position lengths[b]+i
  and attends to slots j <= lengths[b]+i. Tokens i >= num_new[b] are padding:
  they are not written (their logits are garbage and must be ignored).

  Args:
    model: a `qwen3.Qwen3`.
    input_ids: [B,T] int chunk (right-padded).
    cache: the pytree from `kv_cache.init_cache` (or a previous call).
    num_new: [B] int32, real tokens per row (0 leaves the row untouched).
    logits_at: optional [B] int, one chunk position per row: only its logits
      are computed (a prefill needs the last token's; the LM head over every
      position would be a quarter of the prefill's work at vocab 4096).
    decode_weights: None, or `decode_weights(model)` (out-major weights for a
      decode step's LM head and MLP; the logits are the same up to float
      rounding).

  Returns:
    (logits [B,T,V] float32 ([B,1,V] with `logits_at`), cache with
    lengths += num_new).
  """
  b, t = input_ids.shape
  s = kv_cache.cache_capacity(cache)
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
  select = None if model.config.scan_layers or t == 1 else at
  x, k_all, v_all = _run_layers(
      model, model.embed(input_ids), positions, bound, cache, (b_idx, slot),
      select, None if decode_weights is None else decode_weights["layers"])
  new_cache = kv_cache.constrain_cache(
      model, {"k": k_all, "v": v_all, "lengths": lengths + num_new})
  if at is not None and select is None:
    x = jnp.take_along_axis(x, at[:, None, None], axis=1)
  h = qwen3.rms_norm(x, model.norm[...], model.config.rms_norm_eps)
  return _head(model, h, decode_weights), new_cache


def _run_layers(model, x, positions, bound, cache, write_at, select,
                layer_weights):
  """Runs every `cached_layer`: a loop over per-layer cache buffers (read and
  written in place), or a scan over stacked layers and a stacked cache.

  `write_at`: (b_idx, slot) as `kv_cache.write` takes them. `select` ([B]
  chunk positions; unscanned layers only): the last layer computes its
  output at those positions only. `layer_weights`: None, or
  `decode_weights(model)["layers"]` (out-major MLP weights, added to each
  layer's arrays).

  Returns:
    (x, keys, values) of the updated cache.
  """
  cfg, ctx = model.config, model.sharding_ctx
  rope_tab = qwen3.rope_tables(positions, cfg.head_dim, cfg.rope_theta)
  mlp = qwen3.mlp if layer_weights is None else _mlp_out_major

  def one(p, x, k_all, v_all, layer, select=None):
    return cached_layer(p, x, rope_tab, positions, bound,
                        (k_all, v_all, layer) + write_at, cfg, ctx, mlp, select)

  one = qwen3.maybe_remat(one, cfg.remat)
  k_all, v_all = cache["k"], cache["v"]
  if cfg.scan_layers:
    def body(carry, xs):
      x, k_all, v_all = carry
      p, layer = xs
      return one(p, x, k_all, v_all, layer), None
    xs = ({**model.layers.arrays(), **(layer_weights or {})},
          jnp.arange(cfg.num_layers))
    (x, k_all, v_all), _ = jax.lax.scan(body, (x, k_all, v_all), xs)
    return x, k_all, v_all
  ks, vs = [], []
  last = len(model.layers) - 1
  for i, layer in enumerate(model.layers):
    p = layer.arrays()
    if layer_weights is not None:
      p.update(layer_weights[i])
    x, k_i, v_i = one(p, x, k_all[i], v_all[i], None,
                      select if i == last else None)
    ks.append(k_i)
    vs.append(v_i)
  return x, tuple(ks), tuple(vs)


def cached_layer(p, x, rope_tab, positions, bound, kv, cfg: qwen3.Qwen3Config,
                 ctx, mlp=qwen3.mlp, select=None):
  """One decoder layer of a chunk over the cache (`qwen3.decoder_layer`'s
  blocks; the chunk's keys and values go to the cache, the queries read it).

  Args:
    p: the layer's parameter arrays (with `_mlp_out_major`, also its
      `decode_weights` copies).
    x: [B,T,D] residual stream of the chunk.
    rope_tab: `qwen3.rope_tables` of the chunk's positions.
    positions: [B,T] int32, each token's slot (it sees slots <= it).
    bound: int32 scalar, the longest live row after the chunk.
    kv: (keys, values, layer, b_idx, slot) as `kv_cache.write` takes them.
    cfg: model config.
    ctx: (mesh, rules) for activation constraints, or None.
    mlp: `qwen3.mlp`, or `_mlp_out_major` (a CPU decode step's).
    select: None, or [B] int32, one chunk position per row: the layer writes
      the keys and values of every position but computes the rest (queries,
      attention, MLP) at that position only, and returns x [B,1,D].
      `forward_chunk` uses it in the last layer of a chunk whose logits are
      wanted at one position per row.

  Returns:
    (x, keys, values).
  """
  k_all, v_all, layer, b_idx, slot = kv
  h = qwen3.rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
  # RoPE by a product: faster on XLA:CPU, the same bits (`qwen3.apply_rope`).
  k, v = qwen3.keys_values(p, h, rope_tab, cfg, ctx, by_matmul=True)
  if select is not None:
    def take(a):                # a [B,T,...] -> [B,1,...] at `select`
      at = select.reshape(-1, *([1] * (a.ndim - 1)))
      return jnp.take_along_axis(a, at, axis=1)
    x, h, rope_tab, positions = jax.tree.map(take, (x, h, rope_tab, positions))
  q = qwen3.queries(p, h, rope_tab, cfg, ctx, by_matmul=True)
  k_all, v_all = kv_cache.write(k_all, v_all, layer, b_idx, slot, k, v)
  att = kv_cache.attend(q, k_all, v_all, layer, positions, bound, cfg)
  x = qwen3.constrain(x + qwen3.attention_out(p, att, x.dtype),
                      ("batch", "seq", "act_embed"), ctx)
  h = qwen3.rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
  x = qwen3.constrain(x + mlp(p, h, ctx), ("batch", "seq", "act_embed"), ctx)
  return x, k_all, v_all


# --------------------------------------------------------------------------
# The CPU decode step's out-major weights.

def decode_weights(model, max_copy_bytes: int = DECODE_COPY_MAX_BYTES):
  """Out-major copies of the weights a CPU decode step multiplies, or None.

  A decode step multiplies [B, In] activations (B = the batch, 32 in the
  sampler bench) by each weight. XLA:CPU runs that product at ~105-112
  GFLOP/s with the weight [In, Out] and at ~137-154 with it [Out, In] and
  the product written [Out, B] ("OI,BI->OB"); written [B, Out] it is the
  slowest form, ~90 (docs/records/sampler_speed.md). The tied LM head's
  weight, the embedding [V, D], is out-major already; the MLP's are copied,
  transposed. `sampling.Sampler` builds these once per set of weights
  (holding a second copy of the MLP's weights while they are current) and
  its decode loop passes them to `forward_chunk(decode_weights=...)`; the
  prefill, whose products have thousands of rows, keeps the parameters'
  layout.

  Args:
    model: a `qwen3.Qwen3`.
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
  cfg = model.config
  if jax.default_backend() != "cpu" or model.sharding_ctx is not None:
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
    layers = out_major(model.layers.arrays())
  else:
    layers = tuple(out_major(layer.arrays()) for layer in model.layers)
  head = None if cfg.tie_embeddings else model.lm_head[...].T.astype(dt)
  return {"head": head, "layers": layers}


def _head(model, h, weights):
  """`model.head(h)`, or with `decode_weights` the product written [V, rows],
  then transposed."""
  if weights is None:
    return model.head(h)
  w = weights["head"]
  w = model.embed_tokens[...] if w is None else w
  logits = _out_major(
      jnp.einsum("VD,MD->VM", w.astype(h.dtype), h.reshape(-1, h.shape[-1]),
                 preferred_element_type=jnp.float32), h.shape[:-1])
  return model.constrain_logits(logits)


def _mlp_out_major(p, h, ctx):
  """`qwen3.mlp` of `h` [.., D] from `decode_weights`' out-major copies.

  The same products on [F, D] gate and up and [D, F] down, with the
  activations [F, M] in between. (There are no copies for a sharded model,
  so there is nothing to constrain: `ctx` is None.)
  """
  del ctx
  dt = h.dtype
  h2 = h.reshape(-1, h.shape[-1])
  gate = jnp.einsum("FD,MD->FM", p["gate_t"].astype(dt), h2)
  up = jnp.einsum("FD,MD->FM", p["up_t"].astype(dt), h2)
  out = jnp.einsum("DF,FM->DM", p["down_t"].astype(dt), jax.nn.silu(gate) * up)
  return _out_major(out, h.shape[:-1])


def _out_major(y_t, lead):
  """y_t [Out, M] (an out-major product) as [*lead, Out].

  The barrier keeps XLA from folding the transpose into the product: the
  folded product would write [M, Out], the slow form (`decode_weights`).
  """
  return jax.lax.optimization_barrier(y_t).T.reshape(*lead, -1)
