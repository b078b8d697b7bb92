"""GRPO loss with multi-level advantages, and its jitted, sharded train step.

Per policy token (``valid = loss_mask > 0`` and position < ``seq_len``):

* ``ratio = exp(logp - old_logp)`` against the rollout (sampler) log-probs;
* policy term ``max(-A ratio, -A clip(ratio, 1 - eps_low, 1 + eps_high))``
  with separate lower / upper clip ranges (DAPO's "clip-higher" when
  ``eps_high > eps_low``);
* optional KL to a frozen reference, k3 estimator
  ``exp(ref - logp) - (ref - logp) - 1``, times ``beta``; with ``beta == 0``
  the reference is never looked at (no reference forward pass at all);
* optional entropy bonus ``- entropy_coef * H(p(. | tokens[<t]))``;
* optional truncated importance sampling (``tis_cap > 0``, one pass per
  batch): the sampler's log-probs ``old_logp`` may differ from the trainer's
  for the same parameters (bf16 sampling, other kernels); then the ratio is
  taken against the trainer's own log-probs ``sg(logp)`` and each token's
  term is weighted by ``min(exp(sg(logp) - old_logp), tis_cap)``.

Metrics also report the sampler/trainer gap ``|logp - old_logp|`` on the
policy tokens (``logp_gap_mean``, ``logp_gap_max``): at the first pass over
a batch the parameters are the sampler's, so it measures only the numerical
mismatch (~0 on the CPU in fp32; tests/learner/test_grpo.py).

Aggregation (weights are computed on the whole batch before micro-batching,
so accumulation is exact):

* ``token_mean``: mean over all valid tokens of the batch;
* ``seq_mean_token_mean``: mean over each episode's valid tokens, then over
  the episodes that have any;
* ``seq_mean_token_sum_norm``: each episode's token sum divided by T, then
  the mean over episodes (Dr. GRPO).

``A`` comes from `paraagent_jax.learner.advantages.compute_advantages`; with
``levels=("traj",)`` this is plain GRPO. Log-probs follow the convention of
`paraagent_jax.learner.batch`: the logit at t - 1 predicts token t.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from paraagent_jax.learner import advantages as adv_lib
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import logprobs as lp_lib
from paraagent_jax.learner import optimizer as optim
from paraagent_jax import config_utils
from paraagent_jax.learner import step as ts

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """Everything the GRPO loss and step need besides the optimizer.

  Attributes:
    clip_eps_low: ratio lower clip is 1 - clip_eps_low.
    clip_eps_high: ratio upper clip is 1 + clip_eps_high.
    beta: k3-KL coefficient; 0 skips the reference policy entirely.
    entropy_coef: entropy bonus coefficient (0: no bonus).
    compute_entropy: report the policy entropy as a metric even without a
      bonus (forward-only cost).
    aggregation: one of AGGREGATIONS.
    levels: enabled advantage levels (ablation switch).
    level_weights: 3x3 (plan/action/answer x traj/phase/step).
    adv_eps: eps added to each group's std.
    normalize: "mean_std" or "mean" (Dr. GRPO, no std division).
    drop_no_spread_groups: mask groups with no spread at any enabled level.
    mask_truncated: train on no token of truncated episodes (their rewards
      still count in the group statistics); DAPO's overlong filtering.
    num_micro_batches: gradient accumulation steps within one update.
    temperature: logits are divided by this before the log-softmax. Keep 1
      when ``old_logprobs`` are the sampler's plain ``logprobs``
      (`paraagent_jax.sampling` reports those at temperature 1); set it to
      the sampling temperature only if the batch carries tempered log-probs.
    tis_cap: truncated importance sampling on the sampler/trainer ratio (0 =
      off). Valid for one optimisation pass per batch only (the trainer's
      log-probs at the sampler's parameters are those of the first pass).
  """

  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  beta: float = 0.0
  entropy_coef: float = 0.0
  compute_entropy: bool = True
  aggregation: str = "token_mean"
  levels: tuple[str, ...] = adv_lib.ALL_LEVELS
  level_weights: tuple[tuple[float, ...], ...] = adv_lib.DEFAULT_LEVEL_WEIGHTS
  adv_eps: float = 1e-6
  normalize: str = "mean_std"
  drop_no_spread_groups: bool = False
  mask_truncated: bool = False
  num_micro_batches: int = 1
  temperature: float = 1.0
  tis_cap: float = 0.0

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"aggregation={self.aggregation!r}; "
                       f"choose from {AGGREGATIONS}")
    if self.clip_eps_low < 0 or self.clip_eps_high < 0:
      raise ValueError("clip ranges must be >= 0")
    if self.temperature <= 0:
      raise ValueError("temperature must be > 0")
    if self.tis_cap < 0 or (0 < self.tis_cap < 1):
      raise ValueError(f"tis_cap={self.tis_cap}: 0 (off) or a cap >= 1")
    object.__setattr__(self, "levels", tuple(self.levels))
    object.__setattr__(self, "level_weights",
                       tuple(tuple(float(w) for w in r)
                             for r in self.level_weights))
    adv_lib.check_options(self.levels, self.normalize)


def aggregation_weights(valid, aggregation: str):
  """[B,T] weights w with loss = sum(w * per_token_loss) over the batch."""
  valid = valid.astype(jnp.float32)
  if aggregation == "token_mean":
    return valid / jnp.maximum(jnp.sum(valid), 1.0)
  n_tok = jnp.sum(valid, axis=1, keepdims=True)
  n_seq = jnp.maximum(jnp.sum(n_tok > 0), 1).astype(jnp.float32)
  if aggregation == "seq_mean_token_mean":
    return valid / jnp.maximum(n_tok, 1.0) / n_seq
  return valid / valid.shape[1] / n_seq


def valid_tokens(batch: batch_lib.TrajectoryBatch):
  """Policy tokens inside the episode: loss_mask AND position < seq_len."""
  pos = jnp.arange(batch.tokens.shape[1])[None, :]
  return (batch.loss_mask > 0) & (pos < batch.seq_len[:, None])


def prepare(batch: batch_lib.TrajectoryBatch, config: GRPOConfig):
  """Whole-batch part of the loss: advantages, weights, advantage metrics."""
  metrics = {}
  if config.drop_no_spread_groups:
    batch, keep = batch_lib.drop_no_spread_groups(batch, config.levels)
    metrics["dropped_episode_frac"] = 1.0 - jnp.mean(keep.astype(jnp.float32))
  valid = valid_tokens(batch)
  if config.mask_truncated:
    valid &= ~batch.truncated[:, None]
  adv = adv_lib.compute_advantages(
      traj_reward=batch.traj_reward, group_id=batch.group_id,
      step_reward=batch.step_reward, step_mask=batch.step_mask,
      step_phase_type=batch.step_phase_type, phase_reward=batch.phase_reward,
      phase_mask=batch.phase_mask, phase_type=batch.phase_type,
      step_id=batch.step_id, phase_id=batch.phase_id,
      token_kind=batch.token_kind, loss_mask=valid.astype(jnp.float32),
      level_weights=config.level_weights, eps=config.adv_eps,
      normalize=config.normalize, levels=config.levels)
  metrics.update(adv_lib.advantage_metrics(
      adv, loss_mask=valid, step_mask=batch.step_mask,
      phase_mask=batch.phase_mask))
  metrics["num_tokens"] = jnp.sum(valid.astype(jnp.float32))
  inputs = {
      "tokens": batch.tokens,
      "attention_mask": batch.attention_mask,
      "old_logprobs": batch.old_logprobs,
      "ref_logprobs": batch.ref_logprobs if config.beta > 0 else None,
      "advantages": jax.lax.stop_gradient(adv.token),
      "valid": valid.astype(jnp.float32),
      "weights": aggregation_weights(valid, config.aggregation),
  }
  return inputs, metrics


def token_loss_terms(logp, inputs, config: GRPOConfig, ref_logp=None,
                     entropy=None):
  """Per-token loss [B,T] and additive metric sums, from policy log-probs."""
  valid, adv = inputs["valid"], inputs["advantages"]
  # Off-mask log-probs can be anything (e.g. -inf for padding); zero them
  # before exp so neither the value nor the gradient picks up NaN/Inf.
  log_ratio = jnp.where(valid > 0, logp - inputs["old_logprobs"], 0.0)
  gap = jax.lax.stop_gradient(jnp.abs(log_ratio))
  if config.tis_cap > 0:
    # The trainer's log-probs at the sampler's parameters (this pass's own,
    # without gradient): the ratio's denominator; the sampler's enter only
    # through the capped importance weight.
    is_weight = jnp.minimum(jnp.exp(jax.lax.stop_gradient(log_ratio)), config.tis_cap)
    ratio_log = jnp.where(valid > 0, logp - jax.lax.stop_gradient(logp), 0.0)
  else:
    is_weight, ratio_log = None, log_ratio
  ratio = jnp.exp(ratio_log)
  clipped = jnp.clip(ratio, 1.0 - config.clip_eps_low,
                     1.0 + config.clip_eps_high)
  pg1, pg2 = -adv * ratio, -adv * clipped
  loss = jnp.maximum(pg1, pg2)
  if is_weight is not None:
    loss = loss * is_weight
  sums = {
      "clip_count": jnp.sum((pg2 > pg1) * valid),
      "valid_count": jnp.sum(valid),
      "pg_loss": jnp.sum(loss * inputs["weights"]),
      # k3 estimate of KL(old || new): how far the update moved.
      # expm1(x) - x, not exp(x) - 1 - x: no cancellation for small x.
      "kl_old_sum": jnp.sum((jnp.expm1(-log_ratio) + log_ratio) * valid),
      # |log p_trainer - log p_sampler| on policy tokens (at the first pass:
      # the numerical mismatch only).
      "logp_gap_sum": jnp.sum(gap * valid),
      "max_logp_gap": jnp.max(gap * valid),
  }
  if is_weight is not None:
    sums["tis_weight_sum"] = jnp.sum(is_weight * valid)
    sums["tis_capped_count"] = jnp.sum((jnp.exp(jax.lax.stop_gradient(log_ratio))
                                        > config.tis_cap) * valid)
  if config.beta > 0:
    d = jnp.where(valid > 0, ref_logp - logp, 0.0)
    kl = jnp.expm1(d) - d
    loss = loss + config.beta * kl
    sums["kl_sum"] = jnp.sum(kl * valid)
  if entropy is not None:
    if config.entropy_coef:
      loss = loss - config.entropy_coef * entropy
    sums["entropy_sum"] = jnp.sum(jax.lax.stop_gradient(entropy) * valid)
  return loss, sums


def micro_loss(model, inputs, ref_model, config: GRPOConfig):
  """Weighted GRPO loss of one micro-batch (sums to the batch loss)."""
  want_entropy = config.compute_entropy or config.entropy_coef != 0
  # The LM head and log-softmax run in sequence chunks (model.logits_chunk):
  # no [B,T,V] fp32 logits.
  # Only the policy tokens' values are used (every term is masked by valid).
  out = lp_lib.model_logprobs(model, inputs["tokens"], inputs["attention_mask"],
                       temperature=config.temperature, with_entropy=want_entropy,
                       at=inputs["valid"])
  logp, entropy = out if want_entropy else (out, None)
  if entropy is not None and not config.entropy_coef:
    entropy = jax.lax.stop_gradient(entropy)
  ref_logp = None
  if config.beta > 0:
    ref_logp = inputs["ref_logprobs"]
    if ref_logp is None:
      if ref_model is None:
        raise ValueError("beta > 0 needs batch.ref_logprobs or a ref_state")
      ref_logp = lp_lib.model_logprobs(ref_model, inputs["tokens"],
                                inputs["attention_mask"],
                                temperature=config.temperature,
                                at=inputs["valid"])
    ref_logp = jax.lax.stop_gradient(ref_logp)
  loss, sums = token_loss_terms(logp, inputs, config, ref_logp, entropy)
  return jnp.sum(loss * inputs["weights"]), sums


def finalize(sums, metrics):
  """Per-step metrics from the summed numerators."""
  n = jnp.maximum(sums["valid_count"], 1.0)
  out = dict(metrics)
  out["clip_frac"] = sums["clip_count"] / n
  out["pg_loss"] = sums["pg_loss"]
  out["kl_old"] = sums["kl_old_sum"] / n
  out["logp_gap_mean"] = sums["logp_gap_sum"] / n
  out["logp_gap_max"] = sums["max_logp_gap"]
  if "tis_weight_sum" in sums:
    out["tis_weight_mean"] = sums["tis_weight_sum"] / n
    out["tis_capped_frac"] = sums["tis_capped_count"] / n
  if "kl_sum" in sums:
    out["kl"] = sums["kl_sum"] / n
  if "entropy_sum" in sums:
    out["entropy"] = sums["entropy_sum"] / n
  return out


def grpo_loss(model, batch: batch_lib.TrajectoryBatch,
              config: GRPOConfig | Mapping[str, Any] | None = None,
              ref_model=None):
  """The full-batch GRPO loss and metrics (for evaluation and tests).

  Returns:
    (loss scalar, metrics dict).
  """
  cfg = config_utils.config_from_mapping(GRPOConfig, config)
  inputs, metrics = prepare(batch, cfg)
  loss, sums = micro_loss(model, inputs, ref_model, cfg)
  out = finalize(sums, metrics)
  out["loss"] = loss
  return loss, out


def grpo_loss_fns(config: GRPOConfig) -> ts.LossFns:
  """The GRPO loss in the `learner.step.LossFns` form."""
  return ts.LossFns(
      prepare=lambda batch: prepare(batch, config),
      micro_loss=lambda model, mb, ref: micro_loss(model, mb, ref, config),
      finalize=finalize)


def make_train_step(model_graphdef, optimizer: optax.GradientTransformation,
                    config: GRPOConfig | Mapping[str, Any] | None,
                    mesh: jax.sharding.Mesh, *,
                    batch_axes: Sequence[str] = ts.DEFAULT_BATCH_AXES,
                    ref_graphdef=None, lengths: Sequence[int] = ()):
  """The jitted, sharded GRPO step.

  ``lengths`` (token lengths, e.g. ``(1024, 1536, 2048)``): micro-batches of
  rows sorted by length, each padded to its own length
  (`learner.step.build_sorted_train_step`), instead of one scan over rows of
  the batch's full length. Same update.

  Usage::

    graphdef, state = nnx.split(model)
    optimizer = make_optimizer(opt_config)
    state, opt_state = shard_train_state(state, optimizer, mesh, rules)
    step_fn = make_train_step(graphdef, optimizer, GRPOConfig(), mesh)
    state, opt_state, metrics = step_fn(state, opt_state, batch, rng)

  Pass ``ref_state=`` (a frozen model state) to ``step_fn`` when
  ``beta > 0`` and the batch carries no ``ref_logprobs``.

  Returns:
    ``step_fn(state, opt_state, batch, rng, ref_state=None)``.
  """
  cfg = config_utils.config_from_mapping(GRPOConfig, config)
  if lengths:
    return ts.build_sorted_train_step(
        model_graphdef, optimizer, grpo_loss_fns(cfg), mesh,
        num_micro_batches=cfg.num_micro_batches, lengths=lengths,
        batch_axes=batch_axes, ref_graphdef=ref_graphdef)
  return ts.build_train_step(
      model_graphdef, optimizer, grpo_loss_fns(cfg), mesh,
      num_micro_batches=cfg.num_micro_batches, batch_axes=batch_axes,
      ref_graphdef=ref_graphdef)


def make_eval_step(model_graphdef, config, mesh: jax.sharding.Mesh, *,
                   batch_axes: Sequence[str] = ts.DEFAULT_BATCH_AXES):
  """Jitted ``eval_fn(state, batch) -> metrics`` of the GRPO loss, no update.

  A reference model is not available here: use ``beta == 0`` or a batch
  with ``ref_logprobs``.
  """
  cfg = config_utils.config_from_mapping(GRPOConfig, config)
  return ts.build_eval_step(model_graphdef, grpo_loss_fns(cfg), mesh,
                            batch_axes=batch_axes)


# The optimizer and placement helpers, re-exported for the trainer.
make_optimizer = optim.make_optimizer
make_schedule = optim.make_schedule
shard_train_state = ts.shard_train_state
OptimizerConfig = optim.OptimizerConfig
