"""Tests of the Qwen3 model: the cache contract, scan/remat, presets, log-probs.

Parity with `transformers.Qwen3ForCausalLM` is in tests/models/test_hf_io.py (it needs
the importer); here the references are the model's own full forward for the cache
(an independent code path: no cache, one causal mask) and numpy for log-probs.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from paraagent_jax.learner import logprobs
from paraagent_jax.models import qwen3


@pytest.fixture(scope="module")
def tiny():
  cfg = qwen3.Qwen3Config.preset("tiny")
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))


@jax.jit
def _chunk(graphdef, state, ids, cache, num_new):
  model = nnx.merge(graphdef, state)
  return model.forward_chunk(ids, cache, num_new)


@pytest.mark.slow
def test_forward_chunk_ragged_prefill_continue_decode_matches_full(tiny):
  rng = np.random.default_rng(0)
  seqs = [list(rng.integers(0, 512, n)) for n in (11, 7, 9)]
  # Row-wise pieces: prefill, continuation (row 1 gets nothing), two decodes.
  plan = [(5, 3, 4), (3, 0, 2), (1, 1, 1), (1, 1, 1)]
  graphdef, state = nnx.split(tiny)
  cache = tiny.init_cache(3, 16)
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
  cache = tiny.init_cache(3, 16)
  # Row 2 already holds 3 tokens; row 1 gets no new ones (padding query).
  _, cache = tiny.forward_chunk(ids[:, :3], cache, jnp.asarray([0, 0, 3]))
  num_new = jnp.asarray([8, 0, 5], jnp.int32)
  full, cache_full = tiny.forward_chunk(ids, cache, num_new)
  at = num_new - 1
  got, cache_got = tiny.forward_chunk(ids, cache, num_new, logits_at=at)
  assert got.shape == (3, 1, tiny.config.vocab_size)
  for b in (0, 2):          # row 1's logits are garbage by contract
    np.testing.assert_allclose(np.asarray(got[b, 0]),
                               np.asarray(full[b, at[b]]), atol=2e-6, rtol=1e-6)
  for name in ("k", "v"):
    np.testing.assert_array_equal(
        np.asarray(qwen3.cache_layers(cache_got, name)),
        np.asarray(qwen3.cache_layers(cache_full, name)))
  np.testing.assert_array_equal(np.asarray(cache_got["lengths"]), [8, 0, 8])
  # The last layer's keys were written for every new position (row 0: 0..7).
  assert np.abs(np.asarray(
      qwen3.cache_layers(cache_got, "k")[-1, 0, :, :8])).min() > 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rope_by_matmul_equals_split_and_concatenate(dtype):
  """The cache path's RoPE (a signed permutation product) gives the same bits."""
  x = (jax.random.normal(jax.random.key(0), (3, 5, 4, 64)) * 30).astype(dtype)
  positions = jnp.asarray([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11],
                           [40_000, 40_001, 40_002, 40_003, 40_004]])
  tables = qwen3.rope_tables(positions, 64, 1e6)
  want = qwen3.apply_rope(x, tables)
  got = qwen3.apply_rope(x, tables, by_matmul=True)
  assert got.dtype == want.dtype == dtype
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(want, np.float32))
  # Not the identity: the rotation moved the values.
  assert not np.allclose(np.asarray(got, np.float32), np.asarray(x, np.float32))


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
  for model in (tiny, _stacked_copy(tiny), _untied_copy(tiny)):
    w = model.decode_weights()
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
    cache_w, cache_g = model.init_cache(2, 8), model.init_cache(2, 8)
    for chunk, n in ((ids, num_new), (ids[:, :1], jnp.asarray([1, 1]))):
      want, cache_w = model.forward_chunk(chunk, cache_w, n)
      got, cache_g = model.forward_chunk(chunk, cache_g, n, decode_weights=w)
      assert got.shape == want.shape == (2, chunk.shape[1], cfg.vocab_size)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
      for name in ("k", "v"):
        np.testing.assert_allclose(qwen3.cache_layers(cache_g, name),
                                   qwen3.cache_layers(cache_w, name),
                                   rtol=1e-5, atol=1e-6)
      np.testing.assert_array_equal(cache_g["lengths"], cache_w["lengths"])
  sharded = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  sharded.sharding_ctx = ("a mesh", "rules")
  assert sharded.decode_weights() is None
  # Over the copy budget: no copies. The tied head stays out-major (the
  # embedding needs no copy), the MLP and an untied head keep their layout.
  mlp_bytes = 4 * 3 * cfg.num_layers * d * f
  assert tiny.decode_weights(mlp_bytes)["layers"] is not None
  over = tiny.decode_weights(mlp_bytes - 1)
  assert over == {"head": None, "layers": None}
  assert _untied_copy(tiny).decode_weights(mlp_bytes) is None
  want, _ = tiny.forward_chunk(ids, tiny.init_cache(2, 8), num_new)
  got, _ = tiny.forward_chunk(ids, tiny.init_cache(2, 8), num_new,
                              decode_weights=over)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_decode_step_writes_its_products_out_major(tiny):
  """In the compiled one-token step, the MLP's and the LM head's products
  write [Out, rows] (the fast form on the CPU), not [rows, Out].

  XLA folds a transpose that follows a product into the product itself;
  `qwen3._out_major`'s barrier keeps it from doing so, and this fails if the
  barrier goes.
  """
  cfg = tiny.config
  b, d, f, v = 3, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  graphdef, state = nnx.split(tiny)

  def step(state, ids, cache, w):
    return nnx.merge(graphdef, state).forward_chunk(
        ids, cache, jnp.ones((b,), jnp.int32), decode_weights=w)

  args = (state, jnp.zeros((b, 1), jnp.int32), tiny.init_cache(b, 8))
  dots = lambda text: set(re.findall(r"= f32\[([\d,]+)\]\{[\d,]+\} dot\(", text))
  got = dots(jax.jit(step).lower(*args, tiny.decode_weights()).compile().as_text())
  assert {f"{f},{b}", f"{d},{b}", f"{v},{b}"} <= got, got
  assert not {f"{b},{f}", f"{b},{v}"} & got, got
  # Without them, the products write [rows, Out].
  plain = dots(jax.jit(step).lower(*args, None).compile().as_text())
  assert {f"{b},{f}", f"{b},{v}"} <= plain, plain


