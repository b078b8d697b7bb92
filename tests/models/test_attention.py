"""Attention paths and chunked log-probs against their references.

Every implementation of `paraagent_jax.models.attention` is compared with the
dense einsum path (`reference`) on random inputs with padding, packed segments
and GQA ratios 1, 2 and 3, forward and gradients in fp32 (1e-5); and the chunked
log-probs with the unchunked ones (1e-6). The attention over the KV cache is
tested in tests/sampling/test_kv_cache.py.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from paraagent_jax import sharding as shd
from paraagent_jax.models import attention as attn
from paraagent_jax.learner import logprobs
from paraagent_jax.models import qwen3


def _inputs(b, t, n, k, h, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (b, t, n, h))
  kk = jax.random.normal(ks[1], (b, t, k, h))
  v = jax.random.normal(ks[2], (b, t, k, h))
  w = jax.random.normal(ks[3], (b, t, n, h))   # a random linear read-out
  return q, kk, v, w


def _masks(b, t):
  """Row 0 packed (3 segments), row 1 right-padded, row 2 left-padded."""
  mask = np.ones((b, t), np.int32)
  seg = np.zeros((b, t), np.int32)
  seg[0, t // 3:] = 1
  seg[0, t // 2:] = 2
  mask[1, t - 9:] = 0
  mask[2, :5] = 0
  return mask, seg


def _value_and_grads(impl, q, k, v, w, mask, seg, **kw):
  real = jnp.asarray(mask)[:, :, None, None]

  def f(q, k, v):
    out = attn.self_attention(q, k, v, attention_mask=mask, segment_ids=seg,
                              impl=impl, **kw)
    # Only real queries: a padding query's output is unspecified.
    return jnp.sum(out * w * real), out * real

  (loss, out), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(
      q, k, v)
  return loss, out, grads


@pytest.mark.slow
@pytest.mark.parametrize("impl,block", [("chunked", 16), ("chunked", 7),
                                        ("chunked", 512), ("xla", 0),
                                        ("reference", 0), ("blocked", 13),
                                        ("blocked", 128), ("tokamax", 0)])
@pytest.mark.parametrize("n,k", [(4, 4), (4, 2), (6, 2)])
def test_paths_match_reference_forward_and_grads(impl, block, n, k):
  b, t, h = 3, 70, 8                 # 70: not a multiple of the block
  q, kk, v, w = _inputs(b, t, n, k, h)
  mask, seg = _masks(b, t)
  # The reference: dense scores, one [T,T] mask (causal, same segment, real).
  _, want, want_g = _value_and_grads("reference", q, kk, v, w, mask, seg,
                                     block=512)
  ref_blocked = (dict(reference_block=13) if impl == "reference" else
                 dict(reference_block=block) if impl == "blocked" else {})
  _, got, got_g = _value_and_grads(impl, q, kk, v, w, mask, seg,
                                   block=block or 512, **ref_blocked)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  for g, r in zip(got_g, want_g):
    assert np.abs(r).max() > 1e-2
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("left_padded", [False, True])
def test_tokamax_unpacked_rows_match_reference(left_padded):
  """attention='tokamax' without segment ids: right-padded rows go as lengths.

  A batch with a left-padded row must take the dense-mask call instead (the
  lengths cannot say where a row starts); both agree with the reference.
  """
  b, t, n, k, h = 3, 70, 4, 2, 8
  q, kk, v, w = _inputs(b, t, n, k, h, seed=4)
  mask = np.ones((b, t), np.int32)
  mask[1, t - 9:] = 0
  mask[2, t - 30:] = 0
  if left_padded:
    mask[0, :5] = 0
  _, want, want_g = _value_and_grads("reference", q, kk, v, w, mask, None,
                                     block=512)
  _, got, got_g = _value_and_grads("tokamax", q, kk, v, w, mask, None,
                                   block=512)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  for g, r in zip(got_g, want_g):
    assert np.abs(r).max() > 1e-2
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_tokamax_takes_the_lengths_call_only_for_right_padded_rows(monkeypatch):
  """Which tokamax call runs (recorded on the device through a callback)."""
  import tokamax  # pylint: disable=g-import-not-at-top
  calls = []
  real_fn = tokamax.dot_product_attention

  def spy(*args, **kw):
    kind = "lengths" if "key_value_seq_lengths" in kw else "mask"
    jax.debug.callback(lambda: calls.append(kind))
    return real_fn(*args, **kw)

  monkeypatch.setattr(tokamax, "dot_product_attention", spy)
  q, kk, v, _ = _inputs(2, 16, 4, 2, 8, seed=5)
  run = lambda mask, seg=None: jax.block_until_ready(attn.self_attention(
      q, kk, v, attention_mask=mask, segment_ids=seg, impl="tokamax", block=8))
  right = np.ones((2, 16), np.int32)
  right[1, 11:] = 0
  left = np.ones((2, 16), np.int32)
  left[1, :3] = 0
  run(right)
  run(left)
  packed = np.zeros((2, 16), np.int32)
  packed[:, 8:] = 1
  run(None)
  run(None, packed)
  assert calls == ["lengths", "mask", "lengths", "mask"]


@pytest.mark.slow
def test_cudnn_dispatch_falls_back_unless_right_padded(monkeypatch):
  """`impl="cudnn"` passes per-row lengths only for right-padded batches.

  cuDNN needs a GPU; a stand-in with cuDNN's mask (causal + lengths, the XLA
  kernel of `jax.nn.dot_product_attention`) records when it runs. A left-padded
  row must take the chunked path, and both must equal the reference.
  """
  calls = []

  def stand_in(q, k, v, lengths):
    jax.debug.callback(lambda: calls.append("cudnn"))
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=True, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation="xla")

  monkeypatch.setattr(attn, "cudnn_attention", stand_in)
  b, t, n, k, h = 3, 40, 4, 2, 8
  q, kk, v, w = _inputs(b, t, n, k, h, seed=6)
  right = np.ones((b, t), np.int32)
  right[1, 30:] = 0
  left = right.copy()
  left[2, :6] = 0
  for mask, runs in ((right, ["cudnn"]), (left, [])):
    calls.clear()
    _, want, want_g = _value_and_grads("reference", q, kk, v, w, mask, None,
                                       block=512)
    _, got, got_g = _value_and_grads("cudnn", q, kk, v, w, mask, None, block=16)
    jax.effects_barrier()
    assert calls[:1] == runs
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for g, r in zip(got_g, want_g):
      np.testing.assert_allclose(g, r, atol=1e-5, rtol=0)


def test_tokamax_missing_package_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(__import__("sys").modules, "tokamax", None)
  q, kk, v, _ = _inputs(1, 8, 2, 1, 4)
  with pytest.raises(ImportError, match="pip install tokamax"):
    attn.self_attention(q, kk, v, attention_mask=None, segment_ids=None,
                        impl="tokamax", block=8)


@pytest.mark.slow
def test_segments_do_not_attend_across():
  """A packed row equals its segments run one per row."""
  t, h = 40, 8
  q, k, v, _ = _inputs(1, t, 4, 2, h, seed=3)
  seg = np.zeros((1, t), np.int32)
  seg[0, 17:] = 1
  packed = attn.self_attention(q, k, v, attention_mask=None, segment_ids=seg,
                               impl="chunked", block=8)
  for lo, hi in ((0, 17), (17, t)):
    alone = attn.self_attention(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi],
                                attention_mask=None, segment_ids=None,
                                impl="reference", block=8)
    np.testing.assert_allclose(packed[:, lo:hi], alone, atol=1e-5)


@pytest.mark.slow
def test_splash_kernel_in_interpreter_matches_reference():
  """The Pallas TPU splash kernel, run by the Pallas interpreter on the CPU."""
  b, t, n, k, h = 1, 256, 4, 2, 128   # the kernel's tile sizes: 128 multiples
  q, kk, v, w = _inputs(b, t, n, k, h, seed=1)
  seg = np.ones((b, t), np.int32)
  seg[0, 100:] = 2
  seg[0, 240:] = 0                    # padding at the end, as row_segments gives
  real = jnp.asarray(seg > 0)[:, :, None, None]

  def f(fn):
    return jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w * real),
                              argnums=(0, 1, 2))(q, kk, v)

  want, want_g = f(lambda q, k, v: attn.reference(
      q, k, v, attn.dense_mask(jnp.asarray(seg))))
  got, got_g = f(lambda q, k, v: attn.splash_attention(
      q, k, v, jnp.asarray(seg), interpret=True, block=128))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, r in zip(got_g, want_g):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=0)


def test_resolve_auto_and_unknown():
  assert attn.resolve("auto", platform="tpu") == "splash"
  assert attn.resolve("auto", jnp.bfloat16, platform="gpu") == "cudnn"
  assert attn.resolve("auto", jnp.float32, platform="gpu") == "chunked"
  assert attn.resolve("auto", platform="cpu") == "chunked"
  assert attn.resolve("auto", platform="cpu", seq_len=2048) == "blocked"
  assert attn.resolve("auto", platform="cpu", seq_len=2049) == "chunked"
  assert attn.resolve("auto", jnp.bfloat16, platform="gpu",
                      seq_len=64) == "cudnn"
  assert attn.resolve("xla", platform="tpu") == "xla"
  with pytest.raises(ValueError, match="attention='flash'"):
    attn.resolve("flash")
  with pytest.raises(ValueError, match="attention="):
    qwen3.Qwen3Config.preset("tiny", attention="flash")


@pytest.fixture(scope="module")
def tiny_pair():
  """Two tiny models with the same weights: chunked log-probs and unchunked."""
  cfg = qwen3.Qwen3Config.preset("tiny", logits_chunk=8)
  chunked = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  full = qwen3.Qwen3(cfg.replace(logits_chunk=0), rngs=nnx.Rngs(0))
  return chunked, full


@pytest.mark.slow
@pytest.mark.parametrize("temperature,entropy", [(1.0, False), (0.7, True)])
def test_chunked_logprobs_equal_unchunked_with_grads(tiny_pair, temperature,
                                                     entropy):
  chunked, full = tiny_pair
  t = 37                                   # 36 targets: 4.5 chunks of 8
  ids = jax.random.randint(jax.random.key(2), (2, t), 0, 512)
  mask = jnp.ones((2, t), jnp.int32).at[1, 30:].set(0)
  w = jax.random.normal(jax.random.key(3), (2, t))

  def loss(model):
    out = logprobs.model_logprobs(model, ids, mask, temperature=temperature,
                               with_entropy=entropy)
    lp, ent = out if entropy else (out, jnp.zeros_like(out))
    return jnp.sum(lp * w) + jnp.sum(ent * w), (lp, ent)

  (l1, (lp1, e1)), g1 = nnx.value_and_grad(loss, has_aux=True)(chunked)
  (l0, (lp0, e0)), g0 = nnx.value_and_grad(loss, has_aux=True)(full)
  np.testing.assert_allclose(lp1, lp0, atol=1e-6, rtol=0)
  np.testing.assert_allclose(e1, e0, atol=1e-6, rtol=0)
  # The loss sums 72 terms of either sign: 1e-6 of the summed magnitudes.
  scale = float(jnp.sum(jnp.abs(lp0 * w)) + jnp.sum(jnp.abs(e0 * w)))
  np.testing.assert_allclose(l1, l0, atol=1e-6 * scale, rtol=0)
  # Within 1e-6 of the gradient's scale: a parameter's gradient sums over all
  # positions, and the chunks change the fp32 summation order (eps 1.2e-7).
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, atol=1e-6 * max(1.0, np.abs(b).max()),
                               rtol=0)
  # And the unchunked path is numpy's log-softmax of the logits.
  logits = np.asarray(full(ids, attention_mask=mask), np.float64) / temperature
  m = logits.max(-1, keepdims=True)
  logsm = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  ref = np.take_along_axis(logsm[:, :-1], np.asarray(ids)[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(lp0[:, 1:], ref, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("chunk,entropy,fuller_row", [
    (0, False, False), (8, True, False), (0, True, True), (8, False, True)])
def test_compact_logprobs_equal_masked_full_with_grads(chunk, entropy,
                                                       fuller_row):
  """`logits_capacity`: the LM head at the `at` positions only, exactly.

  Rows of 41 tokens (40 targets): capacity 0.25 gives 16 slots a row
  (ceil(10) rounded up to 8). `fuller_row` puts 20 positions in one row, so
  the batch takes the all-positions branch of the `lax.cond`.
  """
  cfg = qwen3.Qwen3Config.preset("tiny", logits_chunk=chunk)
  full = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  compact = qwen3.Qwen3(cfg.replace(logits_capacity=0.25), rngs=nnx.Rngs(0))
  assert logprobs.compact_width(0.25, 40) == 16
  b, t = 3, 41
  ids = jax.random.randint(jax.random.key(4), (b, t), 0, 512)
  pad = jnp.ones((b, t), jnp.int32).at[2, 33:].set(0)
  rs = np.random.RandomState(5)
  at = np.zeros((b, t), np.float32)
  at[0, [1, 2, 3, 17, 18, 39, 40]] = 1        # scattered, up to the last slot
  at[1, rs.choice(np.arange(1, t), 16, replace=False)] = 1   # exactly full
  at[2, 20:26] = 1                             # row 2: real tokens only
  if fuller_row:
    at[1, rs.choice(np.arange(1, t), 20, replace=False)] = 1
  at = jnp.asarray(at)
  w = jax.random.normal(jax.random.key(6), (b, t))

  def loss(model, mask):
    out = logprobs.model_logprobs(model, ids, pad, temperature=0.8,
                               with_entropy=entropy, at=mask)
    lp, ent = out if entropy else (out, jnp.zeros_like(out))
    return jnp.sum(lp * w) + jnp.sum(ent * w), (lp, ent)

  (l1, (lp1, e1)), g1 = nnx.value_and_grad(loss, has_aux=True)(compact, at)
  (l0, (lp0, e0)), g0 = nnx.value_and_grad(loss, has_aux=True)(full, None)
  keep = np.asarray(at) > 0
  # At the `at` positions the values equal the full computation; 0 elsewhere.
  np.testing.assert_allclose(np.where(keep, lp0, 0), lp1, atol=1e-6, rtol=0)
  np.testing.assert_allclose(np.where(keep, e0, 0), e1, atol=1e-6, rtol=0)
  assert np.all(np.asarray(lp1)[~keep] == 0) and np.abs(lp1).sum() > 0
  # Gradients equal those of the full path's masked loss.
  (_, _), g0m = nnx.value_and_grad(
      lambda m: (lambda o: (jnp.sum(jnp.where(keep, o[0] * w, 0))
                            + jnp.sum(jnp.where(keep, o[1] * w, 0)), o))(
          loss(m, None)[1]), has_aux=True)(full)
  for a, ref in zip(jax.tree.leaves(g1), jax.tree.leaves(g0m)):
    np.testing.assert_allclose(a, ref, atol=1e-6 * max(1.0, np.abs(ref).max()),
                               rtol=0)
  # The check can fail: the unmasked loss's gradient is a different one.
  assert any(not np.allclose(a, c, atol=1e-4)
             for a, c in zip(jax.tree.leaves(g0), jax.tree.leaves(g0m)))
  del l0, l1


def test_compact_logprobs_run_the_head_on_the_gathered_rows_only():
  """At run time the head sees [B, W] rows when every row fits, else [B, T-1].

  A `jax.debug.callback` in the head reports the shape it ran on: only the
  branch the `lax.cond` takes runs its callbacks.
  """
  d, v, b, t = 8, 32, 2, 65                       # 64 targets; W(0.25) = 16
  w = jax.random.normal(jax.random.key(0), (d, v))
  seen = []

  def head(h):
    jax.debug.callback(lambda n: seen.append(int(n)), h.shape[1])
    return h @ w

  h = jax.random.normal(jax.random.key(1), (b, t, d))
  ids = jax.random.randint(jax.random.key(2), (b, t), 0, v)
  run = jax.jit(lambda at: logprobs.logprobs_from_hidden(head, h, ids, at=at,
                                                      capacity=0.25))
  fits = jnp.zeros((b, t)).at[:, 10:26].set(1)             # 16 a row
  want = np.asarray(logprobs.logprobs_from_hidden(lambda x: x @ w, h, ids))
  for at, width in ((fits, 16), (fits.at[1, 30].set(1), t - 1)):
    seen.clear()
    got = np.asarray(run(at))
    jax.effects_barrier()
    assert seen == [width], (seen, width)
    np.testing.assert_allclose(got, np.where(np.asarray(at) > 0, want, 0),
                               atol=1e-6)
  with pytest.raises(ValueError, match="logits_capacity"):
    qwen3.Qwen3Config.preset("tiny", logits_capacity=1.5)


def _largest_f32_array(compiled) -> int:
  """Elements of the largest f32 array in a compiled program's optimised HLO."""
  sizes = [math.prod(int(d) for d in dims.split(","))
           for dims in re.findall(r"\bf32\[([0-9,]+)\]", compiled.as_text())]
  return max(sizes, default=0)


