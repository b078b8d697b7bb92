"""Token log-probs: the one home for SFT, GRPO and the model's LM head.

The convention of every loss here (`paraagent_jax.learner.batch`): the logit at
t - 1 predicts token t; position 0 has no prediction and gets 0.

* `model_logprobs(model, tokens, ...)`: what the losses call. For a
  `models.qwen3.Qwen3` it runs the body to the final hidden states
  (`Qwen3.hidden`) and then `logprobs_from_hidden` with the model's
  ``logits_chunk`` / ``logits_capacity``: the LM head and log-softmax run in
  sequence chunks (no [B,T,V] fp32 logits) and, with a loss mask ``at``, at
  those positions only. Any other model is called for its [B,T,V] logits,
  which go through `logprobs_from_logits`.
* `logprobs_from_hidden`, `compact_width`: the chunked / compacted head.
* `logprobs_from_logits`: the plain form, from whole logits.

The sampler keeps its own fused copy for decode steps
(`paraagent_jax.sampling.programs.token_logprob`, one position per row inside
the decode program); tests/learner/test_grpo.py checks that it agrees with this module.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


def model_logprobs(model, tokens, attention_mask=None, positions=None,
                   segment_ids=None, *, temperature: float = 1.0,
                   with_entropy: bool = False, at=None):
  """Per-token log-probs (and entropies) of `tokens` under `model`.

  A model with final hidden states and an LM head (`models.qwen3.Qwen3`:
  ``hidden`` and ``head``) goes through `logprobs_from_hidden`: chunked over
  the sequence by ``model.config.logits_chunk`` (no [B,T,V] fp32 logits), and
  with ``model.config.logits_capacity`` the LM head runs at the `at`
  positions only. Any other model is called for its [B,T,V] logits
  (``model(tokens, attention_mask=...)``), which go through
  `logprobs_from_logits`.

  Args:
    model: the policy.
    tokens: [B,T] int.
    attention_mask: [B,T], 1 = real token.
    positions, segment_ids: optional [B,T] (packed rows).
    temperature: logits are divided by it before the softmax.
    with_entropy: also return each position's predictive entropy.
    at: optional [B,T] mask of the positions whose values are wanted (the
      loss mask); the outputs are 0 elsewhere.

  Returns:
    logp [B,T] f32, 0 at t = 0 (and the entropy [B,T] when `with_entropy`).
  """
  if hasattr(model, "hidden") and hasattr(model, "head"):
    h = model.hidden(tokens, attention_mask, positions, segment_ids)
    return logprobs_from_hidden(model.head, h, tokens, temperature=temperature,
                                with_entropy=with_entropy,
                                chunk=model.config.logits_chunk, at=at,
                                capacity=model.config.logits_capacity)
  extra = {k: v for k, v in (("positions", positions),
                             ("segment_ids", segment_ids)) if v is not None}
  logits = model(tokens, attention_mask=attention_mask, **extra)
  if temperature != 1.0:
    logits = logits / temperature
  out = logprobs_from_logits(logits, tokens, with_entropy)
  if at is None:
    return out
  keep = lambda x: jnp.where(at > 0, x, 0.0)
  return tuple(map(keep, out)) if with_entropy else keep(out)


def logprobs_from_logits(logits, tokens, with_entropy: bool = False):
  """Per-token log p(tokens[t] | tokens[<t]) (and entropy) from logits.

  The logit at t - 1 predicts token t; position 0 gets 0 (never trained).
  Computed in float32 without materialising a full log-softmax.

  Args:
    logits: [B,T,V].
    tokens: [B,T] int.
    with_entropy: also return the entropy of the predictive distribution of
      each position (same shift).

  Returns:
    logp [B,T] (and entropy [B,T] if asked).
  """
  logits = logits[:, :-1].astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
  pad = lambda x: jnp.pad(x, ((0, 0), (1, 0)))
  logp = pad(picked - lse)
  if not with_entropy:
    return logp
  probs = jnp.exp(logits - lse[..., None])
  entropy = lse - jnp.sum(probs * logits, axis=-1)
  return logp, pad(entropy)


def _chunk_logprobs(head, h, tgt, temperature, with_entropy):
  """(logp, entropy or None) of one block: h [B,c,D], tgt [B,c]."""
  logits = head(h)
  if temperature != 1.0:
    logits = logits / temperature
  lse = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
  if not with_entropy:
    return picked - lse, None
  probs = jnp.exp(logits - lse[..., None])
  return picked - lse, lse - jnp.sum(probs * logits, axis=-1)


def _blocked_logprobs(fn, h, tgt, chunk: int, with_entropy: bool):
  """`fn` over h [B,T',D] / tgt [B,T'] whole, or in position blocks of `chunk`.

  Each block runs under `jax.checkpoint`, so its logits are recomputed in the
  backward pass and no [B,T',V] array is ever held.
  """
  b, t1 = tgt.shape
  if chunk <= 0 or chunk >= t1:
    return fn(h, tgt)
  n = -(-t1 // chunk)
  pad = n * chunk - t1
  hb = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, -1)
  tb = jnp.pad(tgt, ((0, 0), (0, pad))).reshape(b, n, chunk)

  @jax.checkpoint
  def body(_, xs):
    lp_c, ent_c = fn(*xs)
    return None, (lp_c, lp_c if ent_c is None else ent_c)

  _, (lp, ent) = jax.lax.scan(body, None, (jnp.moveaxis(hb, 1, 0),
                                           jnp.moveaxis(tb, 1, 0)))
  lp = jnp.moveaxis(lp, 0, 1).reshape(b, -1)[:, :t1]
  ent = jnp.moveaxis(ent, 0, 1).reshape(b, -1)[:, :t1] if with_entropy else None
  return lp, ent


def compact_width(capacity: float, length: int) -> int:
  """Positions per row that `logprobs_from_hidden` computes for `capacity`.

  ceil(capacity * length) rounded up to a multiple of 8, at most `length`;
  0 when capacity is 0 (the compact path is off).
  """
  if capacity <= 0:
    return 0
  return min(-(-math.ceil(capacity * length) // 8) * 8, length)


def logprobs_from_hidden(head, h, tokens, *, temperature: float = 1.0,
                         with_entropy: bool = False, chunk: int = 0,
                         at=None, capacity: float = 0.0):
  """Next-token log-probs (and entropies) from final hidden states.

  Args:
    head: hidden [...,D] -> fp32 logits [...,V] (`Qwen3.head`).
    h: [B,T,D] final hidden states; h[:, t-1] predicts tokens[:, t].
    tokens: [B,T] int.
    temperature: logits are divided by it before the softmax.
    with_entropy: also return each position's predictive entropy.
    chunk: > 0 = sequence positions per block (each block under
      `jax.checkpoint`, so its logits are recomputed in the backward pass);
      0 = all positions at once.
    at: optional [B,T] mask of the positions whose log-prob is wanted (the
      loss mask); the outputs are 0 elsewhere. None = every position.
    capacity: with `at`, > 0 = run the LM head and softmax only at the
      positions in `at`, gathered into [B, W] rows of W =
      `compact_width(capacity, T - 1)` slots. A batch where some row has more
      than W positions in `at` takes the all-positions path instead (a
      `lax.cond`), so the result is exact either way. The LM head of a
      4,096-word vocabulary is ~30% of a demo SFT step at 1,024 tokens, and
      only ~19% of a demonstration's positions are in the loss.

  Returns:
    logp [B,T] (0 at t = 0), and entropy [B,T] if asked.
  """
  h, tgt = h[:, :-1], tokens[:, 1:]
  b, t1 = tgt.shape
  fn = functools.partial(_chunk_logprobs, head, temperature=temperature,
                         with_entropy=with_entropy)
  pad1 = lambda x: jnp.pad(x, ((0, 0), (1, 0)))

  def everywhere():
    lp, ent = _blocked_logprobs(fn, h, tgt, chunk, with_entropy)
    if sel is not None:
      lp = jnp.where(sel, lp, 0.0)
      ent = None if ent is None else jnp.where(sel, ent, 0.0)
    return pad1(lp), (pad1(ent) if with_entropy else None)

  width = compact_width(capacity, t1) if at is not None else 0
  sel = None if at is None else at[:, 1:] > 0
  counts = None if at is None else jnp.sum(sel, axis=1)

  def compact():
    # Each row's wanted positions, in order, then filler slots (index 0).
    idx = jax.vmap(lambda s: jnp.nonzero(s, size=width, fill_value=0)[0])(sel)
    live = jnp.arange(width)[None, :] < counts[:, None]
    hc = jnp.take_along_axis(h, idx[..., None], axis=1)
    tc = jnp.take_along_axis(tgt, idx, axis=1)
    lp_c, ent_c = _blocked_logprobs(fn, hc, tc, chunk, with_entropy)
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], idx.shape)
    # Filler slots add 0 (they all point at position 0).
    scatter = lambda v: pad1(jnp.zeros((b, t1), v.dtype).at[rows, idx].add(
        jnp.where(live, v, 0.0)))
    return scatter(lp_c), (scatter(ent_c) if with_entropy else None)

  if 0 < width < t1:
    lp, ent = jax.lax.cond(jnp.all(counts <= width), compact, everywhere)
  else:
    lp, ent = everywhere()
  return (lp, ent) if with_entropy else lp
