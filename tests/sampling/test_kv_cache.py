"""The KV cache (`sampling.kv_cache`): writes, growth, attention over it in
place, and the decode program that updates it.

References: the model's own cache-free forward, the dense `attention.reference`
over the whole cache, and the cache's size (the compiled decode and append
programs must hold no copy of it).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from paraagent_jax import sampling
from paraagent_jax.models import attention as attn
from paraagent_jax.models import qwen3
from paraagent_jax.sampling import cached_forward
from paraagent_jax.sampling import kv_cache
from paraagent_jax.sampling import programs
from tests.models import test_qwen3 as tq  # stacked_copy: the same weights, scanned


@pytest.fixture(scope="module")
def tiny():
  cfg = qwen3.Qwen3Config.preset("tiny")
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_forward_chunk_zero_new_leaves_row_untouched(tiny):
  cache = kv_cache.init_cache(tiny, 2, 8)
  ids = jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.int32)
  _, cache = cached_forward.forward_chunk(tiny, ids, cache,
                                          jnp.asarray([3, 2], jnp.int32))
  before = jax.tree.map(np.asarray, cache)
  _, cache = cached_forward.forward_chunk(tiny, jnp.asarray([[9], [9]], jnp.int32),
                                          cache, jnp.asarray([0, 1], jnp.int32))
  k, k_before = kv_cache.cache_layers(cache, "k"), kv_cache.cache_layers(before, "k")
  np.testing.assert_array_equal(k[:, 0], k_before[:, 0])
  np.testing.assert_array_equal(cache["lengths"], [3, 3])
  # Row 1's padding slot (index 2 after the first chunk) now holds a real token.
  assert not np.allclose(k[:, 1, :, 2], k_before[:, 1, :, 2])


@pytest.mark.slow
def test_padding_beyond_capacity_is_dropped_not_clamped(tiny):
  # A near-full row with a wide padded chunk: the padding writes would fall
  # past the cache end; a clamped write would corrupt the real slots.
  cache = kv_cache.init_cache(tiny, 1, 6)
  ids = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
  _, cache = cached_forward.forward_chunk(tiny, ids, cache, jnp.asarray([5], jnp.int32))
  before = np.asarray(kv_cache.cache_layers(cache, "k"))
  logits, cache = cached_forward.forward_chunk(
      tiny, jnp.asarray([[6, 0, 0, 0]], jnp.int32), cache,
      jnp.asarray([1], jnp.int32))
  after = np.asarray(kv_cache.cache_layers(cache, "k"))
  np.testing.assert_array_equal(after[..., :5, :], before[..., :5, :])
  full = tiny(jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32))
  np.testing.assert_allclose(logits[0, 0], full[0, 5], atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_resized_cache_steps_equal_full_cache_steps(tiny, scan):
  """Chunks on a small cache, grown by `resize_cache`, equal the full cache's."""
  model = tq.stacked_copy(tiny) if scan else tiny
  ids = jax.random.randint(jax.random.key(5), (2, 6), 0, 512)
  tok = jnp.asarray([[3], [9]], jnp.int32)
  one = jnp.asarray([1, 1], jnp.int32)
  first = jnp.asarray([6, 4], jnp.int32)
  _, cache_want = cached_forward.forward_chunk(
      model, ids, kv_cache.init_cache(model, 2, 16), first)
  want, cache_want = cached_forward.forward_chunk(model, tok, cache_want, one)
  _, small = cached_forward.forward_chunk(
      model, ids, kv_cache.init_cache(model, 2, 8), first)
  resized = kv_cache.resize_cache(model, small, 16)
  assert kv_cache.cache_capacity(resized) == 16
  got, grown = cached_forward.forward_chunk(model, tok, resized, one)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(grown["lengths"]), [7, 5])
  for name in ("k", "v"):
    np.testing.assert_allclose(np.asarray(kv_cache.cache_layers(grown, name)),
                               np.asarray(kv_cache.cache_layers(cache_want, name)),
                               atol=1e-6)
    # The old slots are kept as they were, bit for bit; the new are zeros.
    old = np.asarray(kv_cache.cache_layers(resized, name))
    np.testing.assert_array_equal(old[..., :8, :],
                                  np.asarray(kv_cache.cache_layers(small, name)))
    np.testing.assert_array_equal(old[..., 8:, :], 0)
  with pytest.raises(ValueError, match="cannot shrink"):
    kv_cache.resize_cache(model, grown, 8)


