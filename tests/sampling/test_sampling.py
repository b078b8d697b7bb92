"""Sampler tests against transformers (greedy decoding, forward-pass log-probs).

Tiny random Qwen3 models are made with transformers (torch CPU), saved, and loaded
through `hf_io.load_hf`; every check compares with torch or numpy, or with the
same sampler run in a configuration that must give the same answer (one prompt
alone vs. in a ragged batch, continuation vs. recomputation from scratch).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch   # requirements-test.txt: the reference side
import transformers

from flax import nnx
from paraagent_jax import sampling
from paraagent_jax.models import hf_io
from paraagent_jax.sampling import kv_cache
from paraagent_jax.sampling import programs

# (tie_embeddings, num_kv_heads): GQA ratio 2 with tied embeddings, ratio 1 untied.
CONFIGS = [(True, 2), (False, 4)]
VOCAB = 256


def _hf_model(tie: bool, kv_heads: int, seed: int = 0):
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(
      vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
      head_dim=16, tie_word_embeddings=tie, initializer_range=0.1,
      max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
      pad_token_id=None)
  return transformers.Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="module", params=CONFIGS, ids=["tied_gqa2", "untied_gqa1"])
def models(request, tmp_path_factory):
  """(transformers model, our model loaded from its saved directory)."""
  hf = _hf_model(*request.param)
  path = tmp_path_factory.mktemp("hf")
  hf.save_pretrained(path)
  return hf, hf_io.load_hf(str(path))


def _prompts(seed, lengths):
  rs = np.random.RandomState(seed)
  return [rs.randint(0, VOCAB, n).tolist() for n in lengths]


def _hf_greedy(hf, prompt, n):
  """transformers greedy continuation of one prompt (no EOS: exactly n tokens)."""
  ids = torch.tensor([prompt])
  with torch.no_grad():  # An explicit mask: token 0 is a real token here.
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                      min_new_tokens=n, do_sample=False, pad_token_id=0,
                      eos_token_id=None)
  return out[0, len(prompt):].tolist()


def _hf_logprobs(hf, prompt, generated):
  """Log-probs of `generated` after `prompt` from one full forward pass."""
  with torch.no_grad():
    logits = hf(torch.tensor([prompt + generated])).logits[0].double()
  logp = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
  return logp.gather(-1, torch.tensor(generated)[:, None])[:, 0].numpy()


def _row(out, b):
  return out.tokens[b, :out.lengths[b]].tolist()


def test_token_logprob_equals_log_softmax_at_the_token():
  """The decode loop's per-token log-prob against a numpy log-softmax."""
  rs = np.random.RandomState(0)
  logits = (rs.randn(5, 300) * 20).astype(np.float32)
  logits[1] += 1e4                    # a large shift: still exact after the max
  tok = np.array([0, 299, 17, 150, int(np.argmax(logits[4]))], np.int32)
  got = np.asarray(jax.jit(programs.token_logprob)(logits, tok))
  x = logits.astype(np.float64)
  want = (x - x.max(-1, keepdims=True)
          - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)))
  np.testing.assert_allclose(got, want[np.arange(5), tok], rtol=1e-6, atol=1e-5)
  # Over the first axis (the decode loop's [V, B] logits): the same numbers.
  got_t = np.asarray(jax.jit(programs.token_logprob, static_argnums=2)(
      logits.T, tok, 0))
  np.testing.assert_array_equal(got_t, got)


