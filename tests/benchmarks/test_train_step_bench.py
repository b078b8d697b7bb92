"""benchmarks/train_step_bench.py: its "before issue 18" model path is the same math."""

import os
import sys

from flax import nnx
import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import train_step_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

from paraagent_jax.models import qwen3  # pylint: disable=g-import-not-at-top


@pytest.mark.slow
def test_einsum_projections_equal_the_2d_dots_and_are_restored():
  """The bench's old projections (batched einsums) give the model's values.

  The "before" row times them; they must compute the same function, and the
  model's own `_dense` must be back after the context (also on errors).
  """
  for tied in (True, False):
    cfg = qwen3.Qwen3Config.preset("tiny", tie_embeddings=tied)
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
    graphdef, state = nnx.split(model)
    logits = lambda st: nnx.merge(graphdef, st)(ids)
    now = np.asarray(jax.jit(logits)(state))
    with train_step_bench._projections(True):   # pylint: disable=protected-access
      assert qwen3._dense is train_step_bench._einsum_dense  # pylint: disable=protected-access
      before = np.asarray(jax.jit(lambda st: logits(st) + 0)(state))
    np.testing.assert_allclose(before, now, atol=1e-5, rtol=0)
  saved = qwen3._dense  # pylint: disable=protected-access
  with pytest.raises(KeyError):
    with train_step_bench._projections(True):  # pylint: disable=protected-access
      raise KeyError("x")
  assert qwen3._dense is saved  # pylint: disable=protected-access
  assert saved is not train_step_bench._einsum_dense  # pylint: disable=protected-access


def test_model_set_overrides_parse_and_reject_malformed_items():
  parse = train_step_bench._overrides  # pylint: disable=protected-access
  assert parse("") == {}
  assert parse("attention=chunked,attention_chunk=128,logits_capacity=0.25") == {
      "attention": "chunked", "attention_chunk": 128, "logits_capacity": 0.25}
  with pytest.raises(SystemExit, match="not key=value"):
    parse("attention")

