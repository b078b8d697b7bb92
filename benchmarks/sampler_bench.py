"""Greedy generation throughput: our JAX sampler vs transformers `generate` (torch CPU).

Same model config on both sides (the "demo" size: 4 layers, hidden 256, 4 heads,
2 KV heads, head_dim 64, intermediate 768, vocab 4096), the same random weights (a
transformers model is saved and loaded through `hf_io.load_hf`), the same prompts,
greedy decoding with early stopping disabled (no EOS, exactly `--new_tokens` per row).
Compile time is measured on a warm-up call and reported apart; throughput is the
median of `--repeats` timed calls (prefill + decode, host to host), the two
sides' calls alternating so that outside load on the shared machine hits both
alike. The table also gives the ratio of median process CPU seconds per call,
which outside load disturbs much less than wall time, and the ratio of each
pair of calls timed back to back (median, min and max over the pairs): how far
the ratio moves within the run, so a reader can tell a ratio below a target
from noise around it.

Both sides get the same cores, `--threads` (default 1): the process is pinned
to that many CPUs (`os.sched_setaffinity`, before JAX and torch start, so XLA
sizes its worker pool to them), torch gets as many intra-op threads, and with
one thread XLA's Eigen matmuls are single-threaded (`XLA_FLAGS`). Without the
pinning XLA ran its thunks on 2 worker threads while torch had 1 (measured:
CPU seconds above wall seconds on our side), which flattered our wall-clock
ratio. One thread is the default because the machine is shared: with 2
threads on 2 busy cores, torch's OpenMP workers wait on each other and its
generate gets 10-20x slower (measured), which would flatter us too. Both sides
compute in fp32. The load average is printed before and after the run.

  .venv/bin/python benchmarks/sampler_bench.py
  .venv/bin/python benchmarks/sampler_bench.py --batches=8,32 --repeats=5
  .venv/bin/python benchmarks/sampler_bench.py --threads=2   # a quiet machine
  .venv/bin/python benchmarks/sampler_bench.py --cache_steps=1   # no cache growth
  .venv/bin/python benchmarks/sampler_bench.py --hf_device=cuda   # on a GPU, torch with CUDA

On a GPU our sampler runs on the GPU. `--hf_device` says where transformers
runs: "cpu" (the default), "cuda" (torch with CUDA; then the comparison is like
for like), or "none" (time our side only: a GPU against a CPU is no
comparison). On a recent NVIDIA GPU JAX runs fp32 matmuls in TF32 by default
and torch does not, so "same tokens" can fall below 100% there without a bug
(`JAX_DEFAULT_MATMUL_PRECISION=highest` makes our side full fp32).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _threads_from_argv(argv) -> int:
  """--threads, read before JAX is imported (XLA reads its flags at start)."""
  for i, a in enumerate(argv):
    if a.startswith("--threads="):
      return int(a.split("=", 1)[1])
    if a == "--threads" and i + 1 < len(argv):
      return int(argv[i + 1])
  return 1


_THREADS = _threads_from_argv(sys.argv[1:])
# Pinning before JAX starts: XLA sizes its CPU worker pool to the affinity set.
_CPUS = sorted(os.sched_getaffinity(0))[:max(1, _THREADS)]
os.sched_setaffinity(0, _CPUS)
if _THREADS == 1 and "multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_cpu_multi_thread_eigen=false").strip()

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import torch
import transformers

from paraagent_jax import sampling
from paraagent_jax.models import hf_io


def _hf_model(seed: int) -> transformers.Qwen3ForCausalLM:
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(
      vocab_size=4096, hidden_size=256, intermediate_size=768,
      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
      head_dim=64, tie_word_embeddings=True, max_position_embeddings=4096,
      bos_token_id=None, eos_token_id=None, pad_token_id=None)
  return transformers.Qwen3ForCausalLM(config).eval()


def jax_model_of(hf: transformers.Qwen3ForCausalLM):
  """Our model with `hf`'s weights, through a save and `hf_io.load_hf`."""
  with tempfile.TemporaryDirectory() as tmp:
    hf.save_pretrained(tmp)
    return hf_io.load_hf(tmp)


def prompt_rows(vocab: int, batch: int, prompt_len: int, seed: int = 0) -> list:
  """`batch` random prompts of `prompt_len` token ids, as lists."""
  return np.random.RandomState(seed).randint(
      0, vocab, (batch, prompt_len)).tolist()


def _hf_runner(hf, prompts: np.ndarray, new_tokens: int, device: str = "cpu"):
  """A warmed-up call of transformers greedy generate; returns its new tokens.

  The tokens come back to the host as numpy, so a CUDA call has finished when
  `run` returns.
  """
  ids = torch.tensor(prompts, device=device)
  kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                pad_token_id=0, eos_token_id=None, use_cache=True)

  def run():
    with torch.no_grad():
      out = hf.generate(ids, **kwargs)
    return out[:, prompts.shape[1]:].cpu().numpy()

  with torch.no_grad():
    hf.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
  return run


def _our_runner(model, prompts: np.ndarray, new_tokens: int,
                cache_steps=None):
  """Our sampler (prefill + decode), compiled by a first call.

  `cache_steps`: the Sampler's (None: its default).

  Returns (run, compile seconds, first-call seconds); `run` returns the tokens as
  numpy, so the device work is finished when it returns.
  """
  batch, plen = prompts.shape
  sampler = sampling.Sampler(model, batch, plen + new_tokens,
                             cache_steps=cache_steps)
  rows = prompts.tolist()
  last = {}

  def run():
    out = sampler.generate(sampler.prefill(rows), new_tokens)
    last["stats"] = out.state.stats
    return out.tokens

  start = time.perf_counter()
  run()
  first = time.perf_counter() - start
  return run, last["stats"].compile_seconds, first, last


