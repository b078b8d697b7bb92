"""The sampler's jitted programs: append a chunk, decode, grow the cache.

`paraagent_jax.sampling.Sampler` compiles `APPEND_JIT` (prefill and
continuation: a right-padded chunk appended to each row of the KV cache) and
`DECODE_JIT` (the on-device decode loop) ahead of time and drives them from
the host; the dry run lowers them with abstract arguments. Both donate the
cache and the next-token logits, and neither copies it: the cache attention
(`kv_cache.cache_attention`) reads each layer in place, block by block, up to
the longest live row, so a step costs time proportional to the filled part
of the cache, not its capacity. `RESIZE_JIT` copies a cache into a larger
one, for a sampler whose cache grows (`Sampler(cache_steps=...)`; a CPU
decode step reads every slot of its cache). The token choice inside the
decode loop is here too: `sample_token`, `argmax`, `token_logprob`,
`inverse_cdf_choice`.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from paraagent_jax.sampling import cached_forward
from paraagent_jax.sampling import kv_cache

def append_fn(graphdef, params, cache, next_logits, input_ids, num_new):
  """Appends a right-padded chunk; keeps logits at each row's last real token.

  Rows with `num_new = 0` are untouched, since the model drops the writes of
  padding tokens.
  """
  model = nnx.merge(graphdef, params)
  logits, cache = cached_forward.forward_chunk(model, input_ids, cache, num_new,
                                               logits_at=num_new - 1)
  last_logits = logits[:, 0]
  next_logits = jnp.where((num_new > 0)[:, None],
                          last_logits.astype(jnp.float32), next_logits)
  return cache, next_logits


def argmax(x, axis: int = -1):
  """`jnp.argmax` over `axis` (first index of the maximum; NaN wins).

  As a max and a min over a masked iota: XLA CPU lowers argmax to a variadic
  (value, index) reduce that does not vectorise, 0.6 ms for [32, 4096] against
  0.07 ms for this (measured), i.e. ~7% of a batch-32 decode step. The iota
  is float32 (exact below 2**24 entries): XLA:CPU ran the int32 min as a tree
  of reduce-windows, and the float one 35% faster (42 against 65 us a step at
  [32, 4096]; docs/records/sampler_speed.md).
  """
  v = x.shape[axis]
  if v > 1 << 24:
    raise ValueError(f"argmax over {v} > 2**24 entries: float32 indices are "
                     "not exact")
  m = jnp.max(x, axis=axis, keepdims=True)
  hit = (x == m) | jnp.isnan(x)
  iota = jax.lax.broadcasted_iota(jnp.float32, x.shape, axis % x.ndim)
  return jnp.min(jnp.where(hit, iota, v - 1.0), axis=axis).astype(jnp.int32)


def token_logprob(logits, tok, axis: int = -1):
  """log_softmax(logits)[b, tok[b]] per row, without a [B, V] log-softmax.

  The same arithmetic as `jax.nn.log_softmax` (shift by the row max, minus
  the log of the sum of exponentials) at the picked token only: the full
  log-softmax wrote a [B, V] array every decode step (~2% of a batch-32
  decode call on the CPU; docs/records/sampler_speed.md).
  """
  m = jnp.max(logits, axis=axis, keepdims=True)
  lse = jnp.log(jnp.sum(jnp.exp(logits - m), axis=axis))
  picked = jnp.take_along_axis(logits, jnp.expand_dims(tok, axis), axis=axis)
  return (jnp.squeeze(picked, axis) - jnp.squeeze(m, axis)) - lse


DRAWS = ("gumbel", "inverse_cdf")
# Entries per block of the two-level inverse-CDF draw.
DRAW_BLOCK = 64


def inverse_cdf_choice(x, key, block: int = DRAW_BLOCK):
  """An index per row drawn from softmax(x) ([B, V]; -inf entries never) with
  one uniform per row.

  The same distribution as `jax.random.categorical` (up to float rounding of
  the partial sums), another random stream: u ~ U[0, total) picks the block
  of ``block`` entries whose cumulative mass first exceeds it, then the entry
  inside that block. Cost: one exp per entry and [B, V / block] + [B, block]
  partial sums, against categorical's V random bits and two logs per entry.
  """
  b, v = x.shape
  nb = -(-v // block)
  p = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
  p = jnp.pad(p, ((0, 0), (0, nb * block - v))).reshape(b, nb, block)
  bsum = jnp.sum(p, axis=-1)                                  # [B, nb]
  bcum = jnp.cumsum(bsum, axis=-1)
  u = jax.random.uniform(key, (b,), jnp.float32) * bcum[:, -1]

  def last_nonzero(mass):   # [B, n] -> the last index with mass > 0
    n = mass.shape[-1]
    return n - 1 - jnp.argmax(jnp.flip(mass > 0, axis=-1), axis=-1)

  bi = jnp.minimum(jnp.sum(bcum <= u[:, None], axis=-1), last_nonzero(bsum))
  within = jnp.take_along_axis(p, jnp.broadcast_to(bi[:, None, None], (b, 1, block)),
                               axis=1)[:, 0]                  # [B, block]
  before = jnp.take_along_axis(bcum - bsum, bi[:, None], axis=-1)[:, 0]
  wcum = jnp.cumsum(within, axis=-1)
  j = jnp.minimum(jnp.sum(wcum <= (u - before)[:, None], axis=-1), last_nonzero(within))
  return (bi * block + j).astype(jnp.int32)


def draw_rows(choose, x, rows: tuple[int, int] | None):
  """``choose(x)`` ([B, N] -> [B] indices, row by row) for rows ``offset ..
  offset + B`` of a batch of ``total`` (``rows``; None: ``choose(x)``).

  ``x`` is zero-padded to ``[total, N]`` and its rows of the result are kept:
  a random draw keyed by one key for the whole ``[total, N]`` array (Gumbel
  noise, one uniform per row) gives these rows the numbers they get in the
  whole batch, whatever the split. The cost: the draw for all ``total`` rows
  on every host (on the CPU demo, ~B x V random numbers a decode step more).
  A pod of large models would rather key each row by its global index
  (``fold_in(key, row)``), so a host draws only its own rows; that changes
  the single-host random stream, which the recorded runs are compared with.
  """
  if rows is None:
    return choose(x)
  offset, total = int(rows[0]), int(rows[1])
  b = x.shape[0]
  if offset < 0 or offset + b > total:
    raise ValueError(f"rows {offset}..{offset + b} outside a batch of {total}")
  padded = jnp.pad(x, ((offset, total - offset - b),) + ((0, 0),) * (x.ndim - 1))
  return choose(padded)[offset:offset + b]


def sample_token(logits, key, temperature, top_p, *, greedy: bool, top_k: int,
                 use_top_p: bool, draw: str = "gumbel",
                 rows: tuple[int, int] | None = None):
  """Samples one token per row; returns (token, log-prob under the sampled dist).

  Warpers are applied in the order of transformers (temperature, top-k, top-p);
  top-p keeps the smallest prefix of the sorted distribution whose mass reaches
  `top_p` (the token that crosses the threshold is kept). ``draw``: "gumbel"
  (`jax.random.categorical`) or "inverse_cdf" (`inverse_cdf_choice`: the same
  distribution, one uniform per row, another random stream).

  ``rows``: ``(offset, total)``: these B rows are rows ``offset .. offset+B``
  of a batch of ``total`` rows sampled with the same key (one host's share of
  a rollout batch split over hosts): the draw is made for all ``total`` rows
  (the others' logits are zeros) and these rows' choices kept, so each row
  gets exactly the random numbers it gets in the whole batch on one host
  (`draw_rows`). None: the B rows are the whole batch.
  """
  if greedy:
    tok = argmax(logits)
    return tok, jnp.zeros(tok.shape, jnp.float32)
  x = logits / temperature
  if top_k > 0 or use_top_p:
    if top_k > 0:
      vals, idx = jax.lax.top_k(x, min(top_k, x.shape[-1]))
    else:
      idx = jnp.argsort(-x, axis=-1)
      vals = jnp.take_along_axis(x, idx, axis=-1)
    if use_top_p:
      probs = jax.nn.softmax(vals, axis=-1)
      mass_before = jnp.cumsum(probs, axis=-1) - probs
      vals = jnp.where(mass_before < top_p, vals, -jnp.inf)
  else:
    vals, idx = x, None
  if draw == "inverse_cdf":
    choice = draw_rows(lambda v: inverse_cdf_choice(v, key), vals, rows)
  elif draw == "gumbel":
    choice = draw_rows(lambda v: jax.random.categorical(key, v, axis=-1), vals, rows)
  else:
    raise ValueError(f"draw={draw!r}; expected one of {DRAWS}")
  proc_lp = jnp.take_along_axis(jax.nn.log_softmax(vals, axis=-1),
                                choice[:, None], axis=-1)[:, 0]
  tok = choice if idx is None else jnp.take_along_axis(
      idx, choice[:, None], axis=-1)[:, 0]
  return tok.astype(jnp.int32), proc_lp


def decode_weights_fn(graphdef, params):
  """`cached_forward.decode_weights`: the decode loop's out-major weights,
  or None."""
  return cached_forward.decode_weights(nnx.merge(graphdef, params))


def decode_loop_init(budget, n_buf: int, width: int, pad_id: int):
  """The decode loop's state before its first step, as numpy arrays.

  (step, active, generated lengths, last `width` tokens, tokens, log-probs,
  log-probs under the sampling dist, stop hit): `decode_fn` takes it and
  returns it advanced, so a loop that left its cache's capacity can go on
  in a larger cache (`Sampler(cache_steps=...)`).
  """
  b = len(budget)
  zeros_f = np.zeros((b, n_buf), np.float32)
  return (np.int32(0), np.asarray(budget) > 0, np.zeros((b,), np.int32),
          np.full((b, width), -1, np.int32),
          np.full((b, n_buf), pad_id, np.int32), zeros_f, zeros_f.copy(),
          np.zeros((b,), bool))


def decode_fn(graphdef, params, cache, next_logits, key, loop, budget,
              stop_seqs, stop_mask, temperature, top_p, decode_weights=None, *,
              greedy: bool, top_k: int, use_top_p: bool, pad_id: int,
              draw: str = "gumbel", rows: tuple[int, int] | None = None):
  """Decode loop on device: samples until every row stopped or ran out of budget.

  `loop` is `decode_loop_init`'s state (or one this function returned); the
  loop runs until every row stopped or ran out of budget, step `n_buf` (the
  width of its token buffers), or an active row's next token does not fit
  in the cache: the caller then grows the cache (`kv_cache.resize_cache`) and
  calls again with the returned state. The tokens and log-probs are those of
  one uninterrupted loop (each step's key is `fold_in(key, step)`).
  `budget[b]` is row b's token budget (0 = row excluded). `stop_seqs` [S, W]
  are stop sequences right-aligned in a window of the last W generated
  tokens, with `stop_mask` marking their real positions (stop ids are
  sequences of length 1). `decode_weights`: None, or `decode_weights_fn`'s
  out-major weights (the sampler builds them once per set of weights).
  `rows`: ``(offset, total)`` of these rows in a batch split over hosts
  (`sample_token`); None: the rows are the whole batch. The
  cache is carried through the loop and updated in place; attention reads it
  block by block (no copy of it or of a layer).

  Returns:
    (cache, next-token logits, the loop state).
  """
  model = nnx.merge(graphdef, params)
  n_buf = loop[4].shape[1]
  capacity = kv_cache.cache_capacity(cache)

  def sample(logits, i, axis=-1):
    """(token, its log-prob, its log-prob under the sampling dist) of step i.

    `logits` [B, V], or [V, B] with `axis=0`.
    """
    if greedy:
      tok = argmax(logits, axis)
      return tok, token_logprob(logits, tok, axis), jnp.zeros(tok.shape,
                                                              jnp.float32)
    if axis == 0:
      logits = logits.T
    tok, plp = sample_token(logits, jax.random.fold_in(key, i), temperature,
                            top_p, greedy=greedy, top_k=top_k,
                            use_top_p=use_top_p, draw=draw, rows=rows)
    return tok, token_logprob(logits, tok), plp

  # With decode weights (the CPU), a step's LM head writes its product [V, B]
  # (`cached_forward.decode_weights`): the loop carries the logits as [V, B],
  # so that the transpose back in `forward_chunk` cancels, and greedy decoding
  # reduces over V in place. Read as [B, V], the select below and the argmax
  # read the product with a stride (+0.01 s a batch-32 bench call, profiled).
  vocab_major = decode_weights is not None
  axis = 0 if vocab_major else -1
  swap = (lambda x: x.T) if vocab_major else (lambda x: x)

  # The loop samples at the end of a step, from the logits it just made, and
  # carries the token into the next step. Sampled at the start of a step from
  # the carried logits (as before), the logits had readers after the step's
  # in-place update, and XLA copied them every step (~0.6% of a b32 call).
  def body(carry):
    (i, cache, logits, (tok, lp, plp), active, gen_len, recent, toks, lps,
     plps, hit_any) = carry
    tok = jnp.where(active, tok, pad_id)
    toks = toks.at[:, i].set(tok)
    lps = lps.at[:, i].set(jnp.where(active, lp, 0.0))
    if not greedy:            # greedy log-probs under "the sampling dist" are 0
      plps = plps.at[:, i].set(jnp.where(active, plp, 0.0))
    gen_len = gen_len + active.astype(jnp.int32)
    shifted = jnp.concatenate([recent[:, 1:], tok[:, None]], axis=1)
    recent = jnp.where(active[:, None], shifted, recent)
    match = (recent[:, None, :] == stop_seqs[None]) | ~stop_mask[None]
    hit = jnp.any(jnp.all(match, axis=-1), axis=-1) & active
    # Feed the token (the stop token too) so the cache holds the whole turn.
    new_logits, cache = cached_forward.forward_chunk(
        model, tok[:, None], cache, active.astype(jnp.int32),
        decode_weights=decode_weights)
    logits = jnp.where(jnp.expand_dims(active, axis),
                       swap(new_logits[:, 0].astype(jnp.float32)), logits)
    active = active & ~hit & (gen_len < budget)
    return (i + 1, cache, logits, sample(logits, i + 1, axis), active, gen_len,
            recent, toks, lps, plps, hit_any | hit)

  def cond(c):
    # Every active row's next token must fit (inactive rows are not written).
    fits = jnp.max(jnp.where(c[4], c[1]["lengths"], 0)) < capacity
    return (c[0] < n_buf) & jnp.any(c[4]) & fits

  i = jnp.asarray(loop[0], jnp.int32)
  carry = (i, cache, swap(next_logits), sample(next_logits, i)) + tuple(loop[1:])
  carry = jax.lax.while_loop(cond, body, carry)
  return carry[1], swap(carry[2]), (carry[0],) + carry[4:]


def resize_cache_fn(graphdef, params, cache, *, capacity: int):
  """`kv_cache.resize_cache` (a larger copy of the cache)."""
  return kv_cache.resize_cache(nnx.merge(graphdef, params), cache, capacity)


APPEND_JIT = jax.jit(append_fn, donate_argnums=(2, 3))
DECODE_WEIGHTS_JIT = jax.jit(decode_weights_fn)
DECODE_JIT = jax.jit(
    decode_fn, donate_argnums=(2, 3),
    static_argnames=("greedy", "top_k", "use_top_p", "pad_id", "draw", "rows"))
RESIZE_JIT = jax.jit(resize_cache_fn, static_argnames=("capacity",))