@pytest.mark.slow
def test_forward_chunk_zero_new_leaves_row_untouched(tiny):
  cache = tiny.init_cache(2, 8)
  ids = jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.int32)
  _, cache = tiny.forward_chunk(ids, cache, jnp.asarray([3, 2], jnp.int32))
  before = jax.tree.map(np.asarray, cache)
  _, cache = tiny.forward_chunk(jnp.asarray([[9], [9]], jnp.int32), cache,
                                jnp.asarray([0, 1], jnp.int32))
  k, k_before = qwen3.cache_layers(cache, "k"), qwen3.cache_layers(before, "k")
  np.testing.assert_array_equal(k[:, 0], k_before[:, 0])
  np.testing.assert_array_equal(cache["lengths"], [3, 3])
  # Row 1's padding slot (index 2 after the first chunk) now holds a real token.
  assert not np.allclose(k[:, 1, :, 2], k_before[:, 1, :, 2])


@pytest.mark.slow
def test_padding_beyond_capacity_is_dropped_not_clamped(tiny):
  # A near-full row with a wide padded chunk: the padding writes would fall
  # past the cache end; a clamped write would corrupt the real slots.
  cache = tiny.init_cache(1, 6)
  ids = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
  _, cache = tiny.forward_chunk(ids, cache, jnp.asarray([5], jnp.int32))
  before = np.asarray(qwen3.cache_layers(cache, "k"))
  logits, cache = tiny.forward_chunk(jnp.asarray([[6, 0, 0, 0]], jnp.int32),
                                     cache, jnp.asarray([1], jnp.int32))
  np.testing.assert_array_equal(np.asarray(qwen3.cache_layers(cache, "k"))[..., :5, :],
                                before[..., :5, :])
  full = tiny(jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32))
  np.testing.assert_allclose(logits[0, 0], full[0, 5], atol=2e-5)


