"""GRPO loss and train step: numpy references, meshes, gradient accumulation.

The numpy references here (log-softmax shift, group normalisation, clipped
ratio, k3 KL, aggregations, cross-entropy) are written from the formulas,
not from `paraagent_jax.learner`. Models are small stand-ins: `FixedLogits`
returns a parameter as its logits so that the loss can be recomputed in
numpy from known log-probs; `TinyLM` is a causal model with sharded
parameters for the mesh and accumulation tests.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from paraagent_jax import sharding as shd
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import grpo
from paraagent_jax.learner import logprobs
from paraagent_jax.learner import sft_loss as sft
from paraagent_jax.learner import optimizer as optim
from paraagent_jax import config_utils
from paraagent_jax.learner import step as ts
from paraagent_jax.models import qwen3

AXES = ("data", "fsdp", "tensor")
B, T, S, P, V = 8, 16, 4, 3, 32
# Logical axis names of TinyLM -> mesh axes (as in paraagent_jax.sharding).
RULES = {"vocab": "tensor", "embed": "fsdp", "mlp": "tensor"}


class FixedLogits(nnx.Module):
  """Logits are a parameter: the loss becomes a function of known numbers."""

  def __init__(self, logits):
    self.logits = nnx.Param(jnp.asarray(logits, jnp.float32))

  def __call__(self, tokens, attention_mask=None):
    del tokens, attention_mask
    return self.logits[...]


class TinyLM(nnx.Module):
  """Embed -> causal running mean -> MLP -> head, with sharded params."""

  def __init__(self, vocab, dim, rngs):
    part = nnx.with_partitioning
    self.embed = nnx.Param(part(nnx.initializers.normal(1.0), ("vocab",
                                                              "embed"))(
        rngs.params(), (vocab, dim)))
    self.mix = nnx.Linear(dim, dim, rngs=rngs, kernel_init=part(
        nnx.initializers.lecun_normal(), ("embed", "mlp")))
    self.head = nnx.Linear(dim, vocab, rngs=rngs, kernel_init=part(
        nnx.initializers.lecun_normal(), ("embed", "vocab")))
    self.norm = nnx.RMSNorm(dim, rngs=rngs)

  def __call__(self, tokens, attention_mask=None):
    mask = attention_mask.astype(jnp.float32)[..., None]
    x = self.embed[...][tokens] * mask
    x = jnp.cumsum(x, axis=1) / jnp.maximum(jnp.cumsum(mask, axis=1), 1.0)
    return self.head(jnp.tanh(self.mix(self.norm(x))))


def make_tiny(seed=0):
  with nnx.use_eager_sharding(False):
    return TinyLM(V, 16, nnx.Rngs(seed))


def mesh_of(shape):
  n = int(np.prod(shape))
  return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,)
                       * 3, devices=jax.devices()[:n])


def make_batch(seed=0, with_ref=True, group_size=4, t=T):
  return batch_lib.synthetic_batch(seed, batch_size=B, seq_len=t,
                                   num_steps=S, num_phases=P,
                                   group_size=group_size, vocab_size=V,
                                   with_ref=with_ref)


def np_logprobs(logits, tokens, entropy=False):
  """log p(tokens[t] | <t) from the logit at t-1; 0 at position 0."""
  logits = np.asarray(logits, np.float64)
  b, t, _ = logits.shape
  lp, ent = np.zeros((b, t)), np.zeros((b, t))
  for i in range(b):
    for j in range(1, t):
      z = logits[i, j - 1]
      logsm = z - z.max() - np.log(np.exp(z - z.max()).sum())
      lp[i, j] = logsm[tokens[i, j]]
      ent[i, j] = -(np.exp(logsm) * logsm).sum()
  return (lp, ent) if entropy else lp


def np_plain_grpo(logp, batch, lo, hi, beta=0.0, aggregation="token_mean"):
  """Plain GRPO: one group-normalised reward per episode on every token."""
  tb = {k: np.asarray(v, np.float64) for k, v in
        (("r", batch.traj_reward), ("old", batch.old_logprobs),
         ("ref", batch.ref_logprobs), ("mask", batch.loss_mask))}
  gid, lens = np.asarray(batch.group_id), np.asarray(batch.seq_len)
  b, t = logp.shape
  adv = np.zeros(b)
  for i in range(b):
    r = tb["r"][gid == gid[i]]
    if r.max() > r.min():
      adv[i] = (tb["r"][i] - r.mean()) / (r.std() + 1e-6)
  valid = (tb["mask"] > 0) & (np.arange(t)[None] < lens[:, None])
  loss_tok = np.zeros((b, t))
  clipped = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      ratio = np.exp(logp[i, j] - tb["old"][i, j])
      a = adv[i]
      u = -a * ratio
      c = -a * min(max(ratio, 1 - lo), 1 + hi)
      loss_tok[i, j] = max(u, c)
      clipped[i, j] = c > u
      if beta:
        d = tb["ref"][i, j] - logp[i, j]
        loss_tok[i, j] += beta * (np.exp(d) - d - 1)
  if aggregation == "token_mean":
    loss = (loss_tok * valid).sum() / valid.sum()
  else:
    per_seq = [(loss_tok[i] * valid[i]).sum() / valid[i].sum()
               for i in range(b) if valid[i].sum() > 0]
    loss = float(np.mean(per_seq))
  return loss, (clipped * valid).sum() / valid.sum()


def fixed_logits_case(seed, with_ref=True):
  rng = np.random.default_rng(seed)
  batch = make_batch(seed, with_ref=with_ref)
  logits = rng.normal(scale=2.0, size=(B, T, V))
  logp = np_logprobs(logits, np.asarray(batch.tokens))
  # Old log-probs near the current ones so that some ratios clip, some not.
  old = logp + rng.normal(scale=0.3, size=logp.shape)
  batch = batch.replace(old_logprobs=jnp.asarray(old, jnp.float32))
  if with_ref:
    ref = logp + rng.normal(scale=0.5, size=logp.shape)
    batch = batch.replace(ref_logprobs=jnp.asarray(ref, jnp.float32))
  return FixedLogits(logits), batch, logp


def test_logprob_convention_and_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7))
  tokens = rng.integers(0, 7, (2, 5))
  want_lp, want_ent = np_logprobs(logits, tokens, entropy=True)
  lp, ent = logprobs.logprobs_from_logits(jnp.asarray(logits, jnp.float32),
                                      jnp.asarray(tokens), with_entropy=True)
  np.testing.assert_allclose(lp, want_lp, atol=1e-5)
  np.testing.assert_allclose(ent, want_ent, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_traj_only_loss_equals_numpy_plain_grpo(aggregation, beta):
  model, batch, logp = fixed_logits_case(1)
  cfg = grpo.GRPOConfig(levels=("traj",), clip_eps_low=0.2,
                        clip_eps_high=0.28, beta=beta,
                        aggregation=aggregation)
  loss, metrics = jax.jit(lambda m, b: grpo.grpo_loss(m, b, cfg))(model,
                                                                  batch)
  want, want_clip = np_plain_grpo(logp, batch, 0.2, 0.28, beta, aggregation)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(metrics["clip_frac"]), want_clip,
                             atol=1e-6)
  assert 0.0 < want_clip < 1.0  # both branches of the clip are exercised


def _np_valid(batch):
  t = batch.tokens.shape[1]
  return ((np.asarray(batch.loss_mask) > 0)
          & (np.arange(t)[None] < np.asarray(batch.seq_len)[:, None]))


def test_sampler_trainer_gap_metrics_equal_numpy():
  model, batch, logp = fixed_logits_case(2)
  _, m = jax.jit(lambda m, b: grpo.grpo_loss(m, b, grpo.GRPOConfig()))(model, batch)
  valid = _np_valid(batch)
  gap = np.abs(logp - np.asarray(batch.old_logprobs, np.float64))[valid]
  np.testing.assert_allclose(float(m["logp_gap_mean"]), gap.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(m["logp_gap_max"]), gap.max(), rtol=1e-5)
  assert "tis_weight_mean" not in m      # off by default


def test_truncated_importance_sampling_equals_numpy():
  """With tis_cap, each token's term is -A * min(exp(logp - old), cap) (the
  ratio against the trainer's own log-probs is 1), the gradient of logp
  scaled by the same capped weight."""
  model, batch, logp = fixed_logits_case(3, with_ref=False)
  cap = 1.5
  cfg = grpo.GRPOConfig(levels=("traj",), tis_cap=cap)
  loss, m = jax.jit(lambda m, b: grpo.grpo_loss(m, b, cfg))(model, batch)
  valid = _np_valid(batch)
  r = np.asarray(batch.traj_reward, np.float64)
  gid = np.asarray(batch.group_id)
  adv = np.zeros(B)
  for i in range(B):
    g = r[gid == gid[i]]
    if g.max() > g.min():
      adv[i] = (r[i] - g.mean()) / (g.std() + 1e-6)
  w = np.minimum(np.exp(logp - np.asarray(batch.old_logprobs, np.float64)), cap)
  want = (-adv[:, None] * w * valid).sum() / valid.sum()
  np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(m["tis_weight_mean"]), w[valid].mean(), rtol=1e-5)
  assert 0.0 < float(m["tis_capped_frac"]) < 1.0       # some weights capped, some not


@pytest.mark.slow
def test_tis_without_a_gap_is_the_plain_loss_and_gradient():
  """On-policy with no sampler/trainer gap the weights are 1: same loss and
  gradient as with TIS off (what the CPU in fp32 gives: the gap is ~0)."""
  model, batch, logp = fixed_logits_case(4, with_ref=False)
  batch = batch.replace(old_logprobs=jnp.asarray(logp, jnp.float32))

  def value_and_grad(cfg):
    f = lambda mdl: grpo.grpo_loss(mdl, batch, cfg)[0]
    return nnx.value_and_grad(f)(model)

  (l0, g0), (l1, g1) = (value_and_grad(grpo.GRPOConfig(tis_cap=c)) for c in (0.0, 2.0))
  np.testing.assert_allclose(float(l0), float(l1), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(g0.logits[...]), np.asarray(g1.logits[...]),
                             rtol=1e-4, atol=1e-7)
  assert float(np.abs(np.asarray(g0.logits[...])).max()) > 0


def test_tis_cap_is_checked():
  with pytest.raises(ValueError, match="tis_cap"):
    grpo.GRPOConfig(tis_cap=0.5)


@pytest.mark.slow
def test_seq_len_not_loss_mask_bounds_the_tokens():
  """Policy tokens past seq_len are ignored; holes in the mask are fine."""
  model, batch, logp = fixed_logits_case(2)
  cut = np.asarray(batch.seq_len) // 2
  short = batch.replace(seq_len=jnp.asarray(cut, jnp.int32))
  cfg = grpo.GRPOConfig(levels=("traj",))
  loss, _ = grpo.grpo_loss(model, short, cfg)
  want, _ = np_plain_grpo(logp, short, 0.2, 0.2)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)


@pytest.mark.slow
def test_entropy_metric_and_bonus():
  model, batch, _ = fixed_logits_case(3)
  _, ent = np_logprobs(np.asarray(model.logits[...]),
                       np.asarray(batch.tokens), entropy=True)
  valid = np.asarray(grpo.valid_tokens(batch))
  base = grpo.GRPOConfig(levels=("traj",))
  loss0, m = grpo.grpo_loss(model, batch, base)
  np.testing.assert_allclose(float(m["entropy"]), ent[valid].mean(),
                             rtol=1e-5)
  bonus = grpo.GRPOConfig(levels=("traj",), entropy_coef=0.1)
  loss1, _ = grpo.grpo_loss(model, batch, bonus)
  np.testing.assert_allclose(float(loss0 - loss1), 0.1 * ent[valid].mean(),
                             rtol=1e-4)


@pytest.mark.slow
def test_beta_zero_never_touches_the_reference():
  model, batch, _ = fixed_logits_case(4, with_ref=False)
  loss, metrics = grpo.grpo_loss(model, batch, grpo.GRPOConfig(beta=0.0))
  assert np.isfinite(float(loss)) and "kl" not in metrics
  with pytest.raises(ValueError, match="ref"):
    grpo.grpo_loss(model, batch, grpo.GRPOConfig(beta=0.1))
  # A reference identical to the policy has zero KL.
  _, metrics = grpo.grpo_loss(model, batch, grpo.GRPOConfig(beta=0.1),
                              ref_model=model)
  np.testing.assert_allclose(float(metrics["kl"]), 0.0, atol=1e-7)


def test_sft_loss_matches_numpy_cross_entropy():
  model, batch, logp = fixed_logits_case(5)
  mask = np.asarray(batch.loss_mask).copy()
  mask[:, 0] = 0
  want = -(logp * mask).sum() / mask.sum()
  got = sft.sft_loss(model, batch.tokens, batch.loss_mask,
                     batch.attention_mask)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_schedule_warmup_then_cosine():
  cfg = optim.OptimizerConfig(learning_rate=1.0, warmup_steps=4, total_steps=14,
                           end_lr_ratio=0.0)
  sched = optim.make_schedule(cfg)
  assert float(sched(2)) == pytest.approx(0.5)
  assert float(sched(4)) == pytest.approx(1.0)
  assert float(sched(9)) == pytest.approx(0.5 * (1 + np.cos(np.pi * 0.5)))
  assert float(sched(14)) == pytest.approx(0.0, abs=1e-7)
  with pytest.raises(ValueError, match="unknown"):
    config_utils.config_from_mapping(optim.OptimizerConfig, {"lr": 1.0})

def test_schedule_warmup_stable_decay():
  """wsd: warmup, the peak until the last decay_steps, then linear to the end
  ratio; its stable part does not depend on total_steps (a longer run
  continues a shorter one exactly)."""
  cfg = dict(learning_rate=2.0, warmup_steps=4, total_steps=24, end_lr_ratio=0.1,
             schedule="wsd", decay_steps=10)
  sched = optim.make_schedule(cfg)
  assert float(sched(2)) == pytest.approx(1.0)
  assert [float(sched(s)) for s in (4, 9, 14)] == pytest.approx([2.0, 2.0, 2.0])
  assert float(sched(19)) == pytest.approx(2.0 - 0.5 * (2.0 - 0.2))
  assert float(sched(24)) == pytest.approx(0.2)
  longer = optim.make_schedule(dict(cfg, total_steps=100))
  assert [float(longer(s)) for s in range(15)] == pytest.approx(
      [float(sched(s)) for s in range(15)])
  # decay_steps = 0: the last 20% of the steps after the warmup.
  default = optim.make_schedule(dict(cfg, decay_steps=0))
  assert float(default(20)) == pytest.approx(2.0)
  assert float(default(22)) == pytest.approx(2.0 - 0.5 * 1.8)



def run_steps(mesh, cfg, n_steps=2, kind="grpo", seed=0):
  """n optimizer steps of TinyLM on a fresh model; returns (params, metrics)."""
  model = make_tiny(seed)
  graphdef, state = nnx.split(model)
  optimizer = optim.make_optimizer(optim.OptimizerConfig(
      learning_rate=0.05, warmup_steps=1, total_steps=10, weight_decay=0.01,
      max_grad_norm=0.5))
  state, opt_state = ts.shard_train_state(state, optimizer, mesh, RULES)
  if kind == "grpo":
    step = grpo.make_train_step(graphdef, optimizer, cfg, mesh)
  else:
    step = sft.make_sft_train_step(graphdef, optimizer, mesh,
                                   num_micro_batches=cfg.num_micro_batches)
  metrics = []
  for i in range(n_steps):
    batch = make_batch(10 + i)
    if kind == "sft":
      batch = {"tokens": batch.tokens, "loss_mask": batch.loss_mask,
               "attention_mask": batch.attention_mask}
    state, opt_state, m = step(state, opt_state, batch, jax.random.key(i))
    metrics.append(jax.device_get(m))
  params = jax.tree.map(np.asarray, ts.split_params(state)[0])
  return params, metrics, state


def assert_trees_close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, atol=atol, rtol=atol)


@pytest.mark.slow
def test_mesh_2x2x2_matches_one_device():
  cfg = grpo.GRPOConfig(beta=0.02, clip_eps_high=0.28)
  p1, m1, _ = run_steps(mesh_of((1, 1, 1)), cfg)
  p8, m8, state8 = run_steps(mesh_of((2, 2, 2)), cfg)
  assert_trees_close(p1, p8, 2e-5)
  for a, b in zip(m1, m8):
    for k in ("loss", "grad_norm", "clip_frac", "kl", "entropy",
              "adv/step_std"):
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, atol=1e-6, err_msg=k)
  # The parameters really are split over the mesh.
  spec = state8["head"]["kernel"][...].sharding.spec
  assert tuple(spec) == ("fsdp", "tensor")
  assert len(state8["head"]["kernel"][...].addressable_shards) == 8
  # Two steps moved the parameters at all (else the test proves nothing).
  p0 = jax.tree.map(np.asarray, ts.split_params(nnx.split(make_tiny())[1])[0])
  assert max(np.abs(x - y).max() for x, y in
             zip(jax.tree.leaves(p0), jax.tree.leaves(p1))) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_two_micro_batches_equal_one_full_batch(aggregation):
  mesh = mesh_of((2, 2, 2))
  full = grpo.GRPOConfig(aggregation=aggregation, num_micro_batches=1)
  micro = grpo.GRPOConfig(aggregation=aggregation, num_micro_batches=2)
  p_full, m_full, _ = run_steps(mesh, full)
  p_micro, m_micro, _ = run_steps(mesh, micro)
  assert_trees_close(p_full, p_micro, 2e-5)
  for a, b in zip(m_full, m_micro):
    for k in ("loss", "grad_norm", "clip_frac", "adv/traj_std", "logp_gap_mean",
              "logp_gap_max"):
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_sft_step_accumulation_and_mesh():
  one = grpo.GRPOConfig(num_micro_batches=1)
  two = grpo.GRPOConfig(num_micro_batches=2)
  p_ref, m_ref, _ = run_steps(mesh_of((1, 1, 1)), one, kind="sft")
  p_acc, m_acc, _ = run_steps(mesh_of((2, 2, 2)), two, kind="sft")
  assert_trees_close(p_ref, p_acc, 2e-5)
  np.testing.assert_allclose(m_ref[0]["loss"], m_acc[0]["loss"], rtol=1e-5)


def test_first_step_loss_matches_numpy_and_update_is_adamw():
  """One GRPO step on FixedLogits: the loss and the AdamW update by hand."""
  model, batch, logp = fixed_logits_case(6)
  mesh = mesh_of((1, 1, 1))
  graphdef, state = nnx.split(model)
  lr = 0.1
  optimizer = optim.make_optimizer(optim.OptimizerConfig(
      learning_rate=lr, warmup_steps=0, schedule="constant",
      max_grad_norm=0.0, adam_eps=1e-30))
  state, opt_state = ts.shard_train_state(state, optimizer, mesh, RULES)
  before = np.asarray(state["logits"][...])
  cfg = grpo.GRPOConfig(levels=("traj",), compute_entropy=False)
  step = grpo.make_train_step(graphdef, optimizer, cfg, mesh)
  state, _, m = step(state, opt_state, batch, jax.random.key(0))
  want, _ = np_plain_grpo(logp, batch, 0.2, 0.2)
  np.testing.assert_allclose(float(m["loss"]), want, rtol=1e-5)
  # Adam's first step moves every parameter with a nonzero gradient by
  # exactly lr * sign(grad) (bias correction makes m/sqrt(v) = sign(g)).
  delta = np.asarray(state["logits"][...]) - before
  moved = np.abs(delta) > 1e-9
  assert moved.any()
  np.testing.assert_allclose(np.abs(delta[moved]), lr, rtol=1e-3)
  assert "entropy" not in m


@pytest.mark.slow
def test_dropped_and_truncated_episodes_leave_the_denominator():
  """drop_no_spread_groups / mask_truncated equal removing those episodes."""
  model, batch, logp = fixed_logits_case(7)
  r = np.asarray(batch.traj_reward).copy()
  r[:4] = 1.0  # group 0: no trajectory spread ...
  batch = batch.replace(
      traj_reward=jnp.asarray(r),
      step_reward=batch.step_reward.at[:4].set(0.0),   # ... nor step spread
      phase_reward=batch.phase_reward.at[:4].set(0.0),  # ... nor phase spread
      truncated=jnp.asarray([False] * 5 + [True] + [False] * 2))
  cfg = grpo.GRPOConfig(drop_no_spread_groups=True, mask_truncated=True)
  loss, m = grpo.grpo_loss(model, batch, cfg)
  np.testing.assert_allclose(float(m["dropped_episode_frac"]), 0.5)
  # Same as zeroing the loss mask of episodes 0-3 (flat group) and 5
  # (truncated) by hand: they leave the token-mean denominator.
  keep = np.array([0, 0, 0, 0, 1, 0, 1, 1], np.float32)
  by_hand = batch.replace(loss_mask=batch.loss_mask * keep[:, None])
  want, _ = grpo.grpo_loss(model, by_hand, grpo.GRPOConfig())
  np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
  # And traj-only against numpy, where group 0 is dropped by hand.
  loss_t, _ = grpo.grpo_loss(model, batch, grpo.GRPOConfig(
      levels=("traj",), drop_no_spread_groups=True, mask_truncated=True))
  want_t, _ = np_plain_grpo(logp, by_hand, 0.2, 0.2)
  np.testing.assert_allclose(float(loss_t), want_t, rtol=1e-5)


def test_eval_steps_match_the_losses():
  model, batch, logp = fixed_logits_case(8)
  mesh = mesh_of((2, 2, 2))
  graphdef, state = nnx.split(model)
  cfg = grpo.GRPOConfig(levels=("traj",))
  m = grpo.make_eval_step(graphdef, cfg, mesh)(state, batch)
  want, _ = np_plain_grpo(logp, batch, 0.2, 0.2)
  np.testing.assert_allclose(float(m["loss"]), want, rtol=1e-5)
  m = sft.make_sft_eval_step(graphdef, mesh)(
      state, {"tokens": batch.tokens, "loss_mask": batch.loss_mask,
              "attention_mask": batch.attention_mask})
  mask = np.asarray(batch.loss_mask).copy()
  mask[:, 0] = 0
  np.testing.assert_allclose(float(m["loss"]),
                             -(logp * mask).sum() / mask.sum(), rtol=1e-5)


@pytest.mark.slow
def test_train_step_with_reference_model_state():
  """beta > 0 without batch ref_logprobs: the frozen ref_state is used."""
  mesh = mesh_of((2, 2, 2))
  graphdef, state = nnx.split(make_tiny(3))
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=0.05,
                                                   warmup_steps=0))
  state, opt_state = ts.shard_train_state(state, optimizer, mesh, RULES)
  ref_state = jax.tree.map(jnp.copy, state)  # not donated with `state`
  step = grpo.make_train_step(graphdef, optimizer, grpo.GRPOConfig(beta=0.1),
                              mesh)
  kls = []
  for i in range(2):
    batch = make_batch(20 + i, with_ref=False)
    state, opt_state, m = step(state, opt_state, batch, jax.random.key(i),
                               ref_state=ref_state)
    kls.append(float(m["kl"]))
  # Policy == reference before the first update; they differ after it.
  assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[1] > 1e-6


def test_temperature_divides_the_logits():
  model, batch, _ = fixed_logits_case(9)
  logits = np.asarray(model.logits[...])
  logp_hot = np_logprobs(logits / 0.7, np.asarray(batch.tokens))
  loss, _ = grpo.grpo_loss(model, batch, grpo.GRPOConfig(levels=("traj",),
                                                         temperature=0.7))
  want, _ = np_plain_grpo(logp_hot, batch, 0.2, 0.2)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_configs_from_config_dicts():
  cfg = config_utils.config_from_mapping(grpo.GRPOConfig, ml_collections.ConfigDict(
      {"levels": ["traj", "step"], "beta": 0.1, "level_weights":
       [[1, 0, 0], [1, 0, 1], [1, 0, 0]]}))
  assert cfg.levels == ("traj", "step") and cfg.level_weights[1] == (1, 0, 1)
  with pytest.raises(ValueError, match="aggregation"):
    grpo.GRPOConfig(aggregation="sum")
  with pytest.raises(ValueError, match="levels"):
    grpo.GRPOConfig(levels=("trajectory",))
  opt = optim.make_optimizer(ml_collections.ConfigDict({"learning_rate": 1e-3}))
  assert opt.init({"w": jnp.ones((2, 2))}) is not None


def run_qwen3_steps(mesh, n_steps=2, **overrides):
  """GRPO steps of the tiny Qwen3 preset, placed like the trainer does."""
  cfg = qwen3.Qwen3Config.preset("tiny", **overrides)
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  shd.set_sharding_ctx(model, mesh)
  graphdef, state = nnx.split(model)
  optimizer = optim.make_optimizer(optim.OptimizerConfig(
      learning_rate=1e-3, warmup_steps=0, max_grad_norm=1.0))
  state, opt_state = ts.shard_train_state(state, optimizer, mesh)
  step = grpo.make_train_step(graphdef, optimizer, grpo.GRPOConfig(
      beta=0.02, num_micro_batches=2), mesh)
  metrics = []
  for i in range(n_steps):
    batch = batch_lib.synthetic_batch(30 + i, batch_size=B, seq_len=32,
                                      num_steps=S, num_phases=P,
                                      group_size=4,
                                      vocab_size=cfg.vocab_size)
    state, opt_state, m = step(state, opt_state, batch, jax.random.key(i))
    metrics.append(jax.device_get(m))
  return jax.tree.map(np.asarray, ts.split_params(state)[0]), metrics, state


@pytest.mark.slow
def test_qwen3_step_on_2x2x2_mesh_matches_one_device():
  p1, m1, _ = run_qwen3_steps(mesh_of((1, 1, 1)))
  p8, m8, state8 = run_qwen3_steps(mesh_of((2, 2, 2)))
  for a, b in zip(m1, m8):
    for k in ("loss", "grad_norm", "clip_frac", "kl", "entropy"):
      np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=k)
  assert_trees_close(p1, p8, 1e-4)
  shardings = [x.sharding for x in jax.tree.leaves(state8)]
  assert any(not s.is_fully_replicated for s in shardings)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(1, 1, 1), (2, 2, 2)])
def test_logits_capacity_gives_the_same_grpo_steps(mesh_shape):
  """`model.logits_capacity`: the head at the policy tokens only, same update.

  The capacity is set just above the fullest row's share of policy tokens in
  these batches, so the gathered branch runs (not the fallback).
  """
  rows = [batch_lib.synthetic_batch(30 + i, batch_size=B, seq_len=32,
                                    num_steps=S, num_phases=P, group_size=4,
                                    vocab_size=qwen3.Qwen3Config.preset("tiny").vocab_size)
          for i in range(2)]
  share = max(float(np.max(np.asarray(grpo.valid_tokens(b))[:, 1:].sum(1))) / 31
              for b in rows)
  capacity = min(share + 0.05, 0.95)
  assert logprobs.compact_width(capacity, 31) < 31, share
  mesh = mesh_of(mesh_shape)
  p0, m0, _ = run_qwen3_steps(mesh)
  p1, m1, _ = run_qwen3_steps(mesh, logits_capacity=capacity)
  for a, b in zip(m0, m1):
    for k in ("loss", "grad_norm", "clip_frac", "kl", "entropy"):
      np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7, err_msg=k)
  assert_trees_close(p0, p1, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("with_ref,mesh_shape", [(True, (1, 1, 1)), (False, (1, 1, 1)),
                                                 (True, (2, 2, 2))])
def test_length_sorted_micro_batches_equal_the_scan_step(with_ref, mesh_shape):
  """`grpo.make_train_step(..., lengths=...)`: rows sorted by length, each
  micro-batch padded to its own length, gives the scan step's update (two
  steps of a tiny Qwen3; without ref_logprobs the KL reference is a model)."""
  mesh = mesh_of(mesh_shape)
  cfg = qwen3.Qwen3Config.preset("tiny")
  gcfg = grpo.GRPOConfig(beta=0.02, num_micro_batches=2)
  batches = [batch_lib.synthetic_batch(40 + i, batch_size=B, seq_len=48, num_steps=S,
                                       num_phases=P, group_size=4, vocab_size=cfg.vocab_size,
                                       with_ref=with_ref) for i in range(2)]
  lens = np.asarray(batches[0].seq_len)
  assert lens.min() < 24 < lens.max()   # rows of unequal length, or this proves nothing

  def run(lengths):
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
    shd.set_sharding_ctx(model, mesh)
    graphdef, state = nnx.split(model)
    ref_state = None if with_ref else jax.tree.map(jnp.copy, state)
    optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-3, warmup_steps=0))
    state, opt_state = ts.shard_train_state(state, optimizer, mesh)
    step = grpo.make_train_step(graphdef, optimizer, gcfg, mesh, lengths=lengths)
    out = []
    for i, batch in enumerate(batches):
      state, opt_state, m = step(state, opt_state, batch, jax.random.key(i),
                                 ref_state=ref_state)
      out.append(jax.device_get(m))
    return jax.tree.map(np.asarray, ts.split_params(state)[0]), out

  p_scan, m_scan = run(())
  p_sort, m_sort = run((16, 32, 48))
  for a, b in zip(m_scan, m_sort):
    for k in ("loss", "grad_norm", "kl", "clip_frac", "adv/traj_std", "num_tokens"):
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, atol=1e-7, err_msg=k)
  assert 0 < m_sort[0]["padded_tokens"] < B * 48
  assert_trees_close(p_scan, p_sort, 2e-5)
