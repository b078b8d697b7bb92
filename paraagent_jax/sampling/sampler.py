"""Batched KV-cache sampler: jitted prefill, on-device decode loop, continuation.

The sampler is the hot path of RL: every RL step samples many multi-turn rollouts.
It drives a `paraagent_jax.models.qwen3.Qwen3` through the programs of
`sampling.programs`, which run `cached_forward.forward_chunk(model, ids, cache,
num_new)` on a cache from `kv_cache.init_cache(model, batch, max_len)`:
`forward_chunk` appends `num_new[b]` real tokens of a right-padded chunk to row
`b` of the cache and returns logits for every chunk position. On the CPU,
`cached_forward.decode_weights(model)` (out-major copies of weights) is built
once per set of weights and the decode loop passes it back to
`forward_chunk(..., decode_weights=...)`.

Design:
* `graphdef, params = nnx.split(model)`; the jitted functions are pure functions of
  `params` (the graphdef is static). They are compiled ahead of time and cached per
  shape signature, so the `compilations` counter is exact and compile time can be
  reported apart from run time.
* Prefill and continuation are the same operation (`append`): the new tokens of
  each row are right-padded to a bucketed chunk length (a power of two, at least
  `min_chunk`, at most `max_chunk`; longer inputs take several chunks). Rows with
  no new tokens pass `num_new = 0` and are untouched, so one cache serves a whole
  batch of episodes, finished ones included.
* Decoding runs in one `jax.lax.while_loop` on the device that exits when every row
  has stopped (stop token, stop sequence, or its token budget). Each sampled token,
  the stop token included, is fed back into the cache, so after `generate` the cache
  holds exactly prompt + generated tokens, and the logits for the next token are
  kept in the state: a later `append` (observation tokens) or `generate` (more
  tokens) continues without recomputing anything.
* On the CPU the cache grows in steps (`Sampler(cache_steps=...)`): a state's
  cache holds 1/4, 2/4, 3/4 or all of `max_len` slots, the fewest its rows
  need. When an active row's next token does not fit, the decode loop returns,
  the host copies the cache into the next size (`kv_cache.resize_cache`, a
  program of its own) and the loop goes on. A CPU decode step reads every slot
  of its cache (XLA:CPU copies any slice of it), so short rows do not pay for
  the whole capacity; no decode program holds a copy of the cache.
* The cache and the next-token logits are donated to every call.

Log-probs: `GenerateOutput.logprobs` is the log-prob of each sampled token under the
model's plain log-softmax (temperature 1, no top-k/top-p), i.e. exactly what a fresh
forward pass over the finished sequence gives; that is what the RL loss recomputes.
`processed_logprobs` is the log-prob under the distribution actually sampled from
(temperature, top-k, top-p applied; 0 for greedy).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax.sampling import kv_cache
from paraagent_jax.sampling import programs

# Compiled executables shared by all samplers of a process: (name, graphdef,
# static args, abstract arguments) -> jax.stages.Compiled.
_COMPILED: dict[Any, Any] = {}

# `Sampler(cache_steps=None)` on the CPU, for a `max_len` of at least
# `_AUTO_CACHE_STEPS_MIN_LEN` slots (docs/records/sampler_speed.md).
_AUTO_CACHE_STEPS = 4
_AUTO_CACHE_STEPS_MIN_LEN = 128


@dataclasses.dataclass
class SamplerStats:
  """Counters a rollout can report (cumulative over a state's life)."""
  prefill_tokens: int = 0         # real tokens appended (prompts, observations)
  prefill_padded_tokens: int = 0  # tokens computed in append chunks, padding included
  prefill_calls: int = 0
  decode_tokens: int = 0          # real tokens generated
  decode_steps: int = 0           # decode-loop iterations (each one batch forward)
  decode_calls: int = 0           # generate calls (a growing cache: several programs)
  compilations: int = 0           # new executables compiled for this state's calls
  compile_seconds: float = 0.0

  def as_dict(self) -> dict[str, float]:
    """The counters as a plain dict (for metrics writers)."""
    return dataclasses.asdict(self)


@dataclasses.dataclass
class SamplerState:
  """A batch of sequences in a KV cache, ready to be extended.

  Attributes:
    cache: the model's cache pytree (on device; donated to the next call).
    next_logits: [B, V] f32 logits for the next token of each row (on device).
    has_logits: [B] bool (host): the row has at least one token, so it can generate.
    lengths: [B] int (host): tokens in the cache per row (mirror of cache lengths).
    key: PRNG key consumed by sampling calls.
    stats: counters, shared by every state derived from this one.
    max_len: the capacity the cache may grow to (None: the cache's own; see
      `Sampler(cache_steps=...)`).
  """
  cache: Any
  next_logits: jax.Array
  has_logits: np.ndarray
  lengths: np.ndarray
  key: jax.Array
  stats: SamplerStats
  max_len: int | None = None


@dataclasses.dataclass
class GenerateOutput:
  """Result of a generation call; arrays are numpy, padded after `lengths`."""
  tokens: np.ndarray              # [B, N] int32, pad_token_id after lengths[b]
  logprobs: np.ndarray            # [B, N] f32, plain log-softmax (see module doc)
  processed_logprobs: np.ndarray  # [B, N] f32, under the sampling distribution
  lengths: np.ndarray             # [B] int32, generated tokens incl. the stop token
  stopped: np.ndarray             # [B] bool, ended by a stop token/sequence
  state: SamplerState             # continue from here (cache holds all tokens)


def _pow2_at_least(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def _signature(tree) -> Any:
  """Hashable abstract description of a pytree of arrays (what jit keys on)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((np.shape(x), str(x.dtype), getattr(x, "sharding", None))
                        for x in leaves)


# ----------------------------------------------------------------------------
# Host-side driver.
# ----------------------------------------------------------------------------


class Sampler:
  """Batched sampler over one model and a fixed batch size and cache capacity.

  Fixing `batch_size` and `max_len` per rollout (and bucketing chunk lengths and
  token budgets) keeps the set of compiled shapes small: a multi-turn rollout
  compiles a handful of executables in its first turns and none afterwards.
  """

  def __init__(self, model, batch_size: int, max_len: int, *,
               min_chunk: int = 16, max_chunk: int = 512, min_decode: int = 16,
               cache_dtype=None, compiler_options: dict | None = None,
               cache_steps: int | None = None):
    """Creates a sampler.

    Args:
      model: a `qwen3.Qwen3`.
      batch_size: rows of the cache (episodes of a rollout batch).
      max_len: cache capacity in tokens per row (history + generated).
      min_chunk: smallest append chunk length (chunks are powers of two).
      max_chunk: longest append chunk; longer inputs are split (bounds the
        [B, T, V] logits of a chunk and the number of compiled shapes).
      min_decode: smallest decode buffer (token budgets round up to powers of 2).
      cache_dtype: dtype of the K/V cache (default: the model's choice).
      compiler_options: XLA options for this sampler's programs, as
        `jax.stages.Lowered.compile(compiler_options=...)` takes them (the names
        of XLA_FLAGS without the dashes, e.g. {"xla_cpu_prefer_vector_width":
        512}); they override XLA_FLAGS for these programs only.
      cache_steps: n: a state's cache holds max_len * j // n slots for the
        smallest j that its rows need, and grows a step when they need more
        (a copy, in a program of its own; the decode loop returns to the
        host for it and goes on). A CPU decode step reads every slot of its
        cache, so this saves the steps' reads of slots no row has reached
        (the batch-32 bench's decode ~6% faster at 4). Each cache size has
        its own append and decode programs, so a rollout compiles more of
        them. 1 turns it off (the cache is allocated at `max_len`).
        None (the default): 4 on the CPU for a `max_len` of at least 128
        and an unsharded model, else 1. On
        accelerators the cache attention already skips dead blocks in place.
    """
    self.graphdef, self.params = nnx.split(model)
    self._model = model
    self.batch_size = int(batch_size)
    self.max_len = int(max_len)
    self.min_chunk = _pow2_at_least(min_chunk)
    self.max_chunk = _pow2_at_least(max_chunk)
    self.min_decode = _pow2_at_least(min_decode)
    self.cache_dtype = cache_dtype
    self.compiler_options = dict(compiler_options or {})
    if cache_steps is None:
      auto = (jax.default_backend() == "cpu"
              and self.max_len >= _AUTO_CACHE_STEPS_MIN_LEN
              and getattr(model, "sharding_ctx", None) is None)
      cache_steps = _AUTO_CACHE_STEPS if auto else 1
    if int(cache_steps) < 1:
      raise ValueError(f"cache_steps must be >= 1, got {cache_steps}")
    n = min(int(cache_steps), max(self.max_len, 1))
    # The cache sizes a state goes through (the last is `max_len`).
    self.cache_capacities = tuple(sorted({self.max_len * j // n
                                          for j in range(1, n + 1)} - {0})
                                  ) or (self.max_len,)
    # (params, cached_forward.decode_weights of them): on the CPU, out-major
    # copies of the weights a decode step multiplies, built once per set of
    # weights, not in every decode call.
    self._decode_w = None

  def update_params(self, model_or_params) -> None:
    """Points the sampler at new weights (a model, or the params of nnx.split)."""
    if isinstance(model_or_params, nnx.Module):
      _, model_or_params = nnx.split(model_or_params)
    self.params = model_or_params
    self._decode_w = None

  def _decode_weights(self, stats: SamplerStats):
    """The decode loop's out-major weights for the current params (or None)."""
    if self._decode_w is None or self._decode_w[0] is not self.params:
      self._decode_w = (self.params, self._call(
          "decode_weights", programs.DECODE_WEIGHTS_JIT, stats,
          (self.graphdef, self.params)))
    return self._decode_w[1]

  def _call(self, name, jitted, stats, args, static=None):
    """Runs `jitted` through the shared AOT cache, counting compilations."""
    static = static or {}
    key = (name, self.graphdef, tuple(sorted(static.items())),
           tuple(sorted(self.compiler_options.items())), _signature(args[1:]))
    compiled = _COMPILED.get(key)
    if compiled is None:
      start = time.perf_counter()
      compiled = jitted.lower(*args, **static).compile(
          compiler_options=self.compiler_options or None)
      stats.compilations += 1
      stats.compile_seconds += time.perf_counter() - start
      _COMPILED[key] = compiled
    return compiled(*args)

  def init_state(self, seed: int = 0) -> SamplerState:
    """An empty cache for `batch_size` rows, with a PRNG key from `seed`."""
    vocab = self._model.config.vocab_size
    return SamplerState(
        cache=self._empty_cache(self.cache_capacities[0]),
        next_logits=jnp.zeros((self.batch_size, vocab), jnp.float32),
        has_logits=np.zeros(self.batch_size, bool),
        lengths=np.zeros(self.batch_size, np.int64),
        key=jax.random.key(seed), stats=SamplerStats(), max_len=self.max_len)

  def _empty_cache(self, capacity: int):
    return kv_cache.init_cache(self._model, self.batch_size, capacity,
                               dtype=self.cache_dtype)

  def _fit(self, state: SamplerState, need: int) -> SamplerState:
    """`state` with a cache of at least `need` (<= `max_len`) slots per row."""
    have = kv_cache.cache_capacity(state.cache)
    if need <= have:
      return state
    capacity = next(c for c in self.cache_capacities if c >= need)
    if not state.lengths.any():
      cache = self._empty_cache(capacity)
    else:
      cache = self._call("resize", programs.RESIZE_JIT, state.stats,
                         (self.graphdef, self.params, state.cache),
                         dict(capacity=capacity))
    return dataclasses.replace(state, cache=cache)

  def prefill(self, prompt_ids: Sequence[Sequence[int]], seed: int = 0
              ) -> SamplerState:
    """A new state holding `prompt_ids` (one list per row; [] = empty row)."""
    return self.append(self.init_state(seed), prompt_ids)

  def append(self, state: SamplerState, new_token_ids: Sequence[Sequence[int]]
             ) -> SamplerState:
    """Appends tokens to each row of the cache (prefill or continuation).

    Args:
      state: the state to extend; its cache is donated (do not reuse `state`).
      new_token_ids: one list per row; an empty list leaves the row untouched
        (finished episodes of a batch rollout).

    Returns:
      The extended state; rows that received tokens have fresh next-token logits.

    Raises:
      ValueError: wrong number of rows, or a row would exceed `max_len`.
    """
    if len(new_token_ids) != self.batch_size:
      raise ValueError(f"expected {self.batch_size} rows, got "
                       f"{len(new_token_ids)}")
    counts = np.array([len(r) for r in new_token_ids], np.int64)
    over = np.nonzero(state.lengths + counts > self.max_len)[0]
    if over.size:
      b = int(over[0])
      raise ValueError(
          f"row {b}: {state.lengths[b]} cached + {counts[b]} new tokens exceed "
          f"the cache capacity max_len={self.max_len}")
    state = self._fit(state, int((state.lengths + counts).max(initial=0)))
    ids = np.zeros((self.batch_size, max(int(counts.max(initial=0)), 1)),
                   np.int32)
    for b, row in enumerate(new_token_ids):
      ids[b, :len(row)] = row
    cache, logits = state.cache, state.next_logits
    offset, total = 0, int(counts.max(initial=0))
    while offset < total:
      chunk = min(self.max_chunk,
                  max(self.min_chunk, _pow2_at_least(total - offset)))
      piece = np.zeros((self.batch_size, chunk), np.int32)
      part = ids[:, offset:offset + chunk]
      piece[:, :part.shape[1]] = part
      num_new = np.clip(counts - offset, 0, chunk).astype(np.int32)
      cache, logits = self._call(
          "append", programs.APPEND_JIT, state.stats,
          (self.graphdef, self.params, cache, logits, piece, num_new))
      state.stats.prefill_calls += 1
      state.stats.prefill_padded_tokens += self.batch_size * chunk
      offset += chunk
    state.stats.prefill_tokens += int(counts.sum())
    return dataclasses.replace(
        state, cache=cache, next_logits=logits,
        has_logits=state.has_logits | (counts > 0),
        lengths=state.lengths + counts)

  def generate(self, state: SamplerState, max_new_tokens: int | Sequence[int]
               = 128, *, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, stop_token_ids: Sequence[int] = (),
               stop_sequences: Sequence[Sequence[int]] = (),
               active: Sequence[bool] | None = None, pad_token_id: int = 0,
               draw: str = "gumbel", rows: tuple[int, int] | None = None
               ) -> GenerateOutput:
    """Generates from the current state of every active row.

    Args:
      state: the state to extend; its cache is donated (do not reuse `state`).
      max_new_tokens: token budget, one int or one per row; a row's budget is
        also clipped to its remaining cache capacity.
      temperature: 0 for greedy decoding, otherwise the softmax temperature.
      top_k: keep the k most likely tokens (0 = off).
      top_p: nucleus sampling mass (1.0 = off).
      stop_token_ids: a row stops after generating any of these ids.
      stop_sequences: a row stops after generating any of these token sequences
        (matched within the tokens generated by this call).
      active: rows allowed to generate (default: every row holding tokens);
        inactive rows generate nothing and their cache is untouched.
      pad_token_id: written to `tokens` after each row's length.
      draw: how a sampled token is drawn: "gumbel" (`jax.random.categorical`)
        or "inverse_cdf" (one uniform per row; the same distribution, another
        random stream; `programs.inverse_cdf_choice`).
      rows: ``(offset, total)``: this sampler's rows are rows ``offset ..
        offset + batch_size`` of a batch of ``total`` sampled on several
        hosts from the same seed (an RL rollout split over the hosts of a
        pod); each row draws the random numbers it draws in the whole batch
        on one host (`programs.draw_rows`). None (the default): the rows
        are the whole batch. Greedy decoding ignores it.

    Returns:
      A `GenerateOutput`; `.state` continues the batch.
    """
    bsz = self.batch_size
    lengths0 = state.lengths
    budget = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (bsz,))
    mask = state.has_logits.copy()
    if active is not None:
      mask &= np.asarray(active, bool)
    budget = np.where(mask, np.minimum(budget, self.max_len - state.lengths), 0)
    budget = np.maximum(budget, 0).astype(np.int32)
    n_out = int(budget.max(initial=0))
    n_buf = max(self.min_decode, _pow2_at_least(n_out))
    stop_arr, stop_msk = _stop_table(stop_sequences, stop_token_ids)
    width = stop_arr.shape[1]
    greedy = float(temperature) <= 0.0
    key, sub = jax.random.split(state.key)
    if draw not in programs.DRAWS:
      raise ValueError(f"draw={draw!r}; expected one of {programs.DRAWS}")
    static = dict(greedy=greedy, top_k=0 if greedy else int(top_k),
                  use_top_p=(not greedy) and float(top_p) < 1.0,
                  pad_id=int(pad_token_id), draw="gumbel" if greedy else draw)
    if rows is not None and not greedy:
      offset, total = int(rows[0]), int(rows[1])
      if offset < 0 or offset + bsz > total:
        raise ValueError(f"rows={rows}: {bsz} rows from {offset} do not fit in "
                         f"a batch of {total}")
      if (offset, total) != (0, bsz):
        static["rows"] = (offset, total)
    loop = programs.decode_loop_init(budget, n_buf, width, int(pad_token_id))
    decode_w = self._decode_weights(state.stats)
    stats = state.stats
    # Runs the loop; when an active row's next token does not fit in the
    # cache, the loop returns and goes on in the next cache size.
    need = int(np.where(budget > 0, state.lengths + 1, 0).max(initial=0))
    state = self._fit(state, need)
    cache, logits = state.cache, state.next_logits
    while True:
      args = (self.graphdef, self.params, cache, logits, sub, loop, budget,
              stop_arr, stop_msk, np.float32(max(float(temperature), 1e-6)),
              np.float32(top_p), decode_w)
      cache, logits, loop = self._call("decode", programs.DECODE_JIT, stats,
                                       args, static)
      # As numpy (small arrays), like the first call's: the same program.
      loop = tuple(np.asarray(x) for x in loop)
      steps, active = int(loop[0]), loop[1]
      if steps >= n_buf or not active.any():
        break
      have = kv_cache.cache_capacity(cache)
      if have >= self.max_len:   # unreachable: budgets fit in max_len
        raise RuntimeError(f"decode stopped at step {steps} with rows active "
                           f"in a full cache of {have} slots")
      lengths = np.asarray(cache["lengths"])
      state = self._fit(dataclasses.replace(state, cache=cache, lengths=lengths),
                        int(lengths[active].max()) + 1)
      cache = state.cache
    _, _, gen_len, _, toks, lps, plps, hit = loop
    gen_len = np.asarray(gen_len).astype(np.int32)
    stats.decode_calls += 1
    stats.decode_steps += steps
    stats.decode_tokens += int(gen_len.sum())
    new_state = dataclasses.replace(
        state, cache=cache, next_logits=logits, key=key,
        lengths=lengths0 + gen_len)
    return GenerateOutput(
        tokens=np.asarray(toks)[:, :n_out], logprobs=np.asarray(lps)[:, :n_out],
        processed_logprobs=np.asarray(plps)[:, :n_out], lengths=gen_len,
        stopped=np.asarray(hit), state=new_state)


def _stop_table(stop_sequences, stop_token_ids) -> tuple[np.ndarray, np.ndarray]:
  """The stop sequences (and single stop ids) right-aligned in a table of a
  power-of-two width: (ids, -1 where empty) and (mask) for the decode loop."""
  seqs = [list(s) for s in stop_sequences if len(s)] + [
      [int(t)] for t in stop_token_ids]
  width = _pow2_at_least(max([len(s) for s in seqs], default=1))
  stop_arr = np.full((len(seqs), width), -1, np.int32)
  stop_msk = np.zeros((len(seqs), width), bool)
  for i, s in enumerate(seqs):
    stop_arr[i, width - len(s):] = s
    stop_msk[i, width - len(s):] = True
  return stop_arr, stop_msk


# ----------------------------------------------------------------------------
# Functional interface (issue 4's public API).
# ----------------------------------------------------------------------------


def _capacity(n: int) -> int:
  """Default cache capacity for one-shot generation: a multiple of 64."""
  return max(64, -(-int(n) // 64) * 64)


def generate(model, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int = 128,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             stop_token_ids: Sequence[int] = (),
             stop_sequences: Sequence[Sequence[int]] = (), seed: int = 0, *,
             max_len: int | None = None, pad_token_id: int = 0, draw: str = "gumbel",
             **sampler_kwargs) -> GenerateOutput:
  """Prefills `prompt_ids` (ragged, one list per row) and generates.

  Args:
    model: a `qwen3.Qwen3`.
    prompt_ids: prompts of any lengths, one list of token ids per row.
    max_new_tokens: token budget per row.
    temperature, top_k, top_p: sampling settings (temperature 0 = greedy).
    stop_token_ids: ids that end a row (EOS); the stop token is included.
    stop_sequences: token sequences that end a row (e.g. a closing tag).
    seed: PRNG seed; the same seed gives the same samples.
    max_len: cache capacity (default: longest prompt + budget, rounded up); pass
      a larger one to continue the batch later with `continue_generation`.
    pad_token_id: written to `tokens` after each row's length.
    draw: "gumbel" or "inverse_cdf" (`Sampler.generate`).
    **sampler_kwargs: forwarded to `Sampler` (min_chunk, max_chunk, ...).

  Returns:
    A `GenerateOutput` (tokens, logprobs, processed_logprobs, lengths, stopped,
    state).
  """
  longest = max((len(p) for p in prompt_ids), default=0)
  sampler = Sampler(model, len(prompt_ids),
                    max_len or _capacity(longest + max_new_tokens),
                    **sampler_kwargs)
  state = sampler.prefill(prompt_ids, seed=seed)
  return sampler.generate(
      state, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
      stop_token_ids=stop_token_ids, stop_sequences=stop_sequences,
      pad_token_id=pad_token_id, draw=draw)


def continue_generation(model, state: SamplerState,
                        new_token_ids: Sequence[Sequence[int]],
                        max_new_tokens: int | Sequence[int] = 128, *,
                        active: Sequence[bool] | None = None,
                        **generate_kwargs) -> GenerateOutput:
  """Appends `new_token_ids` to a state's cache and generates from there.

  Rows with an empty list get no new tokens; pass `active` to exclude rows from
  generation (by default a row generates iff it received new tokens, so finished
  episodes stay untouched). The history is never re-prefilled.

  Args:
    model: the model (its current weights are used).
    state: `GenerateOutput.state` of a previous call (donated).
    new_token_ids: one list per row (observations of a multi-turn rollout).
    max_new_tokens: token budget, one int or one per row.
    active: rows that generate (default: rows with new tokens).
    **generate_kwargs: as for `Sampler.generate`.

  Returns:
    A `GenerateOutput` for the new turn.
  """
  sampler = Sampler(model, len(state.lengths), _state_capacity(state))
  if active is None:
    active = [len(r) > 0 for r in new_token_ids]
  state = sampler.append(state, new_token_ids)
  return sampler.generate(state, max_new_tokens, active=active,
                          **generate_kwargs)


def _state_capacity(state: SamplerState) -> int:
  """Cache capacity (slots per row) of a state's cache."""
  if state.max_len is not None:
    return int(state.max_len)
  return kv_cache.cache_capacity(state.cache)
