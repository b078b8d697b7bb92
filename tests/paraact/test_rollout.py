"""Rollouts: the oracle through the text path, and a random tiny model's batch.

The oracle checks the protocol end to end (render -> tokenise -> parse -> env);
the tiny model checks the `TrajectoryBatch` against independent references:
the env's own phase segmentation, a fresh full forward pass for log-probs, and
the token ids of the conversation rendered by `tokenizer.render_messages`.
"""

import collections

from flax import nnx
import jax
import numpy as np
import pytest

import toolenv
from toolenv import rewards as rw
from toolenv.catalog import procedural
from paraagent_jax import tokenizer as T
from paraagent_jax.models import qwen3
from paraagent_jax.paraact import chat_format, episode as ep, policies, protocol, rollout


@pytest.fixture(scope="module")
def catalog():
  return procedural.build_catalog(seed=0, size=3000)


@pytest.fixture(scope="module")
def gen(catalog):
  return toolenv.TaskGenerator(catalog, seed=0)


@pytest.fixture(scope="module")
def tok(gen):
  texts = [protocol.system_prompt()] * 10
  for strat in toolenv.oracle.STRATEGIES:
    fmt_strategy = chat_format.strategies.get_strategy(strat)
    for task in gen.generate(10, "train"):
      texts.append(task.instruction)
      texts += [fmt_strategy.render_step(s) for s in toolenv.oracle.solve(task, strat)]
  return T.train_bpe_tokenizer(texts, vocab_size=512)


def _run(catalog, tasks, fmt, strat, policy, config):
  env = toolenv.VectorToolEnv(catalog, len(tasks), **toolenv.oracle.env_options(strat))
  return env, rollout.run_rollout(policy, env, tasks, fmt, config)


def _check_env_alignment(env, result):
  """Our segments vs the env's own log (rewards.segments as the reference)."""
  for i, buf in enumerate(result.buffers):
    log_phases = [e["phase"] for e in env.envs[i].log]
    assert len(log_phases) == len(buf.step_phases)
    runs = rw.segments(log_phases)
    assert [ep.PHASE_CODES[r[0]] for r in runs] == buf.segment_types
    assert [p for p, _ in env.rewards(i).phase] == [r[0] for r in runs]


@pytest.mark.parametrize("strat", toolenv.oracle.STRATEGIES)
def test_oracle_solves_every_kind(catalog, gen, tok, strat):
  fmt = chat_format.ChatFormat(tok, strat)
  config = rollout.RolloutConfig(max_turns=16, max_len=8192, max_obs_tokens=2000)
  for split in ("train", "test"):
    tasks = gen.generate(40, split)
    env, res = _run(catalog, tasks, fmt, strat, policies.OraclePolicy(fmt, strat), config)
    by_kind = collections.defaultdict(list)
    for e in res.episodes:
      by_kind[e["kind"]].append(e["success"])
      assert e["parse_errors"] == 0 and not e["truncated"]
    assert set(by_kind) == set(toolenv.tasks.KINDS)
    assert all(all(v) for v in by_kind.values()), {k: np.mean(v) for k, v in by_kind.items()}
    _check_env_alignment(env, res)
    # The trained tokens are the oracle's steps exactly, parsed back unchanged.
    i = 3
    want = [fmt.render(s) for s in toolenv.oracle.solve(tasks[i], strat)]
    got = res.arrays["tokens"][i][res.arrays["loss_mask"][i] > 0]
    assert fmt.decode(got) == "".join(want)
  if strat == "react":
    assert all(c <= 1 for e in res.episodes for c in e["calls_per_step"])


def test_episode_ids_equal_rendered_conversation(catalog, gen, tok):
  fmt = chat_format.ChatFormat(tok, "paraact")
  tasks = gen.generate(5, "train")
  config = rollout.RolloutConfig(max_turns=16, max_len=8192, max_obs_tokens=10_000)
  env = toolenv.VectorToolEnv(catalog, len(tasks))
  first = env.reset(tasks)
  res = rollout.run_rollout(policies.OraclePolicy(fmt), env, tasks, fmt, config)
  # Re-run the env by hand to get the observations, then render the whole
  # conversation with render_messages (the Jinja template's twin).
  env2 = toolenv.VectorToolEnv(catalog, 1)
  for i, task in enumerate(tasks):
    obs0 = env2.reset([task])[0]
    assert obs0 == first[i]
    turns = []
    for step in toolenv.oracle.solve(task, "paraact"):
      r = env2.step([step])[0]
      turns.append((fmt.render(step), None if r.done else protocol.render_observation(r.observation)))
    text = fmt.episode_text(obs0, turns)
    n = res.arrays["seq_len"][i]
    assert list(res.arrays["tokens"][i, :n]) == fmt.encode(text)


class _JunkThenOracle(policies.OraclePolicy):
  """Writes malformed text on turns 0 and 2, then follows the oracle."""

  def act(self, requests):
    out = []
    for r in requests:
      if self._turn[r.episode] in (0, 2) and not getattr(self, "_junked", {}).get((r.episode, self._turn[r.episode])):
        self.__dict__.setdefault("_junked", {})[(r.episode, self._turn[r.episode])] = True
        text = '<explore> hmm <call>{"name": "search_tools", "argum'
        ids = self.fmt.encode(text)
        out.append(policies.TurnOutput(ids, [0.0] * len(ids), text))
      else:
        out.extend(super().act([r]))
    return out