def _timed_interleaved(runners, repeats: int):
  """Median wall and CPU seconds of each runner, alternating the runners.

  The machine is shared: timing all calls of one side and then all of the other
  lets a burst of outside load land on one side only.
  """
  wall = [[] for _ in runners]
  cpu = [[] for _ in runners]
  outs = [None] * len(runners)
  for _ in range(repeats):
    for i, run in enumerate(runners):
      start, start_cpu = time.perf_counter(), time.process_time()
      outs[i] = run()
      wall[i].append(time.perf_counter() - start)
      cpu[i].append(time.process_time() - start_cpu)
  return ([statistics.median(w) for w in wall],
          [statistics.median(c) for c in cpu], [min(w) for w in wall], outs,
          wall)


def pair_ratios(slow_s, fast_s) -> tuple:
  """(median, min, max) of slow_s[i] / fast_s[i], the calls timed back to back.

  A ratio of two medians hides how much the ratio moves within a run; the
  ratio of each pair of alternating calls does not (this machine's speed
  drifts over minutes, so two calls side by side see the same machine).
  """
  if len(slow_s) != len(fast_s) or not slow_s:
    raise ValueError(f"need equal, non-empty timings: {len(slow_s)} and "
                     f"{len(fast_s)}")
  r = [a / b for a, b in zip(slow_s, fast_s)]
  return statistics.median(r), min(r), max(r)


def main(argv=None) -> None:
  """Runs the comparison and prints a table of tokens/s."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="8,32")
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--threads", type=int, default=1,
                      help="threads of each side (torch intra-op; XLA: 1 or "
                      "all cores)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--hf_device", choices=("cpu", "cuda", "none"),
                      default="cpu", help="where transformers generate runs; "
                      "none: time our sampler only")
  parser.add_argument("--cache_steps", type=int, default=None,
                      help="the Sampler's cache_steps (default: its own; 1: "
                      "the whole cache from the start)")
  args = parser.parse_args(argv)
  torch.set_num_threads(args.threads)

  hf = _hf_model(args.seed)
  model = jax_model_of(hf)
  if args.hf_device != "none":
    hf = hf.to(args.hf_device)
  load_before = os.getloadavg()
  print(f"jax {jax.__version__} ({jax.default_backend()}, "
        f"{jax.device_count()} devices), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__} ("
        f"{'not timed' if args.hf_device == 'none' else 'on ' + args.hf_device}); prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, greedy, median of {args.repeats}; "
        f"pinned to CPUs {_CPUS}; cache_steps={args.cache_steps}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")

  rows = []
  rs = np.random.RandomState(args.seed)
  for batch in [int(b) for b in args.batches.split(",")]:
    prompts = rs.randint(0, 4096, (batch, args.prompt_len)).astype(np.int64)
    our_run, compile_s, first_s, last = _our_runner(
        model, prompts, args.new_tokens, args.cache_steps)
    n = batch * args.new_tokens
    if args.hf_device == "none":
      (ours_s,), (our_cpu,), _, _, _ = _timed_interleaved([our_run],
                                                          args.repeats)
      assert last["stats"].compilations == 0, "timed calls recompiled"
      rows.append((batch, None, n / ours_s, None, None, None, None, our_cpu,
                   compile_s, first_s, None))
      continue
    hf_run = _hf_runner(hf, prompts, args.new_tokens, args.hf_device)
    ((hf_s, ours_s), (hf_cpu, our_cpu), (hf_min, our_min), (hf_tok, our_tok),
     (hf_walls, our_walls)) = _timed_interleaved([hf_run, our_run],
                                                 args.repeats)
    assert last["stats"].compilations == 0, "timed calls recompiled"
    agree = float((hf_tok == our_tok).mean())
    rows.append((batch, n / hf_s, n / ours_s, hf_s / ours_s, hf_min / our_min,
                 pair_ratios(hf_walls, our_walls), hf_cpu, our_cpu, compile_s,
                 first_s, agree))

  header = ("batch", "transformers tok/s", "ours tok/s", "ratio (median)",
            "ratio (best)", "ratio per call pair (median [min, max])",
            "CPU s/call (transformers / ours)", "ratio (CPU s)",
            "our compile s", "our 1st call s", "same tokens")
  print("| " + " | ".join(header) + " |")
  print("|" + "|".join("---" for _ in header) + "|")
  for (batch, hf_tps, tps, ratio, best, pairs, hf_cpu, our_cpu, comp, first,
       agree) in rows:
    if hf_tps is None:   # --hf_device=none: our side only
      print(f"| {batch} | - | {tps:,.0f} | - | - | - | - / {our_cpu:.2f} | - | "
            f"{comp:.2f} | {first:.2f} | - |")
      continue
    print(f"| {batch} | {hf_tps:,.0f} | {tps:,.0f} | {ratio:.2f}x | {best:.2f}x | "
          f"{pairs[0]:.2f}x [{pairs[1]:.2f}, {pairs[2]:.2f}] | "
          f"{hf_cpu:.2f} / {our_cpu:.2f} | {hf_cpu / our_cpu:.2f}x | {comp:.2f} | "
          f"{first:.2f} | {agree:.1%} |")
  load_after = os.getloadavg()
  print("load average (1, 5, 15 min) before: " +
        ", ".join(f"{x:.2f}" for x in load_before) + "; after: " +
        ", ".join(f"{x:.2f}" for x in load_after) +
        f"; {os.cpu_count()} CPUs on the machine")


if __name__ == "__main__":
  main()
