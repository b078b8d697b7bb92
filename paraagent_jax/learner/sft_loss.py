"""Supervised fine-tuning: masked next-token cross-entropy and its train step.

The SFT stage and the RL stage share `paraagent_jax.learner.step` (the
optimizer, shardings, donation and micro-batching); only the loss differs.
Same log-prob convention as the RL batch: the logit at t - 1 predicts token
t, so ``loss_mask[:, 0]`` is ignored.

An SFT batch is a mapping (or any object with these attributes) with
``tokens`` [B,T] int32, ``loss_mask`` [B,T] f32 (1 on assistant tokens) and
``attention_mask`` [B,T] int32; packed rows (several demonstrations per row)
add ``segment_ids`` [B,T] int32 (no attention across segments) and
``positions`` [B,T] int32 (restarting at 0 in each segment).

Log-probs come from `paraagent_jax.learner.logprobs.model_logprobs`, which runs
the LM head and log-softmax in sequence chunks (`model.logits_chunk`): no
[B,T,V] fp32 logits.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from paraagent_jax.learner import logprobs as lp_lib
from paraagent_jax.learner import step as ts

SFT_FIELDS = ("tokens", "loss_mask", "attention_mask")
# Present in packed batches only.
PACKED_FIELDS = ("segment_ids", "positions")


def _fields(batch) -> dict:
  get = (lambda k: batch.get(k)) if isinstance(batch, Mapping) else (
      lambda k: getattr(batch, k, None))
  out = {k: get(k) for k in SFT_FIELDS}
  out.update({k: get(k) for k in PACKED_FIELDS if get(k) is not None})
  return out


def _logprobs(model, inputs):
  # Only the loss positions' log-probs are used (`model.logits_capacity`).
  return lp_lib.model_logprobs(model, inputs["tokens"], inputs["attention_mask"],
                             inputs.get("positions"), inputs.get("segment_ids"),
                             at=inputs["weights"])


def _shifted_mask(loss_mask):
  # Position 0 has no prediction; never let it into the denominator.
  return loss_mask.astype(jnp.float32).at[:, 0].set(0.0)


def sft_loss(model, tokens, loss_mask, attention_mask, positions=None,
             segment_ids=None):
  """Token-mean cross-entropy over ``loss_mask`` (scalar, float32).

  Args:
    model: a `paraagent_jax.models.qwen3.Qwen3`, or any module returning
      [B,T,V] logits (`logprobs.model_logprobs`).
    tokens: [B,T] int token ids.
    loss_mask: [B,T] 1 on tokens to learn (assistant turns).
    attention_mask: [B,T] 1 on real tokens.
    positions, segment_ids: [B,T] int of packed rows (None = one sequence).

  Returns:
    The mean negative log-likelihood over masked tokens.
  """
  mask = _shifted_mask(loss_mask)
  logp = lp_lib.model_logprobs(model, tokens, attention_mask, positions,
                             segment_ids, at=mask)
  return -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _prepare(batch):
  inputs = _fields(batch)
  mask = _shifted_mask(inputs["loss_mask"])
  count = jnp.sum(mask)
  # Normalise by the whole batch's token count, so micro-batch gradient
  # accumulation equals the full-batch step exactly.
  inputs["weights"] = mask / jnp.maximum(count, 1.0)
  return inputs, {"num_tokens": count}


def _micro_loss(model, inputs, ref_model):
  del ref_model  # SFT has no reference policy.
  logp = _logprobs(model, inputs)
  # No extra metrics (e.g. argmax accuracy): they cost a pass over the
  # vocabulary, and this step is the benchmark's plain baseline.
  return -jnp.sum(logp * inputs["weights"]), {}


def _finalize(sums, metrics):
  del sums
  return dict(metrics)


SFT_LOSS_FNS = ts.LossFns(prepare=_prepare, micro_loss=_micro_loss,
                          finalize=_finalize)


def make_sft_train_step(model_graphdef,
                        optimizer: optax.GradientTransformation,
                        mesh: jax.sharding.Mesh, *,
                        num_micro_batches: int = 1,
                        batch_axes: Sequence[str] = ts.DEFAULT_BATCH_AXES):
  """Jitted, sharded SFT step ``(state, opt_state, batch, rng)``.

  Same machinery as `paraagent_jax.learner.grpo.make_train_step`: metrics are
  ``loss`` (token-mean NLL), ``num_tokens``, ``grad_norm``.
  """
  step = ts.build_train_step(model_graphdef, optimizer, SFT_LOSS_FNS, mesh,
                             num_micro_batches=num_micro_batches,
                             batch_axes=batch_axes)

  def step_fn(state, opt_state, batch, rng) -> tuple[Any, Any, dict]:
    return step(state, opt_state, _fields(batch), rng)

  return step_fn


def make_sft_eval_step(model_graphdef, mesh: jax.sharding.Mesh, *,
                       batch_axes: Sequence[str] = ts.DEFAULT_BATCH_AXES):
  """Jitted validation loss ``eval_fn(state, batch) -> {"loss", ...}``.

  The same token-mean NLL as the train step, without an update; the state is
  not donated.
  """
  evaluate = ts.build_eval_step(model_graphdef, SFT_LOSS_FNS, mesh,
                                batch_axes=batch_axes)
  return lambda state, batch: evaluate(state, _fields(batch))