def _stacked_copy(model):
  """The same weights in a scan_layers model (stacked along a leading axis)."""
  cfg = model.config.replace(scan_layers=True, remat="full")
  scanned = qwen3.Qwen3(cfg, rngs=nnx.Rngs(1))
  for name in qwen3._LAYER_AXES:
    stacked = jnp.stack([getattr(l, name)[...] for l in model.layers])
    getattr(scanned.layers, name)[...] = stacked
  scanned.embed_tokens[...] = model.embed_tokens[...]
  scanned.norm[...] = model.norm[...]
  return scanned


@pytest.mark.slow
def test_scan_layers_and_remat_match_loop(tiny):
  scanned = _stacked_copy(tiny)
  ids = jax.random.randint(jax.random.key(3), (2, 9), 0, 512)
  mask = jnp.asarray([[1] * 9, [0, 0] + [1] * 7])
  np.testing.assert_allclose(scanned(ids, attention_mask=mask),
                             tiny(ids, attention_mask=mask), atol=1e-5)

  def loss(model):
    return jnp.mean(logprobs.model_logprobs(model, ids, mask))

  g_loop = nnx.grad(loss)(tiny)
  g_scan = nnx.grad(loss)(scanned)
  for name in ("q_proj", "down_proj"):
    loop = jnp.stack([g_loop.layers[i][name][...] for i in range(2)])
    np.testing.assert_allclose(g_scan.layers[name][...], loop,
                               atol=1e-6, rtol=1e-4)
  # Cache path through the scan.
  cache = scanned.init_cache(2, 12)
  logits, cache = scanned.forward_chunk(ids, cache, jnp.asarray([9, 9]))
  np.testing.assert_allclose(logits, tiny(ids), atol=2e-5)
  # The loop model keeps one cache buffer per layer; the values are the scan's.
  loop_cache = tiny.init_cache(2, 12)
  _, loop_cache = tiny.forward_chunk(ids, loop_cache, jnp.asarray([9, 9]))
  assert isinstance(loop_cache["k"], tuple) and len(loop_cache["k"]) == 2
  assert loop_cache["k"][0].shape == cache["k"].shape[1:]
  for name in ("k", "v"):
    np.testing.assert_allclose(qwen3.cache_layers(loop_cache, name),
                               qwen3.cache_layers(cache, name), atol=1e-5)
  assert qwen3.cache_capacity(loop_cache) == qwen3.cache_capacity(cache) == 12


def _assert_same_model(model, want, ids, mask):
  """`model`'s logits at real positions and log-prob gradients equal `want`'s."""
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(model(ids, attention_mask=mask))[real],
                             np.asarray(want(ids, attention_mask=mask))[real],
                             atol=2e-5, rtol=1e-5)
  # Targets predicted from a real position (a padding query's output differs).
  w = mask * jnp.pad(mask[:, :-1], ((0, 0), (1, 0)))

  def loss(m):
    return jnp.sum(logprobs.model_logprobs(m, ids, mask) * w)

  for a, b in zip(jax.tree.leaves(nnx.grad(loss)(model)),
                  jax.tree.leaves(nnx.grad(loss)(want))):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("block", [8, 5])
def test_attention_blocks_match_dense(tiny, block):
  """Causal query blocks (`attention_block`) of the reference path = the
  default (chunked) forward and its grads."""
  cfg = qwen3.Qwen3Config.preset("tiny", attention="reference",
                                 attention_block=block)
  blocked = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))   # the same init as `tiny`
  for a, b in zip(jax.tree.leaves(nnx.state(blocked)), jax.tree.leaves(nnx.state(tiny))):
    np.testing.assert_array_equal(a, b)
  t = 37
  ids = jax.random.randint(jax.random.key(5), (3, t), 0, 512)
  mask = np.ones((3, t), np.int32)
  mask[1, :4] = 0          # left padding: those queries see no key at all
  mask[2, 20:] = 0         # right padding
  _assert_same_model(blocked, tiny, ids, jnp.asarray(mask))
  with pytest.raises(ValueError, match="attention_block"):
    qwen3.Qwen3Config.preset("tiny", attention_block=-1)