def test_sampler_copy_agrees_with_the_learners_logprobs():
  """The decode loop's fused `token_logprob` (one position per row) gives the
  numbers `learner.logprobs` gives the losses for the same logits and tokens,
  whole or in chunks from the hidden states."""
  from paraagent_jax.learner import logprobs  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(2)
  b, t, d, v = 3, 9, 16, 300
  h = rs.randn(b, t, d).astype(np.float32)
  w = (rs.randn(d, v) * 3).astype(np.float32)
  tokens = rs.randint(0, v, size=(b, t)).astype(np.int32)
  logits = h @ w
  # The sampler: position t - 1's logits pick token t.
  fused = np.stack([np.asarray(programs.token_logprob(
      jnp.asarray(logits[:, i - 1]), jnp.asarray(tokens[:, i]))) for i in range(1, t)], 1)
  whole = np.asarray(logprobs.logprobs_from_logits(jnp.asarray(logits), jnp.asarray(tokens)))
  chunked = np.asarray(logprobs.logprobs_from_hidden(lambda x: x @ jnp.asarray(w),
                                                     jnp.asarray(h), jnp.asarray(tokens),
                                                     chunk=4))
  assert np.all(whole[:, 0] == 0) and np.all(chunked[:, 0] == 0)
  np.testing.assert_allclose(fused, whole[:, 1:], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(fused, chunked[:, 1:], rtol=1e-5, atol=1e-5)


def test_argmax_is_numpys_first_maximum_and_nan_wins():
  """The decode loop's argmax: ties give the first index, NaN counts as max."""
  rs = np.random.RandomState(1)
  x = rs.randn(6, 4096).astype(np.float32)
  x[1, [7, 4000]] = 50.0                # a tie: the first index wins
  x[2, -1] = 60.0                       # the last index
  x[3, 5] = np.nan                      # NaN wins, as in jnp.argmax
  x[4] = 0.0                            # all equal
  got = np.asarray(jax.jit(programs.argmax)(x))
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(x, axis=-1)))
  np.testing.assert_array_equal(got[:5], [np.argmax(x[0]), 7, 4095, 5, 0])
  assert got.dtype == np.int32
  got_t = np.asarray(jax.jit(programs.argmax, static_argnums=1)(x.T, 0))
  np.testing.assert_array_equal(got_t, got)


@pytest.mark.slow
def test_greedy_tokens_and_logprobs_match_transformers(models):
  hf, model = models
  prompts = _prompts(0, [7, 3, 12, 1])
  out = sampling.generate(model, prompts, max_new_tokens=10)
  assert out.tokens.shape == (4, 10) and out.logprobs.shape == (4, 10)
  np.testing.assert_array_equal(out.lengths, [10, 10, 10, 10])
  assert len({t for b in range(4) for t in _row(out, b)}) > 4  # not degenerate
  for b, prompt in enumerate(prompts):
    assert _row(out, b) == _hf_greedy(hf, prompt, 10)
    np.testing.assert_allclose(out.logprobs[b], _hf_logprobs(hf, prompt, _row(out, b)),
                               atol=1e-4)
  np.testing.assert_array_equal(out.processed_logprobs, 0.0)  # greedy: prob 1


@pytest.mark.slow
def test_ragged_batch_equals_each_prompt_alone(models):
  _, model = models
  prompts = _prompts(1, [2, 9, 5])
  batch = sampling.generate(model, prompts, max_new_tokens=8)
  for b, prompt in enumerate(prompts):
    alone = sampling.generate(model, [prompt], max_new_tokens=8)
    assert _row(batch, b) == _row(alone, 0)
    np.testing.assert_allclose(batch.logprobs[b], alone.logprobs[0], atol=1e-5)


@pytest.mark.slow
def test_continuation_equals_recompute_and_transformers(models):
  hf, model = models
  prompts = _prompts(2, [6, 4, 9])
  obs = _prompts(3, [5, 0, 3])  # row 1 finished: no tokens, excluded
  sampler = sampling.Sampler(model, batch_size=3, max_len=64)
  first = sampler.generate(sampler.prefill(prompts), 6)
  lengths_before = first.state.lengths.copy()
  second = sampler.generate(sampler.append(first.state, obs), 7,
                            active=[True, False, True])
  assert second.lengths.tolist() == [7, 0, 7]
  np.testing.assert_array_equal(second.state.lengths,
                                lengths_before + [5 + 7, 0, 3 + 7])
  for b in (0, 2):
    history = prompts[b] + _row(first, b) + obs[b]
    assert _row(second, b) == _hf_greedy(hf, history, 7)
    np.testing.assert_allclose(second.logprobs[b],
                               _hf_logprobs(hf, history, _row(second, b)),
                               atol=1e-4)
    scratch = sampling.generate(model, [history], max_new_tokens=7)
    assert _row(scratch, 0) == _row(second, b)
    np.testing.assert_allclose(scratch.logprobs[0], second.logprobs[b], atol=1e-5)
  # Generating in two pieces without appending equals one call.
  again = sampler.generate(sampler.prefill(prompts), 3)
  rest = sampler.generate(again.state, 3)
  for b in range(3):
    assert _row(again, b) + _row(rest, b) == _row(first, b)


