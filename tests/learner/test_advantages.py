"""Multi-level advantages against an independent numpy re-derivation.

The reference below loops over groups, phase types, segments and tokens in
float64, straight from the formulas of issue 7; it shares no code with
`paraagent_jax.learner.advantages`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paraagent_jax.learner import advantages as adv_lib
from paraagent_jax.learner import batch as batch_lib

W_DEFAULT = np.array([[1, 1, 0], [1, 0, 1], [1, 0, 0]], np.float64)


def _ref_norm(values, eps, normalize):
  """Population-std normalisation of one group; no spread -> zeros."""
  v = np.asarray(values, np.float64)
  if v.size < 2 or v.max() == v.min():
    return np.zeros_like(v)
  c = v - v.mean()
  return c / (v.std() + eps) if normalize == "mean_std" else c


def ref_token_advantages(d, weights, eps, normalize,
                         levels=("traj", "phase", "step")):
  """Loops over everything; returns (token [B,T], traj, phase, step)."""
  b, t = d["loss_mask"].shape
  s, p = d["step_reward"].shape[1], d["phase_reward"].shape[1]
  a_traj = np.zeros(b)
  a_phase = np.zeros((b, p))
  a_step = np.zeros((b, s))
  for g in set(d["group_id"].tolist()):
    members = [i for i in range(b) if d["group_id"][i] == g]
    a_traj[members] = _ref_norm(d["traj_reward"][members], eps, normalize)
    for ptype in (0, 1):
      cells = [(i, j) for i in members for j in range(p)
               if d["phase_mask"][i, j] > 0 and d["phase_type"][i, j] == ptype]
      vals = _ref_norm([d["phase_reward"][c] for c in cells], eps, normalize)
      for c, v in zip(cells, vals):
        a_phase[c] = v
      cells = [(i, j) for i in members for j in range(s)
               if d["step_mask"][i, j] > 0
               and d["step_phase_type"][i, j] == ptype]
      vals = _ref_norm([d["step_reward"][c] for c in cells], eps, normalize)
      for c, v in zip(cells, vals):
        a_step[c] = v
  on = [lvl in levels for lvl in ("traj", "phase", "step")]
  token = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      if d["loss_mask"][i, j] == 0:
        continue
      k = d["token_kind"][i, j]
      if k > 2:
        continue
      pid = min(max(d["phase_id"][i, j], 0), p - 1)
      sid = min(max(d["step_id"][i, j], 0), s - 1)
      terms = (a_traj[i], a_phase[i, pid], a_step[i, sid])
      token[i, j] = sum(weights[k, lvl] * terms[lvl]
                        for lvl in range(3) if on[lvl])
  return token, a_traj, a_phase, a_step


def random_inputs(seed, b=12, t=20, s=5, p=3):
  """Fully random arrays with the awkward cases the issue lists."""
  rng = np.random.default_rng(seed)
  d = {
      "traj_reward": rng.normal(size=b).round(1),
      # Unsorted group ids with a group of one (id 5) and an unused id.
      "group_id": rng.permutation(np.array([0, 0, 0, 2, 2, 2, 2, 5, 7, 7, 3,
                                            3][:b])),
      "step_reward": rng.normal(size=(b, s)).round(1),
      "step_mask": (rng.uniform(size=(b, s)) < 0.7).astype(np.float32),
      "step_phase_type": rng.integers(0, 2, (b, s)),
      "phase_reward": rng.normal(size=(b, p)).round(1),
      "phase_mask": (rng.uniform(size=(b, p)) < 0.6).astype(np.float32),
      "phase_type": rng.integers(0, 2, (b, p)),
      "step_id": rng.integers(-2, s + 2, (b, t)),
      "phase_id": rng.integers(-2, p + 2, (b, t)),
      "token_kind": rng.integers(0, 4, (b, t)),
      "loss_mask": (rng.uniform(size=(b, t)) < 0.6).astype(np.float32),
  }
  d["phase_mask"][0] = 0.0  # an episode without any phase segment
  d["step_mask"][1] = 0.0
  d["loss_mask"][:, t - 4:] = 0.0  # padding
  members = np.flatnonzero(d["group_id"] == 2)
  d["traj_reward"][members] = 0.5  # all-equal rewards in a group
  d["step_reward"][members] = -1.0
  return d


def _jax_inputs(d):
  ints = ("group_id", "step_phase_type", "phase_type", "step_id", "phase_id",
          "token_kind")
  return {k: jnp.asarray(v, jnp.int32 if k in ints else jnp.float32)
          for k, v in d.items()}


@pytest.mark.slow
@pytest.mark.parametrize("normalize", ["mean_std", "mean"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_numpy_reference(seed, normalize):
  d = random_inputs(seed)
  weights = np.random.default_rng(100 + seed).uniform(-1, 2, (3, 3))
  want, w_traj, w_phase, w_step = ref_token_advantages(d, weights, 1e-6,
                                                       normalize)
  fn = jax.jit(adv_lib.token_advantages, static_argnames=("normalize",))
  got = fn(**_jax_inputs(d), level_weights=jnp.asarray(weights),
           normalize=normalize)
  assert got.shape == want.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
  full = adv_lib.compute_advantages(**_jax_inputs(d), level_weights=weights,
                                    normalize=normalize)
  np.testing.assert_allclose(full.traj, w_traj, atol=1e-5)
  np.testing.assert_allclose(full.phase, w_phase, atol=1e-5)
  np.testing.assert_allclose(full.step, w_step, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("levels", [("traj",), ("phase", "step"), ("step",)])
def test_level_ablation_matches_reference(levels):
  d = random_inputs(3)
  want = ref_token_advantages(d, W_DEFAULT, 1e-6, "mean_std", levels)[0]
  got = adv_lib.token_advantages(**_jax_inputs(d), level_weights=W_DEFAULT,
                                 levels=levels)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_traj_only_is_plain_grpo():
  """Every policy token of an episode gets its group-normalised reward."""
  d = random_inputs(4)
  d["token_kind"] = np.minimum(d["token_kind"], 2)
  got = np.asarray(adv_lib.token_advantages(
      **_jax_inputs(d), level_weights=W_DEFAULT, levels=("traj",)))
  for i in range(len(d["group_id"])):
    r = d["traj_reward"][d["group_id"] == d["group_id"][i]]
    a = 0.0 if r.max() == r.min() else (
        (d["traj_reward"][i] - r.mean()) / (r.std() + 1e-6))
    np.testing.assert_allclose(got[i], a * d["loss_mask"][i], atol=1e-5)


def _hand_example():
  """Two episodes, one group; see the comments for the worked numbers."""
  env, plan, act, ans = 3, 0, 1, 2
  return {
      "traj_reward": np.array([1.0, 0.0]),          # A_traj = [1, -1]
      "group_id": np.array([0, 0]),
      # explore steps [1, 0] -> [1, -1]; execute steps [3, 1, 2] ->
      # [+-sqrt(3/2), 0].
      "step_reward": np.array([[1.0, 3.0, 0.0], [0.0, 1.0, 2.0]]),
      "step_mask": np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
      "step_phase_type": np.array([[0, 1, 0], [0, 1, 1]]),
      # explore phases [2, 0] -> [1, -1]; execute [1, 1] -> no spread, 0.
      "phase_reward": np.array([[2.0, 1.0], [0.0, 1.0]]),
      "phase_mask": np.ones((2, 2)),
      "phase_type": np.array([[0, 1], [0, 1]]),
      "step_id": np.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 2]]),
      "phase_id": np.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]),
      "token_kind": np.array([[env, plan, act, plan, act, ans],
                              [env, plan, act, env, act, act]]),
      "loss_mask": np.array([[0, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 1.0]]),
  }


@pytest.mark.slow
def test_hand_worked_example():
  d = _hand_example()
  r = np.sqrt(1.5)
  cases = {
      ("mean_std", ("traj", "phase", "step")):
          [[0, 2, 2, 1, 1 + r, 1], [0, -2, -2, 0, -1 - r, -1]],
      ("mean_std", ("traj",)):
          [[0, 1, 1, 1, 1, 1], [0, -1, -1, 0, -1, -1]],
      ("mean", ("traj", "phase", "step")):
          [[0, 1.5, 1, .5, 1.5, .5], [0, -1.5, -1, 0, -1.5, -.5]],
  }
  for (normalize, levels), want in cases.items():
    got = adv_lib.token_advantages(**_jax_inputs(d), level_weights=W_DEFAULT,
                                   eps=0.0, normalize=normalize, levels=levels)
    np.testing.assert_allclose(np.asarray(got), np.array(want), atol=1e-6,
                               err_msg=f"{normalize} {levels}")


@pytest.mark.slow
def test_synthetic_batch_matches_reference():
  b = batch_lib.synthetic_batch(7, batch_size=8, seq_len=48, num_steps=6,
                                num_phases=4, group_size=4, vocab_size=32)
  batch_lib.validate_batch(b)
  names = ("traj_reward", "group_id", "step_reward", "step_mask",
           "step_phase_type", "phase_reward", "phase_mask", "phase_type",
           "step_id", "phase_id", "token_kind", "loss_mask")
  d = {k: np.asarray(getattr(b, k)) for k in names}
  want = ref_token_advantages(d, W_DEFAULT, 1e-6, "mean_std")[0]
  got = adv_lib.token_advantages(**{k: getattr(b, k) for k in names},
                                 level_weights=W_DEFAULT)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
  assert np.abs(want).sum() > 0  # the case is not trivially all zero


def test_metrics_against_numpy():
  d = random_inputs(5)
  adv = adv_lib.compute_advantages(**_jax_inputs(d), level_weights=W_DEFAULT)
  m = adv_lib.advantage_metrics(adv, loss_mask=d["loss_mask"],
                                step_mask=d["step_mask"],
                                phase_mask=d["phase_mask"])
  _, _, a_phase, a_step = ref_token_advantages(d, W_DEFAULT, 1e-6, "mean_std")
  valid = a_step[d["step_mask"] > 0]
  np.testing.assert_allclose(m["adv/step_mean"], valid.mean(), atol=1e-5)
  np.testing.assert_allclose(m["adv/step_std"], valid.std(), atol=1e-5)
  valid = a_phase[d["phase_mask"] > 0]
  np.testing.assert_allclose(m["adv/phase_std"], valid.std(), atol=1e-5)


def test_drop_no_spread_groups():
  d = random_inputs(6)
  b = len(d["group_id"])
  # Group 2 and the singleton group 5 get no spread anywhere.
  for g in (2, 5):
    m = d["group_id"] == g
    d["traj_reward"][m] = 1.0
    d["step_reward"][m] = 0.25
    d["phase_reward"][m] = -3.0
  tb = batch_lib.synthetic_batch(0, batch_size=b, seq_len=20, num_steps=5,
                                 num_phases=3, group_size=1, vocab_size=8)
  tb = tb.replace(**{k: v for k, v in _jax_inputs(d).items()
                     if k in ("traj_reward", "group_id", "step_reward",
                              "step_mask", "step_phase_type", "phase_reward",
                              "phase_mask", "phase_type")})
  out, keep = jax.jit(batch_lib.drop_no_spread_groups)(tb)
  want = ~np.isin(d["group_id"], [2, 5])
  np.testing.assert_array_equal(np.asarray(keep), want)
  np.testing.assert_array_equal(np.asarray(out.loss_mask)[~want], 0.0)
  np.testing.assert_array_equal(np.asarray(out.loss_mask)[want],
                                np.asarray(tb.loss_mask)[want])


def test_token_budget_keeps_whole_groups():
  seq_len = jnp.asarray([10, 20, 5, 5, 30, 1], jnp.int32)
  group_id = jnp.asarray([1, 0, 1, 0, 2, 2], jnp.int32)
  # group 0: 25 tokens, group 1: 15 (cumulative 40), group 2: 31 (71).
  keep = batch_lib.token_budget_keep(seq_len, group_id, 45)
  np.testing.assert_array_equal(np.asarray(keep),
                                [True, True, True, True, False, False])
  keep = batch_lib.token_budget_keep(seq_len, group_id, 24)
  assert not np.asarray(keep).any()


def test_bad_options_raise():
  d = _jax_inputs(random_inputs(0))
  with pytest.raises(ValueError, match="levels"):
    adv_lib.token_advantages(**d, level_weights=W_DEFAULT, levels=("tarj",))
  with pytest.raises(ValueError, match="normalize"):
    adv_lib.token_advantages(**d, level_weights=W_DEFAULT, normalize="std")
