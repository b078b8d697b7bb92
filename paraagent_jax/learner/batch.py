"""The RL batch: one fixed-shape pytree per group of rollouts, and its helpers.

A rollout (``paraact.rollout``) produces a `TrajectoryBatch`; the GRPO loss
(`paraagent_jax.learner.grpo`) consumes it. Every array has a static shape so that
the train step compiles once per bucket.

Log-probability convention (important, shared by the sampler and the loss):
``old_logprobs[b, t]`` and ``ref_logprobs[b, t]`` are
``log p(tokens[b, t] | tokens[b, :t])``, i.e. the logit at position ``t - 1``
predicts token ``t``. Position 0 has no prediction and must have
``loss_mask == 0``. `paraagent_jax.learner.logprobs.logprobs_from_logits` implements
the same shift.

Shapes: ``B`` episodes, ``T`` tokens, ``S`` steps and ``P`` phase segments per
episode (padded). Integer codes:

* token kinds: plan=0, action=1, answer=2, env/prompt=3 (never trained);
* phase types: explore=0, execute=1.

``step_id`` / ``phase_id`` of a token index into the ``S`` / ``P`` axes; for
tokens with ``loss_mask == 0`` they may be anything (the loss clips them into
range). ``seq_len`` and ``attention_mask`` are kept apart from ``loss_mask``:
a multi-turn loss mask has holes where observations are, so neither the
length nor the segment structure may be derived from it.
"""

from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax.learner import advantages as adv_lib

# The integer codes of the batch, defined here only (the rollout, the protocol
# and the loss import them). Token kinds: how the loss credits a token.
KIND_PLAN, KIND_ACTION, KIND_ANSWER, KIND_ENV = 0, 1, 2, 3
# Phase types of a step / phase segment.
PHASE_EXPLORE, PHASE_EXECUTE = 0, 1
PHASE_CODES = {"explore": PHASE_EXPLORE, "execute": PHASE_EXECUTE}


@flax.struct.dataclass(kw_only=True)
class TrajectoryBatch:
  """A batch of B episodes (G samples per task), all arrays of static shape.

  Attributes:
    tokens: [B,T] int32 token ids (prompt, assistant turns, observations).
    loss_mask: [B,T] f32, 1 on policy tokens only.
    old_logprobs: [B,T] f32 sampler log-probs (see the module convention).
    ref_logprobs: [B,T] f32 reference-policy log-probs, or None (then a KL
      term needs a reference model, or beta = 0).
    step_id: [B,T] int32 step index of each token, into the S axis.
    phase_id: [B,T] int32 phase-segment index of each token, into the P axis.
    token_kind: [B,T] int32: plan=0, action=1, answer=2, env/prompt=3.
    attention_mask: [B,T] int32, 1 on real tokens (prompt included).
    seq_len: [B] int32 number of real tokens of each episode.
    step_reward: [B,S] f32 reward of each step.
    step_mask: [B,S] f32, 1 on steps that exist.
    step_phase_type: [B,S] int32 phase type of each step (explore=0,
      execute=1).
    phase_reward: [B,P] f32 reward of each phase segment.
    phase_mask: [B,P] f32, 1 on phase segments that exist.
    phase_type: [B,P] int32 (explore=0, execute=1).
    traj_reward: [B] f32 episode reward.
    group_id: [B] int32 dense group index in [0, B) (same task, same group).
    truncated: [B] bool, episode hit max turns or max tokens.
  """

  tokens: jax.Array
  loss_mask: jax.Array
  old_logprobs: jax.Array
  ref_logprobs: jax.Array | None = None
  step_id: jax.Array
  phase_id: jax.Array
  token_kind: jax.Array
  attention_mask: jax.Array
  seq_len: jax.Array
  step_reward: jax.Array
  step_mask: jax.Array
  step_phase_type: jax.Array
  phase_reward: jax.Array
  phase_mask: jax.Array
  phase_type: jax.Array
  traj_reward: jax.Array
  group_id: jax.Array
  truncated: jax.Array

  @property
  def shape(self) -> tuple[int, int, int, int]:
    """(B, T, S, P)."""
    b, t = self.tokens.shape
    return b, t, self.step_reward.shape[1], self.phase_reward.shape[1]


_TOKEN_FIELDS = ("tokens", "loss_mask", "old_logprobs", "ref_logprobs",
                 "step_id", "phase_id", "token_kind", "attention_mask")
