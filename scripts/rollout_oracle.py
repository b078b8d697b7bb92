"""The oracle through the model's text path (render -> tokenise -> parse -> env).

    .venv/bin/python scripts/rollout_oracle.py                 # 200 per kind, split, strategy
    .venv/bin/python scripts/rollout_oracle.py --n 20 --catalog procedural

Unlike `toolenv.oracle` alone, every step here goes through
`paraagent_jax.paraact`: `OraclePolicy` writes the strategy's step text, the
rollout tokenises it with a BPE tokenizer trained on the episodes' text (as
the demo's is), parses it back and steps a `VectorToolEnv`. For each strategy,
split and task kind it prints the trajectory success rate, mean turns and
parse errors; the exit status is 1 unless every episode succeeded with no
parse error and no truncation. This is the acceptance check of the ParaAct
protocol issue (issue 5); `tests/paraact/test_rollout.py` runs a smaller version.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tempfile  # noqa: E402  pylint: disable=wrong-import-position

# pylint: disable=g-import-not-at-top,wrong-import-position
import toolenv  # noqa: E402
from paraagent_jax import tokenizer as tok_lib  # noqa: E402
from paraagent_jax.paraact import chat_format, policies, protocol, rollout, strategies  # noqa: E402
# pylint: enable=g-import-not-at-top,wrong-import-position


def train_tokenizer(tasks, out_dir: str, vocab_size: int = 2048):
  """A BPE on the system prompts, instructions and oracle steps of ``tasks``."""
  texts = []
  for name in toolenv.oracle.STRATEGIES:
    strat = strategies.get_strategy(name)
    texts.append(strat.system_prompt())
    for t in tasks[:200]:
      texts += [strat.render_step(s) for s in toolenv.oracle.solve(t, name)]
  texts += [t.instruction for t in tasks]
  texts.append(protocol.system_prompt())
  return tok_lib.train_bpe_tokenizer(texts, vocab_size=vocab_size, out_dir=out_dir)


def main(argv=None) -> int:
  """Runs the table; returns the exit status."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--n", type=int, default=200, help="tasks per kind and split")
  ap.add_argument("--catalog", default="procedural")
  ap.add_argument("--batch", type=int, default=250, help="episodes per rollout batch")
  ap.add_argument("--strategies", default=",".join(toolenv.oracle.STRATEGIES))
  args = ap.parse_args(argv)
  t0 = time.time()
  cat = toolenv.load_catalog(args.catalog, seed=0)
  gen = toolenv.TaskGenerator(cat, seed=0)
  tasks = {(split, kind): [gen.task(i, split, kind) for i in range(args.n)]
           for split in toolenv.tasks.SPLITS for kind in toolenv.tasks.KINDS}
  with tempfile.TemporaryDirectory() as d:
    tok = train_tokenizer([t for ts in tasks.values() for t in ts], d)
  config = rollout.RolloutConfig(max_turns=24, max_len=16384, max_obs_tokens=4000,
                                 max_turn_tokens=2048)
  print(f"{'strategy':<13}{'split':<7}{'kind':<10}{'success':>8}{'turns':>7}"
        f"{'parse_err':>10}{'trunc':>6}")
  ok = True
  for name in args.strategies.split(","):
    fmt = chat_format.ChatFormat(tok, name)
    for (split, kind), ts in tasks.items():
      eps = []
      for b in range(0, len(ts), args.batch):
        chunk = ts[b:b + args.batch]
        env = toolenv.VectorToolEnv(cat, len(chunk), **toolenv.oracle.env_options(name))
        eps += rollout.run_rollout(policies.OraclePolicy(fmt, name), env, chunk, fmt,
                                   config).episodes
      agg = collections.Counter()
      for e in eps:
        agg["success"] += float(e["success"])
        agg["turns"] += e["turns"]
        agg["parse"] += e["parse_errors"]
        agg["trunc"] += bool(e["truncated"])
      n = len(eps)
      ok &= agg["success"] == n and agg["parse"] == 0 and agg["trunc"] == 0
      print(f"{name:<13}{split:<7}{kind:<10}{agg['success'] / n:>8.3f}"
            f"{agg['turns'] / n:>7.2f}{int(agg['parse']):>10}{int(agg['trunc']):>6}",
            flush=True)
  print(f"{'all succeeded' if ok else 'FAILURES'} ({time.time() - t0:.0f}s)")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
