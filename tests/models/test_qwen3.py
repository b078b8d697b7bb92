"""Tests of the Qwen3 model: RoPE, scan/remat, attention blocks, presets, log-probs.

Parity with `transformers.Qwen3ForCausalLM` is in tests/models/test_hf_io.py (it needs
the importer); here the references are the model's own loop forward for scan and
remat, the dense path for attention blocks, and numpy for log-probs. The forward
over a KV cache is tested in tests/sampling/test_cached_forward.py.
"""

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


def stacked_copy(model):
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
  scanned = stacked_copy(tiny)
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
