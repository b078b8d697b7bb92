"""The forward over a KV cache (`sampling.cached_forward`): the cache contract
and the CPU decode step's out-major weights.

The reference is the model's own cache-free forward (an independent code path:
no cache, one causal mask); parity of that forward with
`transformers.Qwen3ForCausalLM` is in tests/models/test_hf_io.py.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from paraagent_jax.models import qwen3
from paraagent_jax.sampling import cached_forward
from paraagent_jax.sampling import kv_cache
from tests.models import test_qwen3 as tq  # stacked_copy: the same weights, scanned


@pytest.fixture(scope="module")
def tiny():
  cfg = qwen3.Qwen3Config.preset("tiny")
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))


@jax.jit
def _chunk(graphdef, state, ids, cache, num_new):
  model = nnx.merge(graphdef, state)
  return cached_forward.forward_chunk(model, ids, cache, num_new)


@pytest.mark.slow
def test_forward_chunk_ragged_prefill_continue_decode_matches_full(tiny):
  rng = np.random.default_rng(0)
  seqs = [list(rng.integers(0, 512, n)) for n in (11, 7, 9)]
  # Row-wise pieces: prefill, continuation (row 1 gets nothing), two decodes.
  plan = [(5, 3, 4), (3, 0, 2), (1, 1, 1), (1, 1, 1)]
  graphdef, state = nnx.split(tiny)
  cache = kv_cache.init_cache(tiny, 3, 16)
  got = [[] for _ in seqs]
  pos = [0, 0, 0]
  for counts in plan:
    t = max(counts)
    ids = np.zeros((3, t), np.int32)
    for b, n in enumerate(counts):
      ids[b, :n] = seqs[b][pos[b]:pos[b] + n]
    # Pad a chunk to a fixed width, as the sampler's buckets do.
    ids = np.pad(ids, ((0, 0), (0, 8 - t)), constant_values=7)
    logits, cache = _chunk(graphdef, state, jnp.asarray(ids), cache,
                           jnp.asarray(counts, jnp.int32))
    for b, n in enumerate(counts):
      got[b].extend(np.asarray(logits[b, :n]))
      pos[b] += n
  np.testing.assert_array_equal(np.asarray(cache["lengths"]), pos)
  for b, seq in enumerate(seqs):
    n = pos[b]
    full = tiny(jnp.asarray([seq[:n]], jnp.int32))[0]
    np.testing.assert_allclose(np.stack(got[b]), full, atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_forward_chunk_logits_at_equals_full_chunk_and_same_cache(tiny):
  """With `logits_at` the last layer computes only those positions' outputs.

  The logits must equal the full chunk's at those positions, and the cache
  (every layer's keys and values, the last layer's too) must be the same.
  """
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(0, 512, (3, 8)), jnp.int32)
  cache = kv_cache.init_cache(tiny, 3, 16)
  # Row 2 already holds 3 tokens; row 1 gets no new ones (padding query).
  _, cache = cached_forward.forward_chunk(tiny, ids[:, :3], cache,
                                          jnp.asarray([0, 0, 3]))
  num_new = jnp.asarray([8, 0, 5], jnp.int32)
  full, cache_full = cached_forward.forward_chunk(tiny, ids, cache, num_new)
  at = num_new - 1
  got, cache_got = cached_forward.forward_chunk(tiny, ids, cache, num_new, logits_at=at)
  assert got.shape == (3, 1, tiny.config.vocab_size)
  for b in (0, 2):          # row 1's logits are garbage by contract
    np.testing.assert_allclose(np.asarray(got[b, 0]),
                               np.asarray(full[b, at[b]]), atol=2e-6, rtol=1e-6)
  for name in ("k", "v"):
    np.testing.assert_array_equal(
        np.asarray(kv_cache.cache_layers(cache_got, name)),
        np.asarray(kv_cache.cache_layers(cache_full, name)))
  np.testing.assert_array_equal(np.asarray(cache_got["lengths"]), [8, 0, 8])
  # The last layer's keys were written for every new position (row 0: 0..7).
  assert np.abs(np.asarray(
      kv_cache.cache_layers(cache_got, "k")[-1, 0, :, :8])).min() > 0


@pytest.mark.slow
def test_scanned_cache_equals_the_loop_cache(tiny):
  """A scanned model's cache (stacked [L, ...] buffers) holds the loop
  model's values (a tuple of per-layer buffers); its logits are the full
  forward's."""
  scanned = tq.stacked_copy(tiny)
  ids = jax.random.randint(jax.random.key(3), (2, 9), 0, 512)
  # Cache path through the scan.
  cache = kv_cache.init_cache(scanned, 2, 12)
  logits, cache = cached_forward.forward_chunk(scanned, ids, cache, jnp.asarray([9, 9]))
  np.testing.assert_allclose(logits, tiny(ids), atol=2e-5)
  # The loop model keeps one cache buffer per layer; the values are the scan's.
  loop_cache = kv_cache.init_cache(tiny, 2, 12)
  _, loop_cache = cached_forward.forward_chunk(tiny, ids, loop_cache,
                                               jnp.asarray([9, 9]))
  assert isinstance(loop_cache["k"], tuple) and len(loop_cache["k"]) == 2
  assert loop_cache["k"][0].shape == cache["k"].shape[1:]
  for name in ("k", "v"):
    np.testing.assert_allclose(kv_cache.cache_layers(loop_cache, name),
                               kv_cache.cache_layers(cache, name), atol=1e-5)
  assert kv_cache.cache_capacity(loop_cache) == kv_cache.cache_capacity(cache) == 12


