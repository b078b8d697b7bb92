"""Multi-level (trajectory / phase / step) decoupled GRPO advantages.

For a batch of B episodes in groups (``group_id[B]``, dense ints in [0, B)):

* trajectory: ``A_traj[b] = (R[b] - mean_g R) / (std_g R + eps)`` over b's
  group;
* phase: ``A_phase[b,p]``, the same over the valid phase segments of the same
  group **and the same phase type** (explore=0 / execute=1);
* step: ``A_step[b,s]``, the same over the valid steps of the same group and
  the same phase type of the step.

std is the population standard deviation (ddof 0). A level whose group has no
spread (all values equal, or a single value) gives exactly 0.
``normalize="mean"`` drops the division (Dr. GRPO style).

Per token, with ``k = token_kind[b,t]`` and a (kind x level) weight matrix W:
``A[b,t] = W[k,0] A_traj[b] + W[k,1] A_phase[b, phase_id[b,t]]
+ W[k,2] A_step[b, step_id[b,t]]``, and 0 where ``loss_mask`` is 0. Default
W: plan (1,1,0), action (1,0,1), answer (1,0,0). Env/prompt tokens (kind 3)
get weight 0.

Every reduction is a `jax.ops.segment_*` over flattened (group, type) keys,
so all of this is jittable with static shapes; nothing loops over the batch.
With ``levels=("traj",)`` and the default W, every policy token of episode b
gets ``A_traj[b]``: plain GRPO.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp

ALL_LEVELS = ("traj", "phase", "step")
NORMALIZE_MODES = ("mean_std", "mean")
NUM_PHASE_TYPES = 2
NUM_TOKEN_KINDS = 4  # plan, action, answer, env

# Rows: plan, action, answer. Columns: traj, phase, step.
DEFAULT_LEVEL_WEIGHTS = ((1.0, 1.0, 0.0),
                         (1.0, 0.0, 1.0),
                         (1.0, 0.0, 0.0))


class Advantages(NamedTuple):
  """Every level of the advantage, before and after the per-token combination.

  Attributes:
    token: [B,T] combined per-token advantage (0 off the loss mask).
    traj: [B] trajectory-level advantage.
    phase: [B,P] phase-segment advantage (0 on invalid segments).
    step: [B,S] step advantage (0 on invalid steps).
  """

  token: jax.Array
  traj: jax.Array
  phase: jax.Array
  step: jax.Array


def check_options(levels: Sequence[str], normalize: str) -> None:
  """Raises ValueError for unknown level names or normalisation modes."""
  unknown = set(levels) - set(ALL_LEVELS)
  if unknown:
    raise ValueError(f"unknown advantage levels {sorted(unknown)}; "
                     f"choose from {ALL_LEVELS}")
  if normalize not in NORMALIZE_MODES:
    raise ValueError(f"normalize={normalize!r}; choose from {NORMALIZE_MODES}")


def segment_normalize(values, segment_ids, valid, num_segments: int,
                      eps: float = 1e-6, normalize: str = "mean_std"):
  """Normalises values within segments; invalid entries and flat segments -> 0.

  Args:
    values: [N] float values.
    segment_ids: [N] int segment of each value, in [0, num_segments) where
      valid (anything elsewhere).
    valid: [N] bool, which entries exist.
    num_segments: static number of segments.
    eps: added to the std.
    normalize: "mean_std" or "mean".

  Returns:
    (normalised [N] float32, has_spread [num_segments] bool).
  """
  values = values.astype(jnp.float32)
  # Invalid entries go to an extra dump segment so they touch no statistic.
  ids = jnp.where(valid, segment_ids, num_segments)
  n = num_segments + 1
  w = valid.astype(jnp.float32)
  count = jax.ops.segment_sum(w, ids, num_segments=n)
  denom = jnp.maximum(count, 1.0)
  mean = jax.ops.segment_sum(values * w, ids, num_segments=n) / denom
  centered = values - mean[ids]
  # Two-pass variance: numerically safer than E[x^2] - E[x]^2 in float32.
  sq = centered * centered * w
  var = jax.ops.segment_sum(sq, ids, num_segments=n) / denom
  std = jnp.sqrt(var)
  vmax = jax.ops.segment_max(jnp.where(valid, values, -jnp.inf), ids,
                             num_segments=n)
  vmin = jax.ops.segment_min(jnp.where(valid, values, jnp.inf), ids,
                             num_segments=n)
  # Exact test for "no spread": a float mean of equal values may differ from
  # them in the last bit, which std + eps would blow up into noise.
  spread = (count > 1.0) & (vmax > vmin)
  if normalize == "mean_std":
    out = centered / (std[ids] + eps)
  else:
    out = centered
  out = jnp.where(valid & spread[ids], out, 0.0)
  return out, spread[:num_segments]


def _typed_keys(group_id, types, valid):
  """Flattens (group, type) pairs of [B,K] arrays into segment ids."""
  b, k = types.shape
  t = jnp.clip(types, 0, NUM_PHASE_TYPES - 1)
  keys = group_id[:, None] * NUM_PHASE_TYPES + t
  return keys.reshape(b * k), valid.reshape(b * k) > 0


def level_advantages(*, traj_reward, group_id, step_reward, step_mask,
                     step_phase_type, phase_reward, phase_mask, phase_type,
                     eps: float = 1e-6, normalize: str = "mean_std"):
  """The three normalised levels, not yet combined per token.

  Returns:
    (a_traj [B], a_phase [B,P], a_step [B,S], spreads) where spreads is a
    dict level -> has_spread over that level's segments.
  """
  check_options((), normalize)
  b = traj_reward.shape[0]
  group_id = group_id.astype(jnp.int32)
  a_traj, traj_spread = segment_normalize(
      traj_reward, group_id, jnp.ones((b,), bool), b, eps, normalize)
  pkeys, pvalid = _typed_keys(group_id, phase_type, phase_mask)
  a_phase, phase_spread = segment_normalize(
      phase_reward.reshape(-1), pkeys, pvalid, b * NUM_PHASE_TYPES, eps,
      normalize)
  skeys, svalid = _typed_keys(group_id, step_phase_type, step_mask)
  a_step, step_spread = segment_normalize(
      step_reward.reshape(-1), skeys, svalid, b * NUM_PHASE_TYPES, eps,
      normalize)
  spreads = {"traj": traj_spread, "phase": phase_spread, "step": step_spread}
  return (a_traj, a_phase.reshape(phase_reward.shape),
          a_step.reshape(step_reward.shape), spreads)


def _weight_table(level_weights, levels: Sequence[str]):
  """[4,3] table: W with the env row (zeros) and disabled levels zeroed."""
  w = jnp.asarray(level_weights, jnp.float32).reshape(3, 3)
  on = jnp.asarray([lvl in levels for lvl in ALL_LEVELS], jnp.float32)
  return jnp.concatenate([w * on[None, :], jnp.zeros((1, 3), jnp.float32)], 0)


def compute_advantages(*, traj_reward, group_id, step_reward, step_mask,
                       step_phase_type, phase_reward, phase_mask, phase_type,
                       step_id, phase_id, token_kind, loss_mask,
                       level_weights=DEFAULT_LEVEL_WEIGHTS, eps: float = 1e-6,
                       normalize: str = "mean_std",
                       levels: Sequence[str] = ALL_LEVELS) -> Advantages:
  """All levels and the per-token combination (see the module docstring).

  Arguments are as in `token_advantages`.

  Returns:
    An `Advantages` tuple.
  """
  check_options(levels, normalize)
  a_traj, a_phase, a_step, _ = level_advantages(
      traj_reward=traj_reward, group_id=group_id, step_reward=step_reward,
      step_mask=step_mask, step_phase_type=step_phase_type,
      phase_reward=phase_reward, phase_mask=phase_mask, phase_type=phase_type,
      eps=eps, normalize=normalize)
  p, s = phase_reward.shape[1], step_reward.shape[1]
  # Off-mask tokens may carry any id; clip so the gathers stay in range.
  pid = jnp.clip(phase_id, 0, p - 1)
  sid = jnp.clip(step_id, 0, s - 1)
  tok_phase = jnp.take_along_axis(a_phase, pid, axis=1)
  tok_step = jnp.take_along_axis(a_step, sid, axis=1)
  w = _weight_table(level_weights, levels)[
      jnp.clip(token_kind, 0, NUM_TOKEN_KINDS - 1)]  # [B,T,3]
  token = (w[..., 0] * a_traj[:, None] + w[..., 1] * tok_phase
           + w[..., 2] * tok_step)
  token = jnp.where(loss_mask > 0, token, 0.0).astype(jnp.float32)
  return Advantages(token=token, traj=a_traj, phase=a_phase, step=a_step)


def token_advantages(traj_reward, group_id, step_reward, step_mask,
                     step_phase_type, phase_reward, phase_mask, phase_type,
                     step_id, phase_id, token_kind, loss_mask, level_weights,
                     eps=1e-6, normalize="mean_std", levels=ALL_LEVELS):
  """Per-token multi-level advantage, [B,T] float32 (jittable).

  Args:
    traj_reward: [B] episode rewards.
    group_id: [B] int dense group ids in [0, B).
    step_reward: [B,S] step rewards.
    step_mask: [B,S] 1 on valid steps.
    step_phase_type: [B,S] int phase type of each step (explore=0, execute=1).
    phase_reward: [B,P] phase-segment rewards.
    phase_mask: [B,P] 1 on valid phase segments.
    phase_type: [B,P] int (explore=0, execute=1).
    step_id: [B,T] int step of each token (clipped into [0, S)).
    phase_id: [B,T] int phase segment of each token (clipped into [0, P)).
    token_kind: [B,T] int plan=0, action=1, answer=2, env=3 (weight 0).
    loss_mask: [B,T] the advantage is 0 where this is 0.
    level_weights: [3,3] (plan/action/answer x traj/phase/step).
    eps: added to each group's std.
    normalize: "mean_std" (GRPO) or "mean" (no division).
    levels: the enabled levels (an ablation switch); disabled levels get
      weight 0. ``("traj",)`` with the default weights is plain GRPO.

  Returns:
    [B,T] float32 advantages.
  """
  return compute_advantages(
      traj_reward=traj_reward, group_id=group_id, step_reward=step_reward,
      step_mask=step_mask, step_phase_type=step_phase_type,
      phase_reward=phase_reward, phase_mask=phase_mask, phase_type=phase_type,
      step_id=step_id, phase_id=phase_id, token_kind=token_kind,
      loss_mask=loss_mask, level_weights=level_weights, eps=eps,
      normalize=normalize, levels=levels).token


def _masked_mean_std(x, w):
  n = jnp.maximum(jnp.sum(w), 1.0)
  mean = jnp.sum(x * w) / n
  var = jnp.sum(jnp.square(x - mean) * w) / n
  return mean, jnp.sqrt(var)


def advantage_metrics(adv: Advantages, *, loss_mask, step_mask,
                      phase_mask) -> Mapping[str, jax.Array]:
  """Mean and std of each level over its valid entries, and of the tokens.

  Episodes count for the trajectory level when they have a policy token.
  """
  ep = (jnp.sum(loss_mask, axis=1) > 0).astype(jnp.float32)
  out = {}
  for name, x, w in (("traj", adv.traj, ep),
                     ("phase", adv.phase, phase_mask.astype(jnp.float32)),
                     ("step", adv.step, step_mask.astype(jnp.float32)),
                     ("token", adv.token, (loss_mask > 0).astype(jnp.float32))):
    mean, std = _masked_mean_std(x, w)
    out[f"adv/{name}_mean"] = mean
    out[f"adv/{name}_std"] = std
  return out


def group_has_spread(*, traj_reward, group_id, step_reward, step_mask,
                     step_phase_type, phase_reward, phase_mask, phase_type,
                     levels: Sequence[str] = ALL_LEVELS) -> jax.Array:
  """[B] bool: does episode b's group have spread at any enabled level?

  A (group, phase type) segment with spread counts for its group.
  """
  check_options(levels, "mean_std")
  b = traj_reward.shape[0]
  group_id = group_id.astype(jnp.int32)
  _, _, _, spreads = level_advantages(
      traj_reward=traj_reward, group_id=group_id, step_reward=step_reward,
      step_mask=step_mask, step_phase_type=step_phase_type,
      phase_reward=phase_reward, phase_mask=phase_mask, phase_type=phase_type)
  any_spread = jnp.zeros((b,), bool)
  if "traj" in levels:
    any_spread |= spreads["traj"]
  for lvl in ("phase", "step"):
    if lvl in levels:
      any_spread |= spreads[lvl].reshape(b, NUM_PHASE_TYPES).any(axis=1)
  return any_spread[group_id]