@pytest.mark.slow
def test_chunked_logprobs_hold_no_full_logits():
  """The compiled gradient of a chunked loss never allocates [B,T,V] fp32."""
  cfg = qwen3.Qwen3Config.preset("tiny", vocab_size=4096, attention_chunk=128)
  ids = jnp.zeros((4, 1024), jnp.int32)
  logit_elems = 4 * 1023 * 4096                          # the shifted targets' logits
  full_logits = 4 * 1024 * 4096 * 4                      # 64 MiB

  def compiled(chunk):
    """grad(sum(log-probs)); chunk None: of the body alone."""
    graphdef, state = nnx.split(qwen3.Qwen3(
        cfg.replace(logits_chunk=chunk or 0), rngs=nnx.Rngs(0)))

    def loss(st):
      model = nnx.merge(graphdef, st)
      if chunk is None:
        return jnp.sum(model.hidden(ids))
      return jnp.sum(logprobs.model_logprobs(model, ids))
    return jax.jit(jax.grad(loss)).lower(state).compile()

  body, chunked, unchunked = compiled(None), compiled(64), compiled(0)
  # The check can fail: the unchunked head's program has a [B, T-1, V] fp32 array.
  # (Its temporaries grow by 107 MiB on jax 0.10.2 but by 43 MiB on 0.12.1, whose
  # buffer assignment lays the logits over body temporaries that are dead by then;
  # so the array's shape, not the byte count, shows that the logits are there.)
  assert _largest_f32_array(unchunked) >= logit_elems
  assert _largest_f32_array(chunked) < logit_elems / 4
  temp = lambda c: c.memory_analysis().temp_size_in_bytes
  assert temp(chunked) - temp(body) < full_logits / 4, (temp(body), temp(chunked))