@pytest.mark.slow
@pytest.mark.parametrize("s,block,t", [(50, 16, 4), (64, 64, 4), (40, 512, 4),
                                       (150, 256, 4), (50, 16, 1), (40, 512, 1),
                                       (150, 256, 1)])
def test_cache_attention_matches_dense_over_cache(s, block, t):
  """Blocks of the cache, a clamped last block, rows of different lengths.

  t = 1 is a decode step; keys are passed slots last, [B,K,H,S], as the
  model's cache stores them. (150, 256, 4): on the CPU a chunk reads blocks
  of `CPU_CHUNK_KEY_BLOCK` = 64 slots, the last one clamped; a decode step
  reads the 150 slots as one block.
  """
  b, n, k, h = 3, 4, 2, 8
  ks = jax.random.split(jax.random.key(7), 3)
  q = jax.random.normal(ks[0], (b, t, n, h))
  kc = jax.random.normal(ks[1], (b, k, s, h))
  vc = jax.random.normal(ks[2], (b, k, s, h))
  lengths = np.array([3, s - t, 20])               # slots before the chunk
  positions = jnp.asarray(lengths[:, None] + np.arange(t)[None], jnp.int32)
  vis = jnp.arange(s)[None, None, :] <= positions[:, :, None]
  want = attn.reference(q, kc, vc, vis, "BKSH")
  kc_t = jnp.swapaxes(kc, -1, -2)
  got = kv_cache.cache_attention(q, kc_t, vc, positions,
                                 int(positions.max()) + 1, block)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # The stacked form [L,B,K,H,S] / [L,B,K,S,H] reads the same layer.
  stack = lambda x: jnp.stack([x * 0 + 5.0, x])
  got1 = kv_cache.cache_attention(q, stack(kc_t), stack(vc), positions,
                                  int(positions.max()) + 1, block, layer=1)
  np.testing.assert_allclose(got1, want, atol=1e-5)


@pytest.mark.slow
def test_decode_program_holds_no_copy_of_the_cache():
  """The compiled decode loop's temporaries are far below one cache."""
  cfg = qwen3.Qwen3Config.preset("tiny", attention_chunk=128)
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  rows, max_len = 8, 4096
  cache = kv_cache.init_cache(model, rows, max_len)
  cache_bytes = sum(x.nbytes for x in jax.tree.leaves(cache))   # 16 MiB
  budget = np.full((rows,), 16, np.int32)
  args = (graphdef, params, cache, jnp.zeros((rows, cfg.vocab_size)),
          jax.random.key(0), programs.decode_loop_init(budget, 16, 1, 0),
          budget, jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool),
          jnp.float32(1.0), jnp.float32(1.0), cached_forward.decode_weights(model))
  for greedy in (False, True):
    compiled = programs.DECODE_JIT.lower(
        *args, greedy=greedy, top_k=0, use_top_p=False, pad_id=0).compile()
    mem = compiled.memory_analysis()
    assert mem.temp_size_in_bytes < cache_bytes / 8, (
        greedy, mem.temp_size_in_bytes, cache_bytes)
  # On the CPU the sampler's cache grows in steps; each size's decode
  # program is this one at a smaller capacity, and the copy into the next
  # size is a program of its own (`RESIZE_JIT`).
  assert sampling.Sampler(model, rows, max_len).cache_capacities == (
      1024, 2048, 3072, 4096)
  # The append (prefill) program too: its temporaries are [B,K,G,T,block]
  # scores (1 MiB each at T = 64; 256 KiB at 16), far below one layer's
  # keys (2 MiB).
  ids = jnp.zeros((rows, 16), jnp.int32)
  compiled = programs.APPEND_JIT.lower(
      graphdef, params, cache, args[3], ids, jnp.full((rows,), 16, jnp.int32)
  ).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < cache_bytes / 8