def test_malformed_steps_align_with_env(catalog, gen, tok):
  fmt = chat_format.ChatFormat(tok, "paraact")
  tasks = gen.generate(5, "train")
  config = rollout.RolloutConfig(max_turns=20, max_len=8192, max_obs_tokens=500)
  env, res = _run(catalog, tasks, fmt, "paraact", _JunkThenOracle(fmt), config)
  _check_env_alignment(env, res)
  assert all(e["parse_errors"] == 2 for e in res.episodes)
  # The first (malformed) step belongs to no segment but keeps its penalty.
  assert all(b.step_segment[0] == -1 for b in res.buffers)
  np.testing.assert_allclose(res.arrays["step_reward"][:, 0], -rw.RewardConfig().malformed)
  assert res.arrays["step_mask"][:, 0].min() == 1


class _Recording(policies.JaxPolicy):
  """Remembers what it sampled, to check the batch against."""

  def reset(self, num_episodes, tasks, seed=0):
    super().reset(num_episodes, tasks, seed)
    self.sampled = [[] for _ in range(num_episodes)]

  def act(self, requests):
    outs = super().act(requests)
    for r, o in zip(requests, outs):
      self.sampled[r.episode].append(list(o.token_ids))
    return outs


# Both model tests share batch size and cache length, so they share compiled
# sampler programs; a short system prompt keeps the tiny model's context short.
_B, _MAX_LEN, _TURN = 4, 384, 16
_SYSTEM = "Solve the task with tools. <explore> ... <call>{...}</call> </step>"


def _tiny(tok, seed):
  cfg = qwen3.Qwen3Config.preset("tiny", vocab_size=len(tok))
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed))


@pytest.mark.slow
def test_tiny_model_batch_is_consistent(catalog, gen, tok):
  model = _tiny(tok, 0)
  fmt = chat_format.ChatFormat(tok, "paraact", system_prompt=_SYSTEM)
  tasks = [t for t in gen.generate(_B // 2, "train") for _ in range(2)]  # groups of 2
  max_len = _MAX_LEN
  config = rollout.RolloutConfig(max_turns=3, max_turn_tokens=_TURN, max_len=max_len,
                                 max_obs_tokens=24)
  policy = _Recording(model, fmt, max_len=max_len, max_turn_tokens=_TURN, temperature=1.0)
  env = toolenv.VectorToolEnv(catalog, len(tasks))
  res = rollout.run_rollout(policy, env, tasks, fmt, config, group_ids=[0, 0, 1, 1])
  a = res.arrays
  _check_env_alignment(env, res)
  closing = 0
  for i, buf in enumerate(res.buffers):
    n = a["seq_len"][i]
    mask = a["loss_mask"][i, :n] > 0
    # loss_mask is 1 exactly on the sampled tokens, in order.
    assert list(a["tokens"][i, :n][mask]) == [t for turn in policy.sampled[i] for t in turn]
    assert a["loss_mask"][i, n:].sum() == 0 and not mask[0]
    sid = a["step_id"][i, :n][mask]
    assert np.all(np.diff(sid) >= 0) and np.all(np.diff(a["phase_id"][i, :n][mask]) >= 0)
    lens = [len(t) for t in policy.sampled[i]]
    assert list(sid) == [s for s, m in enumerate(lens) for _ in range(m)]
    want_phase = [max(buf.step_segment[s], 0) for s, m in enumerate(lens) for _ in range(m)]
    assert list(a["phase_id"][i, :n][mask]) == want_phase
    assert len(buf.step_phases) == len(env.envs[i].log)
    if buf.done:
      closing += len(fmt.close_ids(policy.sampled[i][-1]))
    assert buf.done or buf.truncated
  # old_logprobs == a fresh full forward pass over the finished sequences.
  logits = model(jax.numpy.asarray(a["tokens"]), attention_mask=jax.numpy.asarray(a["attention_mask"]))
  logp = jax.nn.log_softmax(np.asarray(logits, np.float64)[:, :-1], axis=-1)
  ref = np.take_along_axis(np.asarray(logp), a["tokens"][:, 1:, None], -1)[..., 0]
  m = a["loss_mask"][:, 1:] > 0
  np.testing.assert_allclose(a["old_logprobs"][:, 1:][m], ref[m], atol=1e-4)
  # Every token was prefilled or decoded exactly once (closing glue of
  # finished episodes is never sent to the model).
  st = res.policy_stats
  assert st["prefill_tokens"] + st["decode_tokens"] == a["seq_len"].sum() - closing
  assert st["decode_tokens"] == a["loss_mask"].sum()
  assert list(a["group_id"]) == [0, 0, 1, 1]
  batch = res.trajectory_batch()
  assert batch.shape == (_B, max_len, 3, 3)


@pytest.mark.slow
def test_token_budget_truncates_and_finishes_env(catalog, gen, tok):
  model = _tiny(tok, 1)
  fmt = chat_format.ChatFormat(tok, "paraact", system_prompt=_SYSTEM)
  tasks = gen.generate(_B, "train")
  max_len = _MAX_LEN
  # Observations of up to 60 tokens: the cache fills before the 8 turns.
  config = rollout.RolloutConfig(max_turns=8, max_turn_tokens=_TURN, max_len=max_len,
                                 max_obs_tokens=60)
  policy = policies.JaxPolicy(model, fmt, max_len=max_len, max_turn_tokens=_TURN,
                              temperature=1.0)
  env = toolenv.VectorToolEnv(catalog, len(tasks))
  res = rollout.run_rollout(policy, env, tasks, fmt, config)
  for i, buf in enumerate(res.buffers):
    if not buf.done:
      assert buf.truncated and res.arrays["truncated"][i]
      assert env.envs[i].done and env.rewards(i).truncated
    assert len(buf) <= max_len
  assert res.arrays["truncated"].any()