@pytest.mark.parametrize("impl", ["splash", "tokamax"])
def test_pallas_paths_under_shard_map_on_8_devices_match_reference(impl):
  """The per-shard call (batch over data x fsdp, heads over tensor)."""
  mesh = shd.make_mesh(dict(data=2, fsdp=2, tensor=2))
  rules = shd.as_rules(None)
  b, t, n, k, h = 4, 256, 4, 2, 128
  # The shard_map really splits: each shard holds 1 row and 2 of 4 heads.
  assert shd.logical_to_spec(("batch", None, "act_heads", None), (b, t, n, h),
                             mesh, rules) == jax.sharding.PartitionSpec(
                                 ("data", "fsdp"), None, "tensor", None)
  q, kk, v, _ = _inputs(b, t, n, k, h, seed=2)
  seg = np.ones((b, t), np.int32)
  seg[1, 130:] = 2
  seg[2, 200:] = 0
  seg = jnp.asarray(seg)
  fn = (functools.partial(attn.splash_attention, interpret=True, block=128)
        if impl == "splash" else
        functools.partial(attn.tokamax_attention, packed=True))
  got = jax.jit(lambda q, k, v, s: attn._sharded(fn, q, k, v, s, (mesh, rules)))(
      q, kk, v, seg)
  want = attn.reference(q, kk, v, attn.dense_mask(seg))
  real = np.asarray(seg > 0)[:, :, None, None]
  np.testing.assert_allclose(np.asarray(got) * real, np.asarray(want) * real,
                             atol=1e-5)
