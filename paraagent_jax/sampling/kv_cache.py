"""The KV cache: its layouts, its bookkeeping, and attention over it in place.

A cache is a plain pytree `{"k", "v", "lengths": [B] int32}`, made by
`init_cache(model, batch, max_len)`. With `scan_layers` "k"/"v" are stacked
[L, ...] arrays (the scan slices a layer), else tuples of L per-layer arrays,
one buffer per layer, so that a decode step reads a layer in place (slicing
it out of a stack copied it: 0.13 of 0.99 CPU s per call of the b32 sampler
bench). Per layer, values are [B, K, S, H] and keys [B, K, H, S], slots last:
a decode step's scores are then a [G, H] x [H, S] product per kv head with
the slots as the wide, contiguous axis (XLA CPU ran the [S, H] form at half
the speed), and its values a [G, S] x [S, H] one. Slots come after the kv
heads in both (with slots first XLA CPU transposed the whole cache layer
every step: ~4x slower decode attention). `cache_layers` gives either as a
stacked [L, B, K, S, H] view and `cache_capacity` the slots.

A bfloat16 cache is stored as uint16 bits (`STORAGE`; `from_storage` reads
it back). `write` scatters a chunk's keys and values into a layer's slots,
and `attend` lets a chunk's queries attend to the slots up to their
positions: `cache_attention` reads the layer in place, key block by key
block, up to the longest live row (a dynamic bound), with an online softmax,
so that no program copies the cache. `sampling.cached_forward.forward_chunk`
runs the model over a cache with these.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from paraagent_jax.models import attention as attn
from paraagent_jax.models import qwen3

# Key block of `cache_attention` for a chunk of several queries (prefill,
# continuation) on the CPU, when `attention_chunk` is larger: fewer scores
# past the longest live row. 32 x 64-token prefill of the demo model into a
# 192-slot cache: 15 ms for its 4 layers' cache attention, against 37 ms
# with blocks of 256 (docs/records/sampler_speed.md).
CPU_CHUNK_KEY_BLOCK = 64

# The logical axes of a cache layer's values [B, K, S, H] (keys: slots last).
_AXES = ("batch", "act_kv_heads", "cache_seq", None)


# --------------------------------------------------------------------------
# Storage.

# A bfloat16 KV cache is stored as its uint16 bit patterns. XLA:CPU has no
# bf16 scatter or dynamic-slice: it converts the whole cache to fp32 around
# them and keeps that copy through the decode loop (2x the cache in
# temporaries, which also made the dry run's rollout peaks meaningless).
# Only the written chunk and the read blocks are bitcast, which is free.
STORAGE = {jnp.dtype(jnp.bfloat16): jnp.dtype(jnp.uint16)}


def storage_dtype(dtype):
  """The dtype a KV cache of `dtype` is stored in."""
  return STORAGE.get(jnp.dtype(dtype), jnp.dtype(dtype))


def to_storage(x, storage):
  """x (any float dtype) as cache storage of dtype `storage`."""
  if jnp.dtype(storage) == jnp.uint16:
    return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
  return x.astype(storage)


def from_storage(x):
  """Cache storage back to floats (uint16 bits -> bfloat16)."""
  if x.dtype == jnp.uint16:
    return jax.lax.bitcast_convert_type(x, jnp.bfloat16)
  return x


# --------------------------------------------------------------------------
# The cache pytree.

def init_cache(model, batch_size: int, max_len: int, dtype=None) -> dict:
  """An empty KV cache for `model`: {"k","v": zeros, "lengths": [B] int32}.

  "v" is an [L,B,K,S,H] array with `scan_layers`, else a tuple of L
  [B,K,S,H] arrays; "k" the same with slots last, [.., H, S] (see the
  module docstring; `cache_layers` gives either as [L,B,K,S,H]).

  A bfloat16 cache is stored as uint16 bits (`STORAGE`); read it with
  `from_storage`.
  """
  cfg = model.config
  dtype = storage_dtype(dtype or cfg.dtype)
  shape = (batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
  k_shape = shape[:2] + shape[:1:-1]          # keys [B,K,H,S]: slots last
  if cfg.scan_layers:
    zeros = lambda shape: jnp.zeros((cfg.num_layers,) + shape, dtype)
  else:
    zeros = lambda shape: tuple(jnp.zeros(shape, dtype)
                                for _ in range(cfg.num_layers))
  cache = {"k": zeros(k_shape), "v": zeros(shape),
           "lengths": jnp.zeros((batch_size,), jnp.int32)}
  return constrain_cache(model, cache)


def constrain_cache(model, cache: dict) -> dict:
  """Applies the cache's logical sharding (batch over data/fsdp, kv heads)."""
  ctx = model.sharding_ctx
  k_axes = _AXES[:2] + _AXES[:1:-1]

  def con(arrays, axes):
    if isinstance(arrays, (list, tuple)):
      return tuple(qwen3.constrain(a, axes, ctx) for a in arrays)
    return qwen3.constrain(arrays, ("layers",) + axes, ctx)

  return {"k": con(cache["k"], k_axes), "v": con(cache["v"], _AXES),
          "lengths": cache["lengths"]}


