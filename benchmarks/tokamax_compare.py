"""tokamax's kernels against this project's paths: agreement and compiled memory.

Issue 18 named `tokamax` (Pallas kernels, `pip install tokamax`; not in
requirements.txt) next to `jax.nn.dot_product_attention` and splash as a kernel
library for attention. This script puts it beside our own paths in one run, on
whatever backend JAX has:

1. **Attention** (`attention="tokamax"` against the reference einsum path,
   fp32, GQA, one right-padded row): largest forward and gradient differences,
   then the compiled temporaries of the forward and of forward + backward at a
   long row (`--seq`, default 8,192 tokens; compile only, nothing runs) for
   reference, blocked, chunked and tokamax called directly with a causal
   mask (its default kernel choice, and its `xla_chunked` path).
2. **Fused linear + softmax cross-entropy**:
   `tokamax.linear_softmax_cross_entropy_loss` against our chunked log-probs
   (`logprobs.logprobs_from_hidden` with `logits_chunk`): loss and gradient
   differences, then the compiled temporaries of the loss and its gradients at
   `--tokens` x `--vocab` (default 8,192 x 151,936, Qwen3's vocabulary).

  pip install tokamax==0.0.12
  python benchmarks/tokamax_compare.py
  python benchmarks/tokamax_compare.py --seq=16384 --hidden=2560

Results on the CPU: docs/gpu.md, "tokamax".
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from paraagent_jax.models import attention as attn
from paraagent_jax.learner import logprobs
from paraagent_jax.models import qwen3


def temp_mib(fn, *args) -> float:
  """Compiled temporaries of `jax.jit(fn)(*args)`, in MiB (compile only)."""
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled.memory_analysis().temp_size_in_bytes / 2**20


def with_grads(fn):
  """The gradients of sum(fn(...)) with respect to every argument."""
  def g(*args):
    return jax.grad(lambda *a: jnp.sum(fn(*a)), argnums=tuple(range(len(args))))(*args)
  return g


def max_diff(a, b) -> float:
  return max(float(jnp.max(jnp.abs(x - y)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def attention_rows(args, tokamax):
  """(agreement line, memory rows) for the attention paths."""
  b, t, n, k, h = 2, 96, 4, 2, 16
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (b, t, n, h))
  kk = jax.random.normal(ks[1], (b, t, k, h))
  v = jax.random.normal(ks[2], (b, t, k, h))
  w = jax.random.normal(ks[3], (b, t, n, h))
  mask = np.ones((b, t), np.int32)
  mask[1, t - 20:] = 0
  real = jnp.asarray(mask)[:, :, None, None]

  def loss(impl):
    return lambda q, k, v: jnp.sum(attn.self_attention(
        q, k, v, attention_mask=mask, segment_ids=None, impl=impl,
        block=32) * w * real)

  want = jax.value_and_grad(loss("reference"), argnums=(0, 1, 2))(q, kk, v)
  got = jax.value_and_grad(loss("tokamax"), argnums=(0, 1, 2))(q, kk, v)
  agree = (f"attention (fp32, [{b},{t}] rows, {n} heads / {k} KV, one row "
           f"right-padded): tokamax - reference: loss {abs(float(got[0] - want[0])):.1e}, "
           f"grads {max_diff(got[1], want[1]):.1e}")

  t, n, k, h = args.seq, args.heads, args.kv_heads, args.head_dim
  sq = jax.ShapeDtypeStruct((1, t, n, h), jnp.float32)
  sk = jax.ShapeDtypeStruct((1, t, k, h), jnp.float32)
  full = jnp.ones((1, t), jnp.int32)
  ours = lambda impl: (lambda q, k, v: attn.self_attention(
      q, k, v, attention_mask=full, segment_ids=None, impl=impl, block=512))
  variants = [("reference (ours)", ours("reference")),
              ("blocked (ours)", ours("blocked")),
              ("chunked (ours)", ours("chunked")),
              ("tokamax (its default choice)", lambda q, k, v: tokamax.dot_product_attention(
                  q, k, v, is_causal=True)),
              ("tokamax xla_chunked", lambda q, k, v: tokamax.dot_product_attention(
                  q, k, v, is_causal=True, implementation="xla_chunked"))]
  rows = []
  for name, fn in variants:
    rows.append((name, temp_mib(fn, sq, sk, sk),
                 temp_mib(with_grads(fn), sq, sk, sk)))
  return agree, rows


def ce_rows(args, tokamax):
  """(agreement line, memory rows) for the fused linear + cross-entropy."""
  d, vocab, nt = 64, 1024, 512
  ks = jax.random.split(jax.random.key(1), 3)
  x = jax.random.normal(ks[0], (nt, d))
  wt = jax.random.normal(ks[1], (d, vocab)) * 0.1
  labels = jax.random.randint(ks[2], (nt,), 0, vocab)

  def ours(chunk):
    def f(x, wt, labels=labels):
      # h[:, t-1] predicts tokens[:, t]: prepend a dummy first token.
      tokens = jnp.concatenate([jnp.zeros((1,), labels.dtype), labels])[None]
      h = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])[None]
      lp = logprobs.logprobs_from_hidden(lambda z: z @ wt, h, tokens,
                                      chunk=chunk)
      return -jnp.sum(lp[0, 1:])
    return f

  def theirs(x, wt, labels=labels):
    return tokamax.linear_softmax_cross_entropy_loss(x, labels, wt,
                                                     reduction="sum")

  want = jax.value_and_grad(ours(128), argnums=(0, 1))(x, wt)
  got = jax.value_and_grad(theirs, argnums=(0, 1))(x, wt)
  agree = (f"cross-entropy ({nt} tokens, hidden {d}, vocab {vocab}): tokamax - "
           f"ours (chunked): loss {abs(float(got[0] - want[0])) / abs(float(want[0])):.1e} "
           f"relative, grads {max_diff(got[1], want[1]):.1e}")

  nt, d, vocab = args.tokens, args.hidden, args.vocab
  sx = jax.ShapeDtypeStruct((nt, d), jnp.float32)
  sw = jax.ShapeDtypeStruct((d, vocab), jnp.float32)
  big_labels = jnp.zeros((nt,), jnp.int32)
  variants = [
      (f"ours, logits_chunk={args.logits_chunk}", ours(args.logits_chunk)),
      ("ours, logits_chunk=0 (unchunked)", ours(0)),
      ("tokamax linear_softmax_cross_entropy_loss", theirs),
  ]
  rows = []
  for name, fn in variants:
    fn2 = lambda x, wt, fn=fn: fn(x, wt, big_labels)
    rows.append((name, temp_mib(fn2, sx, sw),
                 temp_mib(lambda x, wt, f=fn2: jax.grad(f, argnums=(0, 1))(x, wt),
                          sx, sw)))
  return agree, rows


def table(title, rows) -> str:
  out = [title, "", "| path | forward temporaries | forward + backward temporaries |",
         "|---|---|---|"]
  for name, fwd, both in rows:
    out.append(f"| {name} | {fwd:,.1f} MiB | {both:,.1f} MiB |")
  return "\n".join(out)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seq", type=int, default=8192, help="attention row length")
  ap.add_argument("--heads", type=int, default=32)
  ap.add_argument("--kv_heads", type=int, default=8)
  ap.add_argument("--head_dim", type=int, default=128)
  ap.add_argument("--tokens", type=int, default=8192, help="cross-entropy rows")
  ap.add_argument("--hidden", type=int, default=2560)
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--logits_chunk", type=int, default=512)
  args = ap.parse_args(argv)
  for name in ("seq", "heads", "kv_heads", "head_dim", "tokens", "hidden",
               "vocab", "logits_chunk"):
    if getattr(args, name) < 1:
      ap.error(f"--{name} must be >= 1")
  if args.heads % args.kv_heads:
    ap.error("--heads must be a multiple of --kv_heads")
  try:
    tokamax = attn.import_tokamax()
  except ImportError as e:
    print(f"tokamax_compare: {e}", file=sys.stderr)
    return 2
  jax.config.update("jax_default_matmul_precision", "highest")
  print(f"jax {jax.__version__} on {jax.default_backend()}, tokamax "
        f"{getattr(tokamax, '__version__', '?')}")
  agree, rows = attention_rows(args, tokamax)
  print(agree)
  agree_ce, rows_ce = ce_rows(args, tokamax)
  print(agree_ce)
  print()
  print(table(f"Attention, one row of {args.seq:,} tokens, {args.heads} heads / "
              f"{args.kv_heads} KV heads of {args.head_dim}, fp32 (compiled, "
              "not run):", rows))
  print()
  print(table(f"Cross-entropy, {args.tokens:,} tokens x hidden {args.hidden:,} "
              f"x vocab {args.vocab:,}, fp32 (compiled, not run):", rows_ce))
  return 0


if __name__ == "__main__":
  sys.exit(main())