_STEP_FIELDS = ("step_reward", "step_mask", "step_phase_type")
_PHASE_FIELDS = ("phase_reward", "phase_mask", "phase_type")
_EPISODE_FIELDS = ("seq_len", "traj_reward", "group_id", "truncated")


def validate_batch(batch: TrajectoryBatch) -> None:
  """Raises ValueError with the offending field if shapes disagree."""
  b, t, s, p = batch.shape
  want = {f: (b, t) for f in _TOKEN_FIELDS}
  want.update({f: (b, s) for f in _STEP_FIELDS})
  want.update({f: (b, p) for f in _PHASE_FIELDS})
  want.update({f: (b,) for f in _EPISODE_FIELDS})
  for name, shape in want.items():
    value = getattr(batch, name)
    if value is None and name == "ref_logprobs":
      continue
    if tuple(value.shape) != shape:
      raise ValueError(
          f"TrajectoryBatch.{name} has shape {tuple(value.shape)}, "
          f"expected {shape} (B,T,S,P = {b},{t},{s},{p})")


def mask_episodes(batch: TrajectoryBatch, keep: jax.Array) -> TrajectoryBatch:
  """Zeroes the loss mask of episodes with ``keep[b] == False``.

  Shapes stay static; a dropped episode simply contributes no token.
  """
  keep = jnp.asarray(keep)
  return batch.replace(
      loss_mask=batch.loss_mask * keep[:, None].astype(batch.loss_mask.dtype))


def drop_no_spread_groups(
    batch: TrajectoryBatch,
    levels: Sequence[str] = adv_lib.ALL_LEVELS,
) -> tuple[TrajectoryBatch, jax.Array]:
  """Masks out groups in which no enabled level has any reward spread.

  Such a group gives every token a zero advantage, so it only dilutes the
  token-mean denominator (and the KL/entropy terms). Jittable.

  Args:
    batch: the batch.
    levels: advantage levels that count (same names as in the loss).

  Returns:
    (batch with those episodes' loss_mask zeroed, keep[B] bool).
  """
  keep = adv_lib.group_has_spread(
      traj_reward=batch.traj_reward, group_id=batch.group_id,
      step_reward=batch.step_reward, step_mask=batch.step_mask,
      step_phase_type=batch.step_phase_type,
      phase_reward=batch.phase_reward, phase_mask=batch.phase_mask,
      phase_type=batch.phase_type, levels=levels)
  return mask_episodes(batch, keep), keep


def token_budget_keep(seq_len: jax.Array, group_id: jax.Array,
                      max_tokens: int) -> jax.Array:
  """Keeps whole groups, lowest group id first, within a token budget.

  Groups are kept or dropped as a unit so that the group statistics of the
  advantages are unchanged for the groups that stay. Jittable.

  Args:
    seq_len: [B] int tokens per episode.
    group_id: [B] int dense group ids in [0, B).
    max_tokens: total ``seq_len`` allowed over the kept episodes.

  Returns:
    keep[B] bool.
  """
  n = group_id.shape[0]
  per_group = jax.ops.segment_sum(seq_len.astype(jnp.int32), group_id,
                                  num_segments=n)
  group_fits = jnp.cumsum(per_group) <= max_tokens
  return group_fits[group_id]


def apply_token_budget(batch: TrajectoryBatch,
                       max_tokens: int) -> tuple[TrajectoryBatch, jax.Array]:
  """Masks out the groups beyond ``max_tokens`` (see `token_budget_keep`)."""
  keep = token_budget_keep(batch.seq_len, batch.group_id, max_tokens)
  return mask_episodes(batch, keep), keep