def resize_cache(model, cache: dict, capacity: int) -> dict:
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
  return constrain_cache(model, {"k": pad(cache["k"], -1),
                                 "v": pad(cache["v"], -2),
                                 "lengths": cache["lengths"]})


def cache_capacity(cache: dict) -> int:
  """Slots per row of a cache from `init_cache` (either layout)."""
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


def write(k_all, v_all, layer, b_idx, slot, k, v):
  """(k_all, v_all) with a chunk's keys and values k, v [B,T,K,H] written.

  `k_all`, `v_all`: keys [L,B,K,H,S] and values [L,B,K,S,H] (or one layer's
  [B,K,H,S] / [B,K,S,H] when `layer` is None); token t of row b goes to slot
  `slot[b, t]` (`b_idx[b, t]` = b); out-of-range slots are dropped.
  """
  # Advanced indices split by the kv-head slice: the update is [B,T,K,H].
  at = (b_idx, slice(None), slot) if layer is None else (
      layer, b_idx, slice(None), slot)
  # Keys are stored [B,K,H,S] (slots last): the same rows, one more slice.
  k_at = at[:-1] + (slice(None), slot)
  return _scatter_rows(k_all, k_at, k), _scatter_rows(v_all, at, v)


def _scatter_rows(cache, at, new):
  """`cache.at[at].set(new)` in cache storage (out-of-range slots dropped)."""
  return cache.at[at].set(to_storage(new, cache.dtype), mode="drop")


def attend(q, k_all, v_all, layer, positions, bound, cfg: qwen3.Qwen3Config):
  """A chunk's queries q [B,T,N,H] attend to the cache: [B,T,N,H].

  Query i sees the slots <= positions[:, i], and no real query reads a slot
  at or past the int32 scalar `bound` (the longest live row). The caches and
  `layer` are as in `write`. `cfg.attention == "reference"`: dense
  `attention.reference` over the whole layer (a copy); else
  `cache_attention`, in place.
  """
  if cfg.attention != "reference":
    return cache_attention(q, k_all, v_all, positions, bound,
                           cfg.attention_chunk, layer)
  k_l, v_l = (k_all, v_all) if layer is None else (k_all[layer], v_all[layer])
  k_l, v_l = from_storage(k_l), from_storage(v_l)
  k_l = jnp.swapaxes(k_l, -1, -2)
  s = k_l.shape[2]
  vis = jnp.arange(s, dtype=jnp.int32)[None, None, :] <= positions[:, :, None]
  return attn.reference(q, k_l.astype(q.dtype), v_l.astype(q.dtype), vis,
                        "BKSH")


# --------------------------------------------------------------------------
# Attention over the cache, in place.