@pytest.mark.slow
def test_tokamax_attention_model_matches_default(tiny):
  """The whole model with `attention="tokamax"` (opt-in package): forward and
  log-prob gradients equal the default path's, with right padding (the
  per-row-lengths call) and then with a left-padded row (the dense mask)."""
  cfg = qwen3.Qwen3Config.preset("tiny", attention="tokamax")
  tk = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))   # the same init as `tiny`
  t = 29
  ids = jax.random.randint(jax.random.key(6), (3, t), 0, 512)
  for left in (False, True):
    mask = np.ones((3, t), np.int32)
    mask[2, 17:] = 0
    if left:
      mask[1, :4] = 0
    _assert_same_model(tk, tiny, ids, jnp.asarray(mask))


@pytest.mark.slow
def test_token_logprobs_match_numpy_log_softmax(tiny):
  ids = jax.random.randint(jax.random.key(4), (2, 6), 0, 512)
  logits = np.asarray(tiny(ids), np.float64)
  m = logits.max(-1, keepdims=True)
  logsm = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  ref = np.zeros((2, 6))
  ids_np = np.asarray(ids)
  for b in range(2):
    for t in range(1, 6):
      ref[b, t] = logsm[b, t - 1, ids_np[b, t]]
  np.testing.assert_allclose(logprobs.model_logprobs(tiny, ids), ref, atol=1e-5)


@pytest.mark.slow
def test_presets_parameter_counts_and_hf_dict_round_trip():
  # Published sizes: Qwen3-0.6B 0.6B (0.44B non-embedding), 4B 4.0B, 8B 8.2B.
  counts = {}
  for name in ("qwen3-0.6b", "qwen3-4b", "qwen3-8b"):
    cfg = qwen3.Qwen3Config.preset(name)
    abstract = nnx.eval_shape(lambda c=cfg: qwen3.Qwen3(c, rngs=nnx.Rngs(0)))
    counts[name] = sum(x.size for x in jax.tree.leaves(nnx.state(abstract)))
    assert qwen3.Qwen3Config.from_hf_dict(cfg.to_hf_dict()) == cfg
  assert 0.59e9 < counts["qwen3-0.6b"] < 0.61e9
  assert 4.0e9 < counts["qwen3-4b"] < 4.05e9
  assert 8.1e9 < counts["qwen3-8b"] < 8.3e9
  with pytest.raises(ValueError, match="unknown preset"):
    qwen3.Qwen3Config.preset("qwen3-13b")
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    qwen3.Qwen3Config.preset("tiny", num_kv_heads=3)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_resized_cache_steps_equal_full_cache_steps(tiny, scan):
  """Chunks on a small cache, grown by `resize_cache`, equal the full cache's."""
  model = _stacked_copy(tiny) if scan else tiny
  ids = jax.random.randint(jax.random.key(5), (2, 6), 0, 512)
  tok = jnp.asarray([[3], [9]], jnp.int32)
  one = jnp.asarray([1, 1], jnp.int32)
  first = jnp.asarray([6, 4], jnp.int32)
  _, cache_want = model.forward_chunk(ids, model.init_cache(2, 16), first)
  want, cache_want = model.forward_chunk(tok, cache_want, one)
  _, small = model.forward_chunk(ids, model.init_cache(2, 8), first)
  resized = model.resize_cache(small, 16)
  assert qwen3.cache_capacity(resized) == 16
  got, grown = model.forward_chunk(tok, resized, one)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(grown["lengths"]), [7, 5])
  for name in ("k", "v"):
    np.testing.assert_allclose(np.asarray(qwen3.cache_layers(grown, name)),
                               np.asarray(qwen3.cache_layers(cache_want, name)),
                               atol=1e-6)
    # The old slots are kept as they were, bit for bit; the new are zeros.
    old = np.asarray(qwen3.cache_layers(resized, name))
    np.testing.assert_array_equal(old[..., :8, :],
                                  np.asarray(qwen3.cache_layers(small, name)))
    np.testing.assert_array_equal(old[..., 8:, :], 0)
  with pytest.raises(ValueError, match="cannot shrink"):
    model.resize_cache(grown, 8)