@pytest.mark.slow
def test_functional_continue_generation(models):
  hf, model = models
  prompts = _prompts(4, [5, 8])
  out = sampling.generate(model, prompts, max_new_tokens=4, max_len=64)
  obs = [[1, 2, 3], []]
  histories = [prompts[0] + _row(out, 0) + obs[0]]
  nxt = sampling.continue_generation(model, out.state, obs, max_new_tokens=5)
  assert nxt.lengths.tolist() == [5, 0]
  assert _row(nxt, 0) == _hf_greedy(hf, histories[0], 5)


def _first_stop(tokens, stop_seqs):
  """Index one past the first completed stop sequence in `tokens` (numpy ref)."""
  for end in range(1, len(tokens) + 1):
    for s in stop_seqs:
      if end >= len(s) and tokens[end - len(s):end] == list(s):
        return end
  return len(tokens)


def test_stop_sequences_and_stop_ids_per_row(models):
  _, model = models
  prompts = _prompts(5, [4, 6, 8])
  free = sampling.generate(model, prompts, max_new_tokens=12)
  rows = [_row(free, b) for b in range(3)]
  # Row 0 stops on a 3-token sequence taken from its own output, row 1 on a
  # single id, row 2 on neither (the sequences do not occur in it).
  seq = rows[0][4:7]
  stop_id = rows[1][5]
  stop_seqs = [seq, [stop_id]]
  out = sampling.generate(model, prompts, max_new_tokens=12,
                          stop_sequences=[seq], stop_token_ids=[stop_id],
                          pad_token_id=-1)
  for b in range(3):
    end = _first_stop(rows[b], stop_seqs)
    assert out.lengths[b] == end
    assert _row(out, b) == rows[b][:end]
    assert np.all(out.tokens[b, end:] == -1)
    np.testing.assert_array_equal(out.logprobs[b, end:], 0.0)
    assert bool(out.stopped[b]) == (end < 12 or rows[b][:end][-1:] == [stop_id]
                                    or rows[b][end - len(seq):end] == seq)
  assert out.lengths[0] <= 7 and out.lengths[1] <= 6


@pytest.mark.slow
def test_sampling_seeded_and_restricted(models):
  hf, model = models
  prompt = _prompts(6, [5])[0]
  prompts = [prompt] * 16
  kw = dict(max_new_tokens=6, temperature=1.5)
  a = sampling.generate(model, prompts, seed=3, **kw)
  b = sampling.generate(model, prompts, seed=3, **kw)
  c = sampling.generate(model, prompts, seed=4, **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)
  assert len({tuple(r) for r in a.tokens.tolist()}) > 1  # rows differ
  # Plain log-probs are still those of a forward pass at temperature 1.
  for r in range(3):
    np.testing.assert_allclose(a.logprobs[r], _hf_logprobs(hf, prompt, _row(a, r)),
                               atol=1e-4)
  # The inverse-CDF draw: seeded, another stream, the same plain log-probs.
  d = sampling.generate(model, prompts, seed=3, draw="inverse_cdf", **kw)
  np.testing.assert_array_equal(
      d.tokens, sampling.generate(model, prompts, seed=3, draw="inverse_cdf", **kw).tokens)
  assert not np.array_equal(d.tokens, a.tokens)
  for r in range(2):
    np.testing.assert_allclose(d.logprobs[r], _hf_logprobs(hf, prompt, _row(d, r)),
                               atol=1e-4)
  # top-k=1 and a tiny top-p are greedy whatever the temperature.
  greedy = sampling.generate(model, [prompt], max_new_tokens=6)
  for extra in (dict(top_k=1), dict(top_p=1e-4)):
    s = sampling.generate(model, [prompt] * 4, seed=5, **kw, **extra)
    for r in range(4):
      assert _row(s, r) == _row(greedy, 0)
  # top-k=3: first tokens among the 3 most likely; processed log-prob is the
  # log of the renormalised tempered top-3 distribution (numpy reference).
  with torch.no_grad():
    logits = hf(torch.tensor([prompt])).logits[0, -1].double().numpy() / 1.5
  top3 = np.argsort(-logits)[:3]
  p3 = np.exp(logits[top3] - logits[top3].max())
  p3 /= p3.sum()
  s = sampling.generate(model, [prompt] * 64, seed=7, top_k=3, **kw)
  firsts = s.tokens[:, 0]
  assert set(firsts.tolist()) <= set(top3.tolist())
  for r in range(64):
    want = np.log(p3[list(top3).index(firsts[r])])
    np.testing.assert_allclose(s.processed_logprobs[r, 0], want, atol=1e-4)