def _untied_copy(model):
  """The same weights with an untied LM head (the embedding, transposed)."""
  untied = qwen3.Qwen3(model.config.replace(tie_embeddings=False),
                       rngs=nnx.Rngs(1))
  _, state = nnx.split(model)
  nnx.update(untied, state)
  untied.lm_head[...] = model.embed_tokens[...].T
  return untied


@pytest.mark.slow
def test_decode_weights_give_the_logits_of_forward_chunk(tiny):
  """The CPU decode step's out-major weights: the same logits and cache.

  Loop and scanned layers, tied and untied heads, a prefill chunk and a
  one-token step after it; off the CPU's unsharded model there are none.
  """
  cfg = tiny.config
  assert cfg.tie_embeddings and jax.default_backend() == "cpu"
  d, f = cfg.hidden_size, cfg.intermediate_size
  ids = jnp.asarray([[1, 2, 3], [4, 5, 0]], jnp.int32)
  num_new = jnp.asarray([3, 2], jnp.int32)
  for model in (tiny, tq.stacked_copy(tiny), _untied_copy(tiny)):
    w = cached_forward.decode_weights(model)
    lead = (cfg.num_layers,) if model.config.scan_layers else ()
    layers = w["layers"] if model.config.scan_layers else w["layers"][0]
    assert layers["gate_t"].shape == layers["up_t"].shape == lead + (f, d)
    assert layers["down_t"].shape == lead + (d, f)
    if model.config.scan_layers:
      np.testing.assert_array_equal(layers["down_t"][1], np.asarray(
          model.layers.down_proj[...])[1].T)
    else:
      assert len(w["layers"]) == cfg.num_layers
      np.testing.assert_array_equal(w["layers"][1]["gate_t"], np.asarray(
          model.layers[1].gate_proj[...]).T)
    if model.config.tie_embeddings:
      assert w["head"] is None          # the embedding, [V, D] already
    else:
      np.testing.assert_array_equal(w["head"], np.asarray(model.lm_head[...]).T)
    cache_w = cache_g = kv_cache.init_cache(model, 2, 8)
    for chunk, n in ((ids, num_new), (ids[:, :1], jnp.asarray([1, 1]))):
      want, cache_w = cached_forward.forward_chunk(model, chunk, cache_w, n)
      got, cache_g = cached_forward.forward_chunk(model, chunk, cache_g, n,
                                                  decode_weights=w)
      assert got.shape == want.shape == (2, chunk.shape[1], cfg.vocab_size)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
      for name in ("k", "v"):
        np.testing.assert_allclose(kv_cache.cache_layers(cache_g, name),
                                   kv_cache.cache_layers(cache_w, name),
                                   rtol=1e-5, atol=1e-6)
      np.testing.assert_array_equal(cache_g["lengths"], cache_w["lengths"])
  sharded = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  sharded.sharding_ctx = ("a mesh", "rules")
  assert cached_forward.decode_weights(sharded) is None
  # Over the copy budget: no copies. The tied head stays out-major (the
  # embedding needs no copy), the MLP and an untied head keep their layout.
  mlp_bytes = 4 * 3 * cfg.num_layers * d * f
  assert cached_forward.decode_weights(tiny, mlp_bytes)["layers"] is not None
  over = cached_forward.decode_weights(tiny, mlp_bytes - 1)
  assert over == {"head": None, "layers": None}
  assert cached_forward.decode_weights(_untied_copy(tiny), mlp_bytes) is None
  cache = kv_cache.init_cache(tiny, 2, 8)
  want, _ = cached_forward.forward_chunk(tiny, ids, cache, num_new)
  got, _ = cached_forward.forward_chunk(tiny, ids, cache, num_new,
                              decode_weights=over)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_decode_step_writes_its_products_out_major(tiny):
  """In the compiled one-token step, the MLP's and the LM head's products
  write [Out, rows] (the fast form on the CPU), not [rows, Out].

  XLA folds a transpose that follows a product into the product itself;
  `cached_forward._out_major`'s barrier keeps it from doing so, and this fails if the
  barrier goes.
  """
  cfg = tiny.config
  b, d, f, v = 3, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  graphdef, state = nnx.split(tiny)

  def step(state, ids, cache, w):
    return cached_forward.forward_chunk(
        nnx.merge(graphdef, state), ids, cache, jnp.ones((b,), jnp.int32),
        decode_weights=w)

  args = (state, jnp.zeros((b, 1), jnp.int32), kv_cache.init_cache(tiny, b, 8))
  dots = lambda text: set(re.findall(r"= f32\[([\d,]+)\]\{[\d,]+\} dot\(", text))
  w = cached_forward.decode_weights(tiny)
  got = dots(jax.jit(step).lower(*args, w).compile().as_text())
  assert {f"{f},{b}", f"{d},{b}", f"{v},{b}"} <= got, got
  assert not {f"{b},{f}", f"{b},{v}"} & got, got
  # Without them, the products write [rows, Out].
  plain = dots(jax.jit(step).lower(*args, None).compile().as_text())
  assert {f"{b},{f}", f"{b},{v}"} <= plain, plain