def cache_attention(q, k_cache, v_cache, positions, bound, block: int = 256,
                    layer=None):
  """Queries attend to cache slots j <= their position, read block by block.

  Args:
    q: [B,T,N,H] queries of the chunk just written to the cache.
    k_cache: one layer's keys [B,K,H,S] (slots last), or, with `layer`, the
      stacked keys [L,B,K,H,S]: blocks are then sliced straight out of the
      stack (no copy of the layer).
    v_cache: the values, [B,K,S,H] (or [L,B,K,S,H] with `layer`).
    positions: [B,T] int32, the slot of each query (it sees slots <= it).
    bound: int32 scalar, one more than the largest slot any real query reads
      (the longest live row): blocks from there on are not read.
    block: slots per block (on the CPU, a chunk of several queries reads
      blocks of at most `CPU_CHUNK_KEY_BLOCK`).
    layer: None, or the (int or traced) layer index into a stacked cache.

  Returns:
    [B,T,N,H]. Equal to `reference` over the whole cache with the same mask
    (up to float rounding); only one block of keys and values and its
    [B,K,G,T,block] scores are live at a time.
  """
  b, t, n, h = q.shape
  kh, s = v_cache.shape[-3], v_cache.shape[-2]
  g = n // kh
  if t > 1 and jax.default_backend() == "cpu":
    # A chunk's queries score every slot of a block they read, so a big block
    # past the bound is work thrown away; XLA:CPU copies each block it slices
    # out, which a decode step (t = 1) cannot amortise but a chunk can.
    block = min(block, CPU_CHUNK_KEY_BLOCK)
  bk = min(block, s)

  def read(cache, start, axis):
    """Slots [start, start + bk) along `axis` of one layer's [B,K,.,.]."""
    if layer is None:
      out = jax.lax.dynamic_slice_in_dim(cache, start, bk, axis=axis)
    else:
      zero = jnp.zeros((), jnp.int32)
      idx = [jnp.asarray(layer, jnp.int32), zero, zero, zero, zero]
      idx[axis + 1] = start
      size = list(cache.shape[1:])
      size[axis] = bk
      out = jax.lax.dynamic_slice(cache, idx, [1] + size)[0]
    return from_storage(out)

  # The queries of one kv head as the rows of one matrix, [B,K,G*T,H] (a free
  # reshape when t = 1). The scores are then a [G*T, H] x [H, S] product per kv
  # head, with the slots (the keys' last axis) as the wide, contiguous output
  # axis, and the values a [G*T, S] x [S, H] one: plain matrix products.
  # Written with separate G and T axes, XLA:CPU laid the scores out [S, G*T]
  # and transposed them, or ran the value product as a multiply and a reduce
  # (docs/records/sampler_speed.md).
  qm = jnp.transpose(q.reshape(b, t, kh, g, h), (0, 2, 3, 1, 4)).reshape(
      b, kh, g * t, h)
  scale = h ** -0.5
  n_blocks = jnp.minimum((jnp.asarray(bound, jnp.int32) + bk - 1) // bk,
                         -(-s // bk))

  def step(j, carry):
    m, l, acc = carry
    # dynamic_slice clamps the last block to [s - bk, s): slots below j * bk
    # were read by the previous block, so they are masked out here.
    start = jnp.minimum(j * bk, s - bk)
    kb, vb = read(k_cache, start, 3), read(v_cache, start, 2)
    sc = jnp.einsum("BKMH,BKHS->BKMS", qm, kb.astype(q.dtype),
                    preferred_element_type=jnp.float32)
    sc = sc.reshape(b, kh, g, t, bk) * scale
    slots = start + jnp.arange(bk)
    vis = (slots[None, None, :] <= positions[:, :, None]) & (
        slots >= j * bk)[None, None, :]                          # [B,T,bk]
    vis = vis[:, None, None]
    sc = jnp.where(vis, sc, attn.MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
    # Masked scores are MASK_VALUE, so their exp is 0 once a row has seen a
    # key. Before that (m_new = MASK_VALUE) they count as 1, and the first
    # block with a visible key scales them away (corr = 0). Every real query
    # sees its own slot; only padding queries, whose output is ignored, see
    # nothing.
    p = jnp.exp(sc - m_new[..., None])
    corr = jnp.exp(m - m_new)
    l = l * corr + jnp.sum(p, axis=-1)
    pv = jnp.einsum("BKMS,BKSH->BKMH",
                    p.reshape(b, kh, g * t, bk).astype(q.dtype),
                    vb.astype(q.dtype), preferred_element_type=jnp.float32)
    return m_new, l, acc * corr[..., None] + pv.reshape(b, kh, g, t, h)

  init = (jnp.full((b, kh, g, t), attn.MASK_VALUE, jnp.float32),
          jnp.zeros((b, kh, g, t), jnp.float32),
          jnp.zeros((b, kh, g, t, h), jnp.float32))
  if s <= bk:
    # One block holds the cache: no loop (its carries and test cost ~1% of a
    # decode step). The block is read even when no row is live (bound 0);
    # then every query is padding, whose output is ignored.
    _, l, acc = step(0, init)
  else:
    _, l, acc = jax.lax.fori_loop(0, n_blocks, step, init)
  out = acc / jnp.maximum(l, 1e-30)[..., None]                  # [B,K,G,T,H]
  return jnp.moveaxis(out, 3, 1).reshape(b, t, n, h).astype(q.dtype)