@pytest.mark.parametrize("draw,extra", [("gumbel", {}), ("inverse_cdf", {}),
                                         ("gumbel", {"top_k": 5, "use_top_p": True})])
def test_sample_token_rows_of_a_split_batch_draw_as_in_the_whole_batch(draw, extra):
  """``rows=(offset, total)``: each row's token is the one it gets in the
  whole batch drawn with the same key; alone, the rows are another stream."""
  logits = jnp.asarray(np.random.RandomState(1).randn(8, 300).astype(np.float32) * 3)
  key = jax.random.key(5)
  kw = dict(greedy=False, top_k=0, use_top_p=False, draw=draw)
  kw.update(extra)

  def sample(x, rows=None):
    return np.asarray(jax.jit(lambda x: programs.sample_token(
        x, key, 1.3, 0.9, rows=rows, **kw))(x)[0])

  whole = sample(logits)
  np.testing.assert_array_equal(
      np.concatenate([sample(logits[:3], (0, 8)), sample(logits[3:], (3, 8))]), whole)
  assert not np.array_equal(sample(logits[3:]), whole[3:])
  with pytest.raises(ValueError, match="outside"):
    sample(logits[3:], (4, 8))


@pytest.mark.slow
def test_rows_of_a_split_batch_draw_as_in_the_whole_batch(models):
  """A batch sampled in two halves (``rows``: a rollout split over two
  hosts, one seed) gives each row the tokens it gets in the whole batch,
  over two turns (an append in between); log-probs up to float rounding."""
  _, model = models
  prompts = _prompts(8, [3, 9, 5, 7, 4, 6, 8, 2])
  kw = dict(temperature=1.3, pad_token_id=-1, top_p=0.95)

  def turns(rows, part):
    sampler = sampling.Sampler(model, batch_size=len(part), max_len=64)
    first = sampler.generate(sampler.prefill([prompts[i] for i in part], seed=11), 6,
                             rows=rows, **kw)
    second = sampler.generate(sampler.append(first.state, [[3, 4]] * len(part)), 5,
                              rows=rows, **kw)
    return first, second

  whole = turns(None, range(8))
  halves = [turns((lo, 8), range(lo, lo + 4)) for lo in (0, 4)]
  for t in range(2):
    for name in ("tokens", "lengths"):
      got = np.concatenate([getattr(h[t], name) for h in halves])
      np.testing.assert_array_equal(got, getattr(whole[t], name))
    got = np.concatenate([h[t].logprobs for h in halves])
    np.testing.assert_allclose(got, whole[t].logprobs, atol=1e-5)
  # Halves drawn as whole batches of their own are another stream.
  alone = turns(None, range(4, 8))
  assert not np.array_equal(alone[0].tokens, whole[0].tokens[4:])
  with pytest.raises(ValueError, match="rows"):
    turns((6, 8), range(4))


