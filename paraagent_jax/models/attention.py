"""Attention implementations for the Qwen3 model, chosen by `Qwen3Config.attention`.

Two kinds of attention run in Qwen3; this file holds the first:

* **Self-attention of a cache-free forward** (SFT, the GRPO loss, scoring):
  causal, grouped-query, with segment ids (packed rows: no attention across
  segments) and a key padding mask. `self_attention` dispatches it to:

  - ``"reference"``: the einsum path, dense `[B,K,G,T,S]` fp32 scores (with
    `attention_block` > 0, in causal query blocks). The ground truth of the
    tests; memory grows with T^2.
  - ``"blocked"``: the reference math in causal query blocks of
    `attention_block` (default `CPU_QUERY_BLOCK`) with a hand-written VJP
    that reuses the forward's probabilities (`blocked_attention`); on the
    demo model ~20% faster than autodiff of the blocked reference path.
  - ``"chunked"``: flash attention in pure JAX (`flash_attention`): an online
    softmax over key blocks inside query blocks, with a custom VJP that
    recomputes scores tile by tile in one pass (dq, dk, dv together). Holds
    `[B,K,G,bq,bk]` scores and the per-row log-sum-exp, never T^2; skips the
    blocks above the diagonal. Runs on every backend; the default on the CPU for rows longer than
    `CPU_DENSE_MAX` tokens (and so in the dry run).
  - ``"xla"``: `jax.nn.dot_product_attention(implementation="xla")` with a
    dense boolean mask (T^2 memory; a library cross-check).
  - ``"cudnn"``: `jax.nn.dot_product_attention(implementation="cudnn")` (cuDNN
    flash attention on NVIDIA GPUs; bf16/fp16 only). cuDNN's mask here is
    causal + per-row key length: packed rows (segment ids) take ``"chunked"``,
    and so does a batch with a row that is not right-padded (a `lax.cond` on
    the device; the training batches here are right-padded).
  - ``"splash"``: the Pallas TPU splash-attention kernel
    (`jax.experimental.pallas.ops.tpu.splash_attention`) with causal mask and
    segment ids, run per shard under `shard_map` when the model is sharded.
  - ``"tokamax"`` (opt-in; `pip install tokamax`): `tokamax.dot_product_attention`,
    which picks its own kernel (Pallas Mosaic on TPU and Hopper/Blackwell
    GPUs, then Triton, then XLA's dense path), run per shard like splash.
    Unpacked right-padded rows go as causal + per-row lengths; packed or
    otherwise padded rows as the dense causal + segment mask (`tokamax_attention`).
    On the CPU it is XLA's dense path (T^2 memory): docs/gpu.md, "tokamax".
  - ``"auto"`` (default): splash on TPU, cuDNN on GPU for bf16/fp16 models,
    and on the CPU the blocked path for rows of up to `CPU_DENSE_MAX` tokens
    (faster there than chunked, whose backward recomputes the scores;
    `benchmarks/attention_bench.py --preset=demo`), chunked beyond.

* **Attention over the KV cache** (prefill, continuation, decode) is the
  sampler's: `paraagent_jax.sampling.kv_cache.cache_attention` reads the
  cache in place, block by block (the dense `reference` over a cache layer
  is its check and its ``"reference"`` path).

All paths keep softmax statistics in fp32. Layouts: q [B,T,N,H], fresh k/v
[B,S,K,H] ("BSKH"), a cache layer's values [B,K,S,H] ("BKSH"); N = K * G
query heads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax import sharding as shd

# Finite "minus infinity": a query with no visible key (a left-padding
# position) then gets a uniform softmax in the reference path instead of NaN.
MASK_VALUE = -1e30

IMPLEMENTATIONS = ("auto", "reference", "blocked", "chunked", "xla", "cudnn",
                   "splash", "tokamax")

# "auto" on the CPU: rows up to this long use the blocked path (dense scores
# per causal query block; its [T, T] scores per head are at most 16 MiB
# here), longer rows the chunked path.
CPU_DENSE_MAX = 2048
# Query block of the blocked path when `attention_block` is 0.
CPU_QUERY_BLOCK = 128


def resolve(name: str, dtype=jnp.float32, platform: str | None = None,
            seq_len: int | None = None) -> str:
  """The concrete implementation `name` stands for on `platform`.

  ``"auto"`` is splash on TPU, cuDNN on GPU for bf16/fp16 compute, and
  otherwise the blocked path for rows of at most `CPU_DENSE_MAX` tokens
  (`seq_len`; None = long) and chunked beyond. Unknown names raise
  ValueError listing the known ones.
  """
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"attention={name!r}; expected one of {IMPLEMENTATIONS}")
  if name != "auto":
    return name
  platform = platform or jax.default_backend()
  if platform == "tpu":
    return "splash"
  if platform in ("gpu", "cuda", "rocm") and jnp.dtype(dtype) in (
      jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return "cudnn"
  if seq_len is not None and seq_len <= CPU_DENSE_MAX:
    return "blocked"
  return "chunked"


# --------------------------------------------------------------------------
# Masks shared by every path.

def row_segments(attention_mask, segment_ids, b: int, t: int):
  """[B,T] int32 ids: equal ids may attend (causally); padding is id 0.

  Real tokens get `segment_ids` (default 1) and padding gets 0, so a padding
  query sees only padding keys (its output is garbage either way) and a real
  query never sees padding. The reference path's mask is the same for every
  real query.
  """
  seg = (jnp.ones((b, t), jnp.int32) if segment_ids is None
         else jnp.asarray(segment_ids, jnp.int32) + 1)
  if attention_mask is not None:
    seg = jnp.where(jnp.asarray(attention_mask) > 0, seg, 0)
  return seg


def dense_mask(seg):
  """[B,T,T] bool: causal and same segment (the reference path's mask)."""
  t = seg.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))[None]
  return causal & (seg[:, :, None] == seg[:, None, :])


