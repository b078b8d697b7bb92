"""Episode bookkeeping: segments mirror `toolenv.rewards.segments`; packing."""

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.paraact import episode as ep
from toolenv import rewards as rw
from toolenv.schema import EpisodeRewards

_CODE = {"explore": batch_lib.PHASE_EXPLORE, "execute": batch_lib.PHASE_EXECUTE}


def _ours(phases):
  buf = ep.EpisodeBuffer()
  segs = [buf.begin_step(p)[1] for p in phases]
  return buf, segs


def _reference(phases):
  """Segment index of each step from the env's (first, last) runs."""
  runs = rw.segments(phases)
  out = [-1] * len(phases)
  for k, (_, a, b) in enumerate(runs):
    for s in range(a, b + 1):
      if phases[s] != "answer":
        out[s] = k
  return runs, out


def test_hand_worked_segments():
  phases = [None, "explore", "explore", None, "execute", "execute", "explore", "answer"]
  buf, segs = _ours(phases)
  # The leading malformed step has no run to join; the one at 3 joins explore.
  assert segs == [-1, 0, 0, 0, 1, 1, 2, -1]
  assert buf.segment_types == [batch_lib.PHASE_EXPLORE, batch_lib.PHASE_EXECUTE, batch_lib.PHASE_EXPLORE]
  assert buf.step_phases[0] == "invalid"


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(["explore", "execute", "answer", None]),
                           max_size=14))
def test_segments_match_env_reference(phases):
  buf, segs = _ours(phases)
  runs, ref = _reference(phases)
  assert [_CODE[r[0]] for r in runs] == buf.segment_types
  # Steps inside a run get its index; only invalid steps outside runs and
  # answers get -1 (the env's runs cover an invalid step only if it joins).
  for s, p in enumerate(phases):
    if p in ("explore", "execute"):
      assert segs[s] == ref[s]
    elif p == "answer":
      assert segs[s] == -1
    else:
      in_run = any(a <= s <= b for _, a, b in runs)
      assert (segs[s] >= 0) == in_run
      if in_run:
        assert segs[s] == ref[s]


def _rewards(step, phase, trajectory=0.0):
  return EpisodeRewards(step=step, phase=phase, trajectory=trajectory, success=False,
                        turns=len(step), truncated=False, completed=0, nodes=1)


def test_pack_hand_worked():
  buf = ep.EpisodeBuffer()
  buf.add_context([5, 6, 7])
  s, g = buf.begin_step("explore")
  buf.add_policy([10, 11], [-0.5, -0.25], [batch_lib.KIND_PLAN, batch_lib.KIND_ACTION], s, g)
  buf.add_context([8])
  s, g = buf.begin_step("execute")
  buf.add_policy([12], [-1.0], [batch_lib.KIND_ACTION], s, g)
  s, g = buf.begin_step("answer")
  buf.add_policy([13, 14], [-2.0, -3.0], [batch_lib.KIND_ANSWER, batch_lib.KIND_ANSWER], s, g)
  rew = _rewards(step=(0.4, 0.2, 0.1), phase=(("explore", 0.5), ("execute", 1.0)),
                 trajectory=1.05)
  out = ep.pack_episodes([buf], [rew], [0], max_len=12, max_steps=4, max_phases=3, pad_id=1)
  np.testing.assert_array_equal(out["tokens"][0], [5, 6, 7, 10, 11, 8, 12, 13, 14, 1, 1, 1])
  np.testing.assert_array_equal(out["loss_mask"][0], [0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0])
  np.testing.assert_allclose(out["old_logprobs"][0, 3:9], [-0.5, -0.25, 0, -1, -2, -3])
  np.testing.assert_array_equal(out["step_id"][0, [3, 4, 6, 7, 8]], [0, 0, 1, 2, 2])
  np.testing.assert_array_equal(out["phase_id"][0, [3, 4, 6]], [0, 0, 1])
  np.testing.assert_array_equal(out["token_kind"][0, :9], [3, 3, 3, 0, 1, 3, 1, 2, 2])
  # The answer step is trajectory-only: masked out of the step level.
  np.testing.assert_allclose(out["step_reward"][0], [0.4, 0.2, 0, 0])
  np.testing.assert_array_equal(out["step_mask"][0], [1, 1, 0, 0])
  np.testing.assert_array_equal(out["step_phase_type"][0, :2], [0, 1])
  np.testing.assert_allclose(out["phase_reward"][0], [0.5, 1.0, 0])
  np.testing.assert_array_equal(out["phase_mask"][0], [1, 1, 0])
  np.testing.assert_array_equal(out["phase_type"][0, :2], [0, 1])
  assert out["seq_len"][0] == 9 and out["attention_mask"][0].sum() == 9
  assert out["traj_reward"][0] == pytest.approx(1.05)


def test_pack_rejects_misaligned_phases():
  buf = ep.EpisodeBuffer()
  s, g = buf.begin_step("explore")
  buf.add_policy([1], [0.0], [0], s, g)
  with pytest.raises(ValueError, match="phase segments differ"):
    ep.pack_episodes([buf], [_rewards(step=(0.1,), phase=(("execute", 0.0),))], [0],
                     max_len=4, max_steps=2, max_phases=2)


def test_add_policy_length_check():
  with pytest.raises(ValueError):
    ep.EpisodeBuffer().add_policy([1, 2], [0.0], [0, 0], 0, 0)