def _sample_many(logits, n, **kw):
  keys = jax.random.split(jax.random.key(0), n)
  x = jax.numpy.asarray(np.tile(logits, (1, 1)), jax.numpy.float32)
  fn = lambda k: programs.sample_token(x, k, 1.0, kw.get("top_p", 1.0),  # pylint: disable=protected-access
                                  greedy=False, top_k=kw.get("top_k", 0),
                                  use_top_p=kw.get("top_p", 1.0) < 1.0,
                                  draw=kw.get("draw", "gumbel"))
  toks, lps = jax.vmap(fn)(keys)
  return np.asarray(toks)[:, 0], np.asarray(lps)[:, 0]


@pytest.mark.slow
@pytest.mark.parametrize("draw", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("kw,support", [
    (dict(top_k=2), [0, 1]),
    (dict(top_p=0.6), [0, 1]),     # 0.5 < 0.6: the token crossing 0.6 is kept
    (dict(top_p=0.5), [0]),        # 0.5 reaches 0.5: only the first token
    (dict(top_k=3, top_p=0.9), [0, 1, 2]),
    (dict(), [0, 1, 2, 3, 4]),
])
def test_top_k_top_p_support_and_frequencies(kw, support, draw):
  probs = np.array([0.5, 0.25, 0.15, 0.06, 0.04])
  toks, lps = _sample_many(np.log(probs)[None], 4000, draw=draw, **kw)
  assert set(toks.tolist()) == set(support)
  want = probs[support] / probs[support].sum()
  freq = np.array([(toks == t).mean() for t in support])
  # 4000 draws: binomial std <= 0.008, so 0.04 is a 5-sigma bound.
  np.testing.assert_allclose(freq, want, atol=0.04)
  np.testing.assert_allclose(lps, np.log(want[np.searchsorted(support, toks)]),
                             atol=1e-5)


@pytest.mark.slow
def test_inverse_cdf_draw_matches_the_distribution_across_blocks():
  """A vocabulary of 300 (5 blocks of 64, the last one partial) with mass in
  every block, zero-probability entries (-inf) that must never come out, and
  a chi-square test of 20,000 draws against the probabilities."""
  rng = np.random.default_rng(0)
  v = 300
  logits = rng.normal(scale=1.5, size=v)
  logits[rng.choice(v, 40, replace=False)] = -np.inf
  logits[[0, 63, 64, 255, 256, 299]] = [2.0, 2.5, -np.inf, 3.0, 1.0, 2.2]
  p = np.exp(logits - logits[np.isfinite(logits)].max())
  p /= p.sum()
  x = jax.numpy.asarray(np.tile(logits, (4, 1)), jax.numpy.float32)
  keys = jax.random.split(jax.random.key(1), 5000)
  toks = np.asarray(jax.vmap(lambda k: programs.inverse_cdf_choice(x, k))(keys))
  toks = toks.reshape(-1)
  assert np.all(p[toks] > 0)                      # never a -inf entry
  counts = np.bincount(toks, minlength=v)
  keep = p * toks.size >= 5                        # chi-square's usual rule
  expect = p[keep] * toks.size
  chi2 = float((((counts[keep] - expect) ** 2) / expect).sum())
  dof = int(keep.sum()) - 1
  # Far above the 99.9% point of chi2(dof) only if the draw is biased.
  assert chi2 < dof + 5 * np.sqrt(2 * dof), (chi2, dof)
  # A one-hot row always gives its entry; a bad draw name is refused.
  one = np.full((2, v), -np.inf, np.float32)
  one[:, 299] = 0.0
  assert np.asarray(programs.inverse_cdf_choice(jax.numpy.asarray(one),
                                                        jax.random.key(3))).tolist() == [299, 299]
  with pytest.raises(ValueError, match="draw"):
    programs.sample_token(x, jax.random.key(0), 1.0, 1.0, greedy=False, top_k=0,
                                  use_top_p=False, draw="nope")


@pytest.mark.slow
def test_bucketing_avoids_recompiles_and_counts_tokens(models):
  _, model = models
  # Only chunk/budget buckets make programs: the cache attention's bound is
  # dynamic, so growing histories compile nothing new (in a cache of one
  # size; a growing cache has programs per size, up to `cache_steps` of them).
  sampler = sampling.Sampler(model, batch_size=2, max_len=128, min_chunk=16,
                             cache_steps=1)
  state = sampler.prefill(_prompts(7, [10, 3]))
  out = sampler.generate(state, 5, stop_token_ids=[1])
  warm = out.state.stats.compilations
  assert warm >= 2  # one append and one decode executable at least
  decoded = int(out.lengths.sum())
  appended = 13
  for turn in range(3):  # observations of different lengths, same bucket
    obs = _prompts(8 + turn, [4 + turn, 9 - turn])
    appended += sum(map(len, obs))
    out = sampler.generate(sampler.append(out.state, obs), 5 + turn,
                           stop_token_ids=[1])
    decoded += int(out.lengths.sum())
  stats = out.state.stats
  assert stats.compilations == warm
  assert stats.prefill_tokens == appended
  assert stats.decode_tokens == decoded
  assert stats.decode_steps >= max(5, 8) and stats.decode_calls == 4
  np.testing.assert_array_equal(out.state.lengths,
                                np.asarray(out.state.cache["lengths"]))


def _compiled_texts(n_before):
  """Optimised HLO of the programs compiled after the first `n_before`."""
  return [c.as_text() for c in list(sampling.sampler._COMPILED.values())[n_before:]]  # pylint: disable=protected-access


@pytest.mark.slow
def test_compiler_options_reach_xla_and_keep_tokens(models):
  """`compiler_options` compile this sampler's programs apart, with the options.

  Clearing YNNPACK's fusion types makes XLA emit its own dots: the compiled
  programs then hold no `__ynn_fusion` (the default ones do), and the tokens
  and log-probs stay those of the default programs.
  """
  _, model = models
  prompts = _prompts(21, [5, 8])
  plain = sampling.Sampler(model, batch_size=2, max_len=32)
  ref = plain.generate(plain.prefill(prompts), 6)
  n = len(sampling.sampler._COMPILED)  # pylint: disable=protected-access
  ynn_off = {"xla_cpu_experimental_ynn_fusion_type": ""}
  other = sampling.Sampler(model, batch_size=2, max_len=32,
                           compiler_options=ynn_off)
  out = other.generate(other.prefill(prompts), 6)
  # Not served from the default programs' cache: compiled anew, without YNN
  # (append, the decode loop's LM-head weight, decode).
  assert out.state.stats.compilations == 3
  texts = _compiled_texts(n)
  assert len(texts) == 3 and not any("__ynn_fusion" in t for t in texts)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
  # The default decode programs (no options: key[3] is empty) do use YNNPACK,
  # so the check above could not pass by accident.
  assert plain.compiler_options == {}
  default_text = [c.as_text() for k, c in sampling.sampler._COMPILED.items()  # pylint: disable=protected-access
                  if k[0] == "decode" and k[1] is plain.graphdef and not k[3]]
  assert default_text and all("__ynn_fusion" in t for t in default_text)
  # A misspelt option fails at the first call (compiling) and names the option.
  bad = sampling.Sampler(model, batch_size=2, max_len=32,
                         compiler_options={"xla_cpu_no_such_option": 1})
  with pytest.raises(Exception, match="xla_cpu_no_such_option"):
    bad.prefill(prompts)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_growing_cache_equals_the_full_cache(models, temperature):
  """A cache that grows in steps gives the outputs of one at full capacity.

  Capacity 64 in 4 steps (16, 32, 48, 64 slots): ragged rows outgrow a
  size at different steps, mid-call (the decode loop returns, the cache is
  copied into the next size, and the loop goes on with the same keys), a
  stop sequence ends the longest row (greedy), and two more turns go on
  from there, one after an append that itself needs a larger cache.
  """
  _, model = models
  prompts = _prompts(30, [3, 14, 5])
  free = sampling.generate(model, prompts, max_new_tokens=12)
  stop = [_row(free, 1)[6:8]]       # ends row 1 (greedy) mid-call
  kw = dict(temperature=temperature, stop_sequences=stop, pad_token_id=-1)
  outs, caps = [], []
  for steps in (1, 4):
    sampler = sampling.Sampler(model, batch_size=3, max_len=64,
                               cache_steps=steps)
    assert sampler.cache_capacities == ((16, 32, 48, 64) if steps == 4
                                        else (64,))
    state = sampler.prefill(prompts)
    caps.append([kv_cache.cache_capacity(state.cache)])
    first = sampler.generate(state, 20, **kw)
    second = sampler.generate(
        sampler.append(first.state, [[5, 6] * 6, [7], [8]]), 14,
        active=[True, False, True], **kw)
    third = sampler.generate(second.state, 6, temperature=temperature,
                             pad_token_id=-1)
    outs.append((first, second, third))
    for out in outs[-1]:
      caps[-1].append(kv_cache.cache_capacity(out.state.cache))
      assert out.state.max_len == 64
  for plain, grown in zip(*outs):
    np.testing.assert_array_equal(grown.tokens, plain.tokens)
    np.testing.assert_array_equal(grown.lengths, plain.lengths)
    np.testing.assert_array_equal(grown.stopped, plain.stopped)
    np.testing.assert_allclose(grown.logprobs, plain.logprobs, atol=1e-6)
    np.testing.assert_allclose(grown.processed_logprobs,
                               plain.processed_logprobs, atol=1e-6)
    np.testing.assert_array_equal(grown.state.lengths, plain.state.lengths)
  # Each state's cache is the smallest size that holds its longest row.
  assert caps[0] == [64] * 4
  lengths = [15] + [int(o.state.lengths.max()) for o in outs[1]]
  assert caps[1] == [next(c for c in (16, 32, 48, 64) if c >= n)
                     for n in lengths], (caps, lengths)
  # The first generate grew the cache mid-call, from 16 slots.
  assert caps[1][0] == 16 and caps[1][-1] > caps[1][1] > 16, caps
  # `continue_generation` takes the capacity the cache may grow to.
  more = sampling.continue_generation(model, outs[1][2].state, [[1], [], []],
                                      2, pad_token_id=-1)
  assert more.state.max_len == 64
  with pytest.raises(ValueError, match="cache_steps"):
    sampling.Sampler(model, batch_size=3, max_len=64, cache_steps=0)


@pytest.mark.slow
def test_cache_blocks_across_turns_match_transformers(models):
  """Histories grow through many cache-attention blocks, mid-turn included."""
  hf, model = models
  graphdef, params = nnx.split(model)
  model = nnx.merge(graphdef, params)
  model.config = model.config.replace(attention_chunk=16)
  # One cache size: a growing cache compiles programs per size.
  sampler = sampling.Sampler(model, batch_size=2, max_len=160, cache_steps=1)
  histories = _prompts(11, [9, 20])
  out = sampler.generate(sampler.prefill(histories), 13)
  warm = None
  for turn in range(6):
    for b in range(2):
      assert _row(out, b) == _hf_greedy(hf, histories[b], 13), (turn, b)
      histories[b] = histories[b] + _row(out, b)
    if turn == 5:
      break
    obs = _prompts(20 + turn, [3 + 2 * turn, 7])
    histories = [h + o for h, o in zip(histories, obs)]
    out = sampler.generate(sampler.append(out.state, obs), 13)
    warm = warm or out.state.stats.compilations
  # The histories grew from 20 to ~150 tokens (1 to 10 blocks of 16) without
  # a new program after the second turn: the block count is a run-time bound.
  assert max(len(h) for h in histories) > 128
  assert out.state.stats.compilations <= warm + 1


@pytest.mark.slow
def test_capacity_errors_and_budget_clipping(models):
  _, model = models
  sampler = sampling.Sampler(model, batch_size=2, max_len=16)
  with pytest.raises(ValueError, match="capacity"):
    sampler.prefill([[1] * 17, [2]])
  with pytest.raises(ValueError, match="rows"):
    sampler.prefill([[1]])
  out = sampler.generate(sampler.prefill([[1] * 12, [2] * 3]), 10)
  assert out.lengths.tolist() == [4, 10]  # row 0 clipped to the free slots