def split_micro_batches(tree, num_micro_batches: int):
  """Reshapes every [B, ...] leaf to [M, B // M, ...] for a scan."""
  def split(x):
    if x.shape[0] % num_micro_batches:
      raise ValueError(f"batch size {x.shape[0]} is not divisible by "
                       f"num_micro_batches={num_micro_batches}")
    return x.reshape((num_micro_batches, x.shape[0] // num_micro_batches)
                     + x.shape[1:])
  return jax.tree.map(split, tree)


def synthetic_batch(seed: int, *, batch_size: int, seq_len: int,
                    num_steps: int, num_phases: int, group_size: int,
                    vocab_size: int, with_ref: bool = True) -> TrajectoryBatch:
  """A random but structurally faithful batch, for tests and benchmarks.

  Each episode is: prompt (env tokens), then steps made of plan tokens and
  action tokens (the last step may be an answer), each followed by an
  observation (env tokens, loss 0), then padding. Consecutive steps of the
  same phase type form one phase segment. Rewards are random with ties.

  Args:
    seed: numpy seed.
    batch_size: B, a multiple of group_size.
    seq_len: T.
    num_steps: S (padded step axis).
    num_phases: P (padded phase axis).
    group_size: G episodes per group.
    vocab_size: token ids are drawn from [0, vocab_size).
    with_ref: also fill ref_logprobs.

  Returns:
    A `TrajectoryBatch` of numpy-backed jax arrays.
  """
  rng = np.random.default_rng(seed)
  b, t, s, p = batch_size, seq_len, num_steps, num_phases
  tokens = rng.integers(0, vocab_size, (b, t), dtype=np.int32)
  loss_mask = np.zeros((b, t), np.float32)
  step_id = rng.integers(-3, s + 3, (b, t)).astype(np.int32)  # junk off-mask
  phase_id = rng.integers(-3, p + 3, (b, t)).astype(np.int32)
  kind = np.full((b, t), KIND_ENV, np.int32)
  attn = np.zeros((b, t), np.int32)
  lens = np.zeros((b,), np.int32)
  step_reward = rng.normal(size=(b, s)).astype(np.float32)
  step_mask = np.zeros((b, s), np.float32)
  step_ptype = rng.integers(0, 2, (b, s)).astype(np.int32)
  phase_reward = rng.normal(size=(b, p)).astype(np.float32)
  phase_mask = np.zeros((b, p), np.float32)
  phase_type = rng.integers(0, 2, (b, p)).astype(np.int32)
  for i in range(b):
    pos = int(rng.integers(2, max(3, t // 8)))  # prompt
    n_steps = int(rng.integers(1, s + 1))
    seg, prev = -1, None
    for j in range(n_steps):
      ptype = int(rng.integers(0, 2))
      if ptype != prev:
        if seg + 1 >= p:
          break
        seg, prev = seg + 1, ptype
        phase_mask[i, seg], phase_type[i, seg] = 1.0, ptype
      step_mask[i, j], step_ptype[i, j] = 1.0, ptype
      last = j == n_steps - 1
      parts = [(KIND_PLAN, max(3, t // (4 * s))),
               (KIND_ANSWER if last else KIND_ACTION, max(4, t // (3 * s)))]
      for k, n in parts:
        n = min(int(rng.integers(1, n + 1)), t - pos)
        loss_mask[i, pos:pos + n] = 1.0
        kind[i, pos:pos + n] = k
        step_id[i, pos:pos + n], phase_id[i, pos:pos + n] = j, seg
        pos += n
      obs = int(rng.integers(0, max(4, t // (3 * s))))
      pos = min(t, pos + obs)  # observation tokens, loss 0
    lens[i] = pos
    attn[i, :pos] = 1
  loss_mask[:, 0] = 0.0  # position 0 has no prediction
  # Rewards with ties so that some groups have no spread at some level.
  step_reward = np.round(step_reward, 0) * step_mask
  phase_reward = np.round(phase_reward, 1) * phase_mask
  traj_reward = np.round(rng.normal(size=(b,)), 0).astype(np.float32)
  old_lp = np.log(rng.uniform(0.05, 1.0, (b, t))).astype(np.float32)
  ref_lp = (old_lp + rng.normal(scale=0.1, size=(b, t))).astype(np.float32)
  return TrajectoryBatch(
      tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(loss_mask),
      old_logprobs=jnp.asarray(old_lp),
      ref_logprobs=jnp.asarray(ref_lp) if with_ref else None,
      step_id=jnp.asarray(step_id), phase_id=jnp.asarray(phase_id),
      token_kind=jnp.asarray(kind), attention_mask=jnp.asarray(attn),
      seq_len=jnp.asarray(lens), step_reward=jnp.asarray(step_reward),
      step_mask=jnp.asarray(step_mask),
      step_phase_type=jnp.asarray(step_ptype),
      phase_reward=jnp.asarray(phase_reward),
      phase_mask=jnp.asarray(phase_mask),
      phase_type=jnp.asarray(phase_type),
      traj_reward=jnp.asarray(traj_reward),
      group_id=jnp.asarray(np.arange(b, dtype=np.int32) // group_size),
      truncated=jnp.asarray(rng.uniform(size=(b,)) < 0.2))
