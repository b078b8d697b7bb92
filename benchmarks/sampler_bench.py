"""Greedy generation throughput: our JAX sampler vs transformers `generate` (torch CPU).

Same model config on both sides (the "demo" size: 4 layers, hidden 256, 4 heads,
2 KV heads, head_dim 64, intermediate 768, vocab 4096), the same random weights (a
transformers model is saved and loaded through `hf_io.load_hf`), the same prompts,
greedy decoding with early stopping disabled (no EOS, exactly `--new_tokens` per row).
Compile time is measured on a warm-up call and reported apart; throughput is the
best of `--repeats` timed calls (prefill + decode, host to host).

  .venv/bin/python benchmarks/sampler_bench.py
  .venv/bin/python benchmarks/sampler_bench.py --batches=8,32 --repeats=3
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import torch
import transformers

from paraagent_jax import sampling
try:
  from paraagent_jax.models import hf_io
except ImportError:  # hf_io not landed yet: same weights copied from torch.
  hf_io = None


def _hf_model(seed: int) -> transformers.Qwen3ForCausalLM:
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(
      vocab_size=4096, hidden_size=256, intermediate_size=768,
      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
      head_dim=64, tie_word_embeddings=True, max_position_embeddings=4096,
      bos_token_id=None, eos_token_id=None, pad_token_id=None)
  return transformers.Qwen3ForCausalLM(config).eval()


def _time_hf(hf, prompts: np.ndarray, new_tokens: int, repeats: int):
  """Best wall time of transformers greedy generate, and its generated tokens."""
  ids = torch.tensor(prompts)
  kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                pad_token_id=0, eos_token_id=None, use_cache=True)
  with torch.no_grad():
    hf.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
    best, out = float("inf"), None
    for _ in range(repeats):
      start = time.perf_counter()
      out = hf.generate(ids, **kwargs)
      best = min(best, time.perf_counter() - start)
  return best, out[:, prompts.shape[1]:].numpy()


def _time_ours(model, prompts: np.ndarray, new_tokens: int, repeats: int):
  """Compile time, best wall time and tokens of our sampler (prefill + decode)."""
  batch, plen = prompts.shape
  sampler = sampling.Sampler(model, batch, plen + new_tokens)
  rows = prompts.tolist()

  def run():
    state = sampler.prefill(rows)
    return sampler.generate(state, new_tokens)

  start = time.perf_counter()
  out = run()
  first = time.perf_counter() - start
  compile_s = out.state.stats.compile_seconds
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out = run()  # returns numpy arrays: the device work is finished
    best = min(best, time.perf_counter() - start)
  assert out.state.stats.compilations == 0, "timed calls recompiled"
  return compile_s, first, best, out.tokens


def main(argv=None) -> None:
  """Runs the comparison and prints a table of tokens/s."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="8,32")
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--threads", type=int, default=os.cpu_count(),
                      help="torch intra-op threads (JAX uses all cores)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  torch.set_num_threads(args.threads)

  hf = _hf_model(args.seed)
  if hf_io is None:
    from tests.test_sampling import _from_torch
    model = _from_torch(hf)
  else:
    with tempfile.TemporaryDirectory() as tmp:
      hf.save_pretrained(tmp)
      model = hf_io.load_hf(tmp)
  print(f"jax {jax.__version__} ({jax.default_backend()}, "
        f"{jax.device_count()} devices), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}; prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, greedy, best of {args.repeats}")

  rows = []
  rs = np.random.RandomState(args.seed)
  for batch in [int(b) for b in args.batches.split(",")]:
    prompts = rs.randint(0, 4096, (batch, args.prompt_len)).astype(np.int64)
    hf_s, hf_tok = _time_hf(hf, prompts, args.new_tokens, args.repeats)
    compile_s, first_s, ours_s, our_tok = _time_ours(
        model, prompts, args.new_tokens, args.repeats)
    n = batch * args.new_tokens
    agree = float((hf_tok == our_tok).mean())
    rows.append((batch, n / hf_s, n / ours_s, hf_s / ours_s, compile_s,
                 first_s, agree))

  header = ("batch", "transformers tok/s", "ours tok/s", "ratio",
            "our compile s", "our 1st call s", "same tokens")
  print("| " + " | ".join(header) + " |")
  print("|" + "|".join("---" for _ in header) + "|")
  for batch, hf_tps, tps, ratio, comp, first, agree in rows:
    print(f"| {batch} | {hf_tps:,.0f} | {tps:,.0f} | {ratio:.2f}x | {comp:.2f} | "
          f"{first:.2f} | {agree:.1%} |")


if __name__ == "__main__":
  main()