# --------------------------------------------------------------------------
# Reference: dense einsum.

def reference(q, k, v, mask_bts, kv_layout: str = "BSKH"):
  """Grouped-query attention with dense scores; softmax in fp32. [B,T,N,H].

  `kv_layout` names the layout of k and v: "BSKH" (fresh projections) or
  "BKSH" (a cache layer). `mask_bts` [B,T,S] bool says which keys a query sees.
  """
  b, t, n, h = q.shape
  kh = k.shape[kv_layout.index("K")]
  qg = q.reshape(b, t, kh, n // kh, h)
  scores = jnp.einsum(f"BTKGH,{kv_layout}->BKGTS", qg, k,
                      preferred_element_type=jnp.float32) * (h ** -0.5)
  scores = jnp.where(mask_bts[:, None, None], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum(f"BKGTS,{kv_layout}->BTKGH", probs, v)
  return out.reshape(b, t, n, h)


def reference_blocked(q, k, v, mask_bts, block: int):
  """`reference` of a causal forward in query blocks over their key prefix.

  Queries [s, s+block) attend to keys [0, s+block) only: the later keys are
  masked for every one of them, so this is the dense math (up to rounding)
  with about half the score entries, and much faster on the CPU (the dense
  [T,T] scores of a head do not fit in cache; `benchmarks/attention_bench.py`).
  """
  t = q.shape[1]
  outs = []
  for s in range(0, t, block):
    e = min(t, s + block)
    outs.append(reference(q[:, s:e], k[:, :e], v[:, :e], mask_bts[:, s:e, :e]))
  return jnp.concatenate(outs, axis=1)


# --------------------------------------------------------------------------
# Blocked: dense scores per causal query block, with a written backward.

def _blocked_fwd_block(qg, k, v, vis):
  """One query block: output [B,t,K,G,H] and probabilities [B,K,G,t,S] (fp32).

  qg [B,t,K,G,H] is pre-scaled; k, v [B,S,K,H]; vis [B,t,S] bool.
  """
  s = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32)
  s = jnp.where(vis[:, None, None], s, MASK_VALUE)
  p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
  p = p * (1.0 / jnp.sum(p, axis=-1, keepdims=True))
  o = jnp.einsum("BKGTS,BSKH->BTKGH", p.astype(v.dtype), v,
                 preferred_element_type=jnp.float32)
  return o, p


def _blocked_fwd(qg, k, v, vis, block):
  t = qg.shape[1]
  outs, probs = [], []
  for s in range(0, t, block):
    e = min(t, s + block)
    o, p = _blocked_fwd_block(qg[:, s:e], k[:, :e], v[:, :e], vis[:, s:e, :e])
    outs.append(o)
    probs.append(p)
  out = jnp.concatenate(outs, axis=1).astype(qg.dtype)
  return out, (qg, k, v, out, tuple(probs))


def _blocked_bwd(block, res, dout):
  """dq, dk, dv from the saved probabilities: 4 matmuls and 1 elementwise
  pass over the scores per block (autodiff of the reference path re-reads
  them several times)."""
  qg, k, v, out, probs = res
  t = qg.shape[1]
  f32 = lambda x: x.astype(jnp.float32)
  dout = f32(dout)
  delta = jnp.einsum("BTKGH,BTKGH->BKGT", dout, f32(out))    # sum_h dO * O
  dqs = []
  dk = jnp.zeros(k.shape, jnp.float32)
  dv = jnp.zeros(v.shape, jnp.float32)
  for i, s in enumerate(range(0, t, block)):
    e = min(t, s + block)
    p, do = probs[i], dout[:, s:e]
    dv = dv.at[:, :e].add(jnp.einsum("BKGTS,BTKGH->BSKH", p, do))
    dp = jnp.einsum("BTKGH,BSKH->BKGTS", do, f32(v[:, :e]))
    ds = p * (dp - delta[..., s:e, None])
    dqs.append(jnp.einsum("BKGTS,BSKH->BTKGH", ds, f32(k[:, :e])))
    dk = dk.at[:, :e].add(jnp.einsum("BKGTS,BTKGH->BSKH", ds, f32(qg[:, s:e])))
  dq = jnp.concatenate(dqs, axis=1)
  return dq.astype(qg.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _blocked(qg, k, v, vis, block):
  return _blocked_fwd(qg, k, v, vis, block)[0]


_blocked.defvjp(_blocked_fwd, _blocked_bwd)


def blocked_attention(q, k, v, mask_bts, block: int = CPU_QUERY_BLOCK):
  """`reference_blocked` with a hand-written backward. [B,T,N,H].

  The same causal query blocks over their key prefix and dense fp32 scores
  per block, but the VJP reuses the forward's probabilities (saved: about
  half of the [B,N,T,T] scores, as autodiff of the reference path also
  keeps) in one elementwise pass per block. The CPU's default for rows of up
  to `CPU_DENSE_MAX` tokens (`benchmarks/attention_bench.py`).
  """
  b, t, n, h = q.shape
  kh = k.shape[2]
  qg = (q * jnp.asarray(h ** -0.5, q.dtype)).reshape(b, t, kh, n // kh, h)
  return _blocked(qg, k, v, mask_bts, max(1, min(block, t))).reshape(b, t, n, h)


# --------------------------------------------------------------------------
# Chunked flash attention in pure JAX (custom VJP).

def _blocks(x, n, size, axis=1):
  """Splits `axis` of x into [n, size] (moved to the front: [n, ..., size, ...])."""
  shape = x.shape[:axis] + (n, size) + x.shape[axis + 1:]
  return jnp.moveaxis(x.reshape(shape), axis, 0)


def _block_scores(qb, kb, qseg, kseg, qi, kj, bq, bk, scale):
  """Scores [B,K,G,bq,bk] (fp32, scaled) and the visibility mask."""
  s = jnp.einsum("BTKGH,BSKH->BKGTS", qb, kb,
                 preferred_element_type=jnp.float32) * scale
  qpos = qi * bq + jnp.arange(bq)
  kpos = kj * bk + jnp.arange(bk)
  vis = (kpos[None, :] <= qpos[:, None])[None] & (
      qseg[:, :, None] == kseg[:, None, :])                      # [B,bq,bk]
  return s, vis[:, None, None]


def _flash_fwd_impl(q, k, v, qseg, kseg, bq, bk):
  """Forward: (out [B,T,K,G,H], lse [B,K,G,T]); T divisible by bq and bk."""
  b, t, kh, g, h = q.shape
  nq, nk = t // bq, t // bk
  scale = h ** -0.5
  kblk, vblk, ksegb = _blocks(k, nk, bk), _blocks(v, nk, bk), _blocks(kseg, nk, bk)

  def q_block(_, xs):
    qi, qb, qsb = xs
    m0 = jnp.full((b, kh, g, bq), MASK_VALUE, jnp.float32)
    l0 = jnp.zeros((b, kh, g, bq), jnp.float32)
    acc0 = jnp.zeros((b, kh, g, bq, h), jnp.float32)

    def kv_step(kj, carry):
      m, l, acc = carry
      s, vis = _block_scores(qb, kblk[kj], qsb, ksegb[kj], qi, kj, bq, bk, scale)
      s = jnp.where(vis, s, MASK_VALUE)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.where(vis, jnp.exp(s - m_new[..., None]), 0.0)
      corr = jnp.exp(m - m_new)
      l = l * corr + jnp.sum(p, axis=-1)
      pv = jnp.einsum("BKGTS,BSKH->BKGTH", p.astype(v.dtype), vblk[kj],
                      preferred_element_type=jnp.float32)
      return m_new, l, acc * corr[..., None] + pv

    # Causal: key blocks past this query block's last row are all masked.
    n_kv = jnp.minimum(nk, ((qi + 1) * bq - 1) // bk + 1)
    m, l, acc = jax.lax.fori_loop(0, n_kv, kv_step, (m0, l0, acc0))
    l_safe = jnp.maximum(l, 1e-30)
    out = (acc / l_safe[..., None]).astype(q.dtype)            # [B,K,G,bq,H]
    lse = m + jnp.log(l_safe)
    return None, (jnp.moveaxis(out, 3, 1), lse)                # [B,bq,K,G,H]

  xs = (jnp.arange(nq), _blocks(q, nq, bq), _blocks(qseg, nq, bq))
  _, (out, lse) = jax.lax.scan(q_block, None, xs)
  out = jnp.moveaxis(out, 0, 1).reshape(b, t, kh, g, h)
  lse = jnp.moveaxis(lse, 0, 3).reshape(b, kh, g, t)
  return out, lse


def _flash_bwd_impl(q, k, v, qseg, kseg, out, lse, dout, bq, bk):
  """Gradients (dq, dk, dv), recomputing the probabilities tile by tile.

  One pass (FlashAttention-2's order): key blocks outside, the query blocks
  that see them inside; each tile's probabilities are recomputed once and feed
  dk and dv (carried per key block) and dq (accumulated in a [nq, ...] buffer
  carried across key blocks). Two passes (dq, then dk/dv) computed every
  tile's scores, exp and dO.V twice.
  """
  b, t, kh, g, h = q.shape
  nq, nk = t // bq, t // bk
  scale = h ** -0.5
  # D_i = sum_h dO_i * O_i: the softmax-gradient correction per query row.
  delta = jnp.einsum("BTKGH,BTKGH->BKGT", dout.astype(jnp.float32),
                     out.astype(jnp.float32))
  qblk, qsegb, doblk = _blocks(q, nq, bq), _blocks(qseg, nq, bq), _blocks(dout, nq, bq)
  lseb, deltab = _blocks(lse, nq, bq, axis=3), _blocks(delta, nq, bq, axis=3)
  kblk, vblk, ksegb = _blocks(k, nk, bk), _blocks(v, nk, bk), _blocks(kseg, nk, bk)

  def kv_block(dq, kj):
    kb, vb = kblk[kj], vblk[kj]

    def q_step(qi, carry):
      dq, dk, dv = carry
      s, vis = _block_scores(qblk[qi], kb, qsegb[qi], ksegb[kj], qi, kj,
                             bq, bk, scale)
      p = jnp.where(vis, jnp.exp(s - lseb[qi][..., None]), 0.0)   # [B,K,G,bq,bk]
      dp = jnp.einsum("BTKGH,BSKH->BKGTS", doblk[qi], vb,
                      preferred_element_type=jnp.float32)
      ds = p * (dp - deltab[qi][..., None])
      dv = dv + jnp.einsum("BKGTS,BTKGH->BSKH", p, doblk[qi].astype(jnp.float32))
      dk = dk + jnp.einsum("BKGTS,BTKGH->BSKH", ds, qblk[qi].astype(jnp.float32))
      dq_i = dq[qi] + jnp.einsum("BKGTS,BSKH->BTKGH", ds, kb.astype(jnp.float32))
      return jax.lax.dynamic_update_index_in_dim(dq, dq_i, qi, 0), dk, dv

    zeros = jnp.zeros((b, bk, kh, h), jnp.float32)
    first_q = (kj * bk) // bq          # earlier query blocks see none of these keys
    dq, dk, dv = jax.lax.fori_loop(first_q, nq, q_step, (dq, zeros, zeros))
    return dq, ((dk * scale).astype(k.dtype), dv.astype(v.dtype))

  dq0 = jnp.zeros((nq, b, bq, kh, g, h), jnp.float32)
  dq, (dk, dv) = jax.lax.scan(kv_block, dq0, jnp.arange(nk))
  dq = (dq * scale).astype(q.dtype)
  unblock = lambda x: jnp.moveaxis(x, 0, 1).reshape((b, t) + x.shape[3:])
  return unblock(dq), unblock(dk), unblock(dv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(q, k, v, qseg, kseg, bq, bk):
  return _flash_fwd_impl(q, k, v, qseg, kseg, bq, bk)[0]


def _flash_fwd(q, k, v, qseg, kseg, bq, bk):
  out, lse = _flash_fwd_impl(q, k, v, qseg, kseg, bq, bk)
  return out, (q, k, v, qseg, kseg, out, lse)


def _flash_bwd(bq, bk, res, dout):
  q, k, v, qseg, kseg, out, lse = res
  dq, dk, dv = _flash_bwd_impl(q, k, v, qseg, kseg, out, lse, dout, bq, bk)
  zero_seg = np.zeros(qseg.shape, jax.dtypes.float0)
  return dq, dk, dv, zero_seg, zero_seg


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, seg, block: int = 512):
  """Causal grouped-query attention with segment ids, in blocks. [B,T,N,H].

  Args:
    q: [B,T,N,H] queries; k, v: [B,T,K,H] keys and values of the same tokens.
    seg: [B,T] int segment ids (`row_segments`): query i sees key j <= i with
      seg[j] == seg[i].
    block: query and key block size (rows are padded up to a multiple).

  Memory: scores of one [block, block] tile per (batch, head), plus the
  per-row log-sum-exp saved for the backward pass.
  """
  b, t, n, h = q.shape
  kh = k.shape[2]
  bs = min(block, t)
  tp = -(-t // bs) * bs
  qg = q.reshape(b, t, kh, n // kh, h)
  if tp != t:                     # padded rows see nothing and are cut off
    pad = ((0, 0), (0, tp - t), (0, 0), (0, 0))
    qg = jnp.pad(qg, pad + ((0, 0),))
    k, v = jnp.pad(k, pad), jnp.pad(v, pad)
  qseg = jnp.pad(seg, ((0, 0), (0, tp - t)), constant_values=-1)
  kseg = jnp.pad(seg, ((0, 0), (0, tp - t)), constant_values=-2)
  out = _flash(qg, k, v, qseg, kseg, bs, bs)
  return out[:, :t].reshape(b, t, n, h)


# --------------------------------------------------------------------------
# Library kernels.

def xla_attention(q, k, v, seg):
  """`jax.nn.dot_product_attention` (XLA) with the dense causal+segment mask."""
  return jax.nn.dot_product_attention(
      q, k, v, mask=dense_mask(seg)[:, None], implementation="xla")


def right_padded_lengths(seg):
  """([B] int32 real tokens per row, whether every row is right-padded).

  Kernels whose mask is causal + a length per row (cuDNN, tokamax's) are
  exact only when each row's real tokens come first; the flag (a device
  scalar) lets `self_attention` fall back to a dense or segment mask.
  """
  real = seg > 0
  lengths = jnp.sum(real, axis=1).astype(jnp.int32)
  right = jnp.all(real == (jnp.arange(seg.shape[1])[None] < lengths[:, None]))
  return lengths, right


def cudnn_attention(q, k, v, lengths):
  """cuDNN flash attention: causal, right-padded rows (`lengths` per row)."""
  return jax.nn.dot_product_attention(
      q, k, v, is_causal=True, query_seq_lengths=lengths,
      key_value_seq_lengths=lengths, implementation="cudnn")


def splash_attention(q, k, v, seg, *, interpret: bool = False, block: int = 512):
  """The Pallas TPU splash kernel: causal, segment ids, GQA. [B,T,N,H].

  Runs on one shard's arrays (see `self_attention` for the shard_map).
  `interpret=True` runs the kernel in the Pallas interpreter (CPU tests).
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=g-import-not-at-top
      splash_attention_kernel as sk, splash_attention_mask as sm)
  b, t, n, h = q.shape
  bs = min(block, t)
  sizes = sk.BlockSizes(block_q=bs, block_kv=bs, block_kv_compute=bs,
                        block_q_dkv=bs, block_kv_dkv=bs, block_kv_dkv_compute=bs,
                        block_q_dq=bs, block_kv_dq=bs)
  mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(n)])
  kernel = sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1,
                              q_seq_shards=1, interpret=interpret)
  qt = jnp.swapaxes(q * (h ** -0.5), 1, 2)          # [B,N,T,H]; splash does not scale
  kt, vt = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
  out = jax.vmap(lambda a, b_, c, s: kernel(a, b_, c, segment_ids=sk.SegmentIds(s, s)))(
      qt, kt, vt, seg)
  return jnp.swapaxes(out, 1, 2)


def import_tokamax():
  """The `tokamax` module, or ImportError saying how to install it."""
  try:
    import tokamax  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "attention='tokamax' needs the tokamax package (Pallas kernels; not in "
        "requirements.txt): pip install tokamax==0.0.12, or pick another "
        f"attention of {IMPLEMENTATIONS}") from e
  # tokamax reads its options from absl flags and, when nothing has parsed
  # them yet, parses the whole `sys.argv` itself: under pytest, a notebook or
  # any non-absl script that raises "Unknown command line flag". Outside an
  # absl app its options keep their defaults.
  from absl import flags  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return tokamax


def tokamax_attention(q, k, v, seg, *, packed: bool):
  """`tokamax.dot_product_attention`: causal, GQA, padding and segments. [B,T,N,H].

  tokamax picks the kernel (Mosaic on TPU and NVIDIA Hopper/Blackwell, then
  Triton, then XLA). Without segments (`packed=False`) a batch whose rows are
  all right-padded goes as causal + per-row query/key lengths, which every
  tokamax kernel takes; any other padding (checked on the device, `lax.cond`)
  and packed rows go as the dense causal + segment mask [B,1,T,T] (T^2
  bools). Runs on one shard's arrays (see `self_attention`).
  """
  tokamax = import_tokamax()

  def dense(_):
    return tokamax.dot_product_attention(q, k, v, mask=dense_mask(seg)[:, None])

  if packed:
    return dense(None)
  lengths, right_padded = right_padded_lengths(seg)

  def by_lengths(_):
    return tokamax.dot_product_attention(
        q, k, v, is_causal=True, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths)

  return jax.lax.cond(right_padded, by_lengths, dense, None)


def _sharded(fn, q, k, v, seg, ctx):
  """Runs `fn` per shard under shard_map (Pallas kernels do not partition)."""
  mesh, rules = ctx if ctx is not None else (None, None)
  if mesh is None or mesh.size == 1:
    return fn(q, k, v, seg)
  spec = lambda axes, x: shd.logical_to_spec(axes, x.shape, mesh, rules)
  qs = spec(("batch", None, "act_heads", None), q)
  ks = spec(("batch", None, "act_kv_heads", None), k)
  ss = spec(("batch", None), seg)
  return jax.shard_map(fn, mesh=mesh, in_specs=(qs, ks, ks, ss), out_specs=qs,
                       check_vma=False)(q, k, v, seg)


def self_attention(q, k, v, *, attention_mask, segment_ids, impl: str,
                   block: int, reference_block: int = 0, ctx=None,
                   dtype=jnp.float32):
  """Causal self-attention of a cache-free forward, by `impl`. [B,T,N,H]."""
  b, t = q.shape[:2]
  impl = resolve(impl, dtype, seq_len=t)
  seg = row_segments(attention_mask, segment_ids, b, t)
  if impl == "blocked":
    return blocked_attention(q, k, v, dense_mask(seg),
                             reference_block or CPU_QUERY_BLOCK)
  if impl == "reference":
    mask = dense_mask(seg)
    if 0 < reference_block < t:
      return reference_blocked(q, k, v, mask, reference_block)
    return reference(q, k, v, mask)
  if impl == "xla":
    return xla_attention(q, k, v, seg)
  if impl == "cudnn" and segment_ids is None:
    # cuDNN's mask is causal + key lengths: a batch with a row that is not
    # right-padded (checked on the device) takes the chunked path instead.
    lengths, right = right_padded_lengths(seg)
    return jax.lax.cond(right, lambda: cudnn_attention(q, k, v, lengths),
                        lambda: flash_attention(q, k, v, seg, block))
  if impl == "splash":
    return _sharded(functools.partial(splash_attention, block=block), q, k, v,
                    seg, ctx)
  if impl == "tokamax":
    return _sharded(functools.partial(tokamax_attention,
                                      packed=segment_ids is not None),
                    q, k, v, seg, ctx)
  return flash_attention(q, k, v, seg, block)
