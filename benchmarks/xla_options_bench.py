"""XLA compiler options against each other on our sampler, in one process.

`benchmarks/sampler_bench.py`'s model and greedy call (demo size, random
weights, fp32, prompt 64, 128 new tokens, pinned to `--threads` CPUs), once per
variant: each variant is a set of XLA options (the names of XLA_FLAGS without
the dashes) given to `Sampler(compiler_options=...)`, so every variant is
compiled in the same process and the timed calls alternate between them.
Timing variants in separate processes (`XLA_FLAGS=... python sampler_bench.py`)
lets this machine's drift (up to ~1.5x over a day, and ~10% between two runs
minutes apart) land on one variant; alternating calls in one process does not.

The first variant is the baseline, and the default set times it twice
("default, again"), so the table shows the noise floor next to the options.
"same tokens" compares each variant's tokens with the first's: an option that
changes the arithmetic (fast math) shows there.

  python benchmarks/xla_options_bench.py
  python benchmarks/xla_options_bench.py --batch=8 --repeats=11
  python benchmarks/xla_options_bench.py --variants='{"default": {},
      "vw512": {"xla_cpu_prefer_vector_width": 512}}'

Repeated enum options take the full enum names, comma-separated
("LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"), and an
empty string clears the list (e.g. no YNNPACK dots: XLA's own then).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import sampler_bench  # pins the process to --threads CPUs (read from argv)

from paraagent_jax import sampling

_YNN = "xla_cpu_experimental_ynn_fusion_type"
DEFAULT_VARIANTS = {
    "default": {},
    "default, again": {},
    "YNNPACK dots + reduces": {
        _YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"},
    "YNNPACK dot fusions": {_YNN: "LIBRARY_FUSION_TYPE_DOT"},
    "XLA's own dots (no YNN/XNN)": {
        _YNN: "", "xla_cpu_experimental_xnn_fusion_type": ""},
    "oneDNN custom calls": {
        _YNN: "", "xla_cpu_experimental_onednn_custom_call": True},
    "512-bit vectors": {"xla_cpu_prefer_vector_width": 512},
}


def parse_variants(text: str | None) -> dict:
  """--variants: a JSON object {name: {xla option: value}}; None: the defaults."""
  if not text:
    return dict(DEFAULT_VARIANTS)
  try:
    variants = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"--variants is not JSON: {e}") from None
  if not isinstance(variants, dict) or not variants or not all(
      isinstance(v, dict) for v in variants.values()):
    raise ValueError("--variants must be a non-empty JSON object of "
                     '{"name": {"xla_option": value, ...}, ...}')
  for name, opts in variants.items():
    for key, val in opts.items():
      if not key.startswith("xla_") or not isinstance(val, (str, int, float,
                                                            bool)):
        raise ValueError(f"variant {name!r}: option {key!r}={val!r} is not an "
                         "XLA option name (xla_...) with a scalar value")
  return variants


def main(argv=None) -> None:
  """Prints CPU seconds per call of each variant, interleaved."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=9)
  parser.add_argument("--threads", type=int, default=1,
                      help="CPUs to pin to (read at import, as sampler_bench)")
  parser.add_argument("--variants", default=None,
                      help="JSON {name: {xla option: value}}; default: a set "
                      "of dot libraries and code-generation options")
  args = parser.parse_args(argv)
  try:
    variants = parse_variants(args.variants)
  except ValueError as e:
    parser.error(str(e))   # usage + message, exit 2, before any work

  model = sampler_bench.jax_model_of(sampler_bench._hf_model(0))  # pylint: disable=protected-access
  rows = sampler_bench.prompt_rows(model.config.vocab_size, args.batch,
                                   args.prompt_len)

  runners, compile_s, stats = [], [], []
  for name, opts in variants.items():
    sampler = sampling.Sampler(model, args.batch,
                               args.prompt_len + args.new_tokens,
                               compiler_options=opts)

    def run(sampler=sampler):
      out = sampler.generate(sampler.prefill(rows), args.new_tokens)
      stats.append(out.state.stats)
      return out.tokens

    run()
    compile_s.append(stats[-1].compile_seconds)
    runners.append(run)
    print(f"compiled {name!r} in {compile_s[-1]:.1f} s", flush=True)
  n_compiled = len(stats)
  _, cpu, _, outs, _ = sampler_bench._timed_interleaved(  # pylint: disable=protected-access
      runners, args.repeats)
  assert all(s.compilations == 0 for s in stats[n_compiled:]), "recompiled"

  print(f"batch {args.batch}, prompt {args.prompt_len}, {args.new_tokens} new "
        f"tokens, greedy, fp32; median CPU s of {args.repeats} interleaved "
        f"calls; pinned to CPUs {sampler_bench._CPUS}; "  # pylint: disable=protected-access
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  header = ("variant", "options", "CPU s/call", "speed vs first",
            "same tokens as first", "compile s")
  print("| " + " | ".join(header) + " |")
  print("|" + "|".join("---" for _ in header) + "|")
  for (name, opts), c, out, comp in zip(variants.items(), cpu, outs,
                                        compile_s):
    shown = ", ".join(f"{k}={v!r}" for k, v in opts.items()) or "-"
    print(f"| {name} | {shown} | {c:.3f} | {cpu[0] / c:.2f}x | "
          f"{float((out == outs[0]).mean()):.1%} | {comp:.1f} |")


if __name__ == "__main__":
  main()
