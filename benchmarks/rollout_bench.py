"""Rollout throughput and where the time goes: model vs parsing vs environment.

A batch of episodes (default 32: 16 tasks x 2 samples) runs to the end through
`paraact.rollout.run_rollout` with the CPU demo model ("demo" preset: 4 layers,
hidden 256, vocab 4096, random weights), sampling at temperature 1 with a cap
on new tokens per turn. A random model never answers, so every episode runs
until max turns or the token budget: the worst case for the model's share.
The scripted oracle runs the same tasks as the peer row (text path and
environment only: what parsing and ToolEnv cost without a model).

The first model rollout compiles the sampler's programs; it is reported apart
(warm-up) and the timed figure is the best of `--repeats` later rollouts.

  .venv/bin/python benchmarks/rollout_bench.py
  .venv/bin/python benchmarks/rollout_bench.py --batch=32 --turn_tokens=32 --repeats=2
  .venv/bin/python benchmarks/rollout_bench.py --oracle_tasks=200   # acceptance check:
      oracle success per strategy, split and task kind through the text path
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from flax import nnx
import numpy as np

import toolenv
from toolenv.catalog import procedural
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.models import qwen3
from paraagent_jax.paraact import chat_format, policies, protocol, rollout, strategies


def _tokenizer(gen, catalog, vocab: int):
  """A demo-sized BPE trained on protocol text, tasks and tool docs."""
  texts = [protocol.system_prompt()] * 20
  for strat in toolenv.oracle.STRATEGIES:
    s = strategies.get_strategy(strat)
    for task in gen.generate(100, "train"):
      texts.append(task.instruction)
      texts += [s.render_step(x) for x in toolenv.oracle.solve(task, strat)]
  texts += [f"{t.name}: {t.description}" for t in list(catalog)[:2000]]
  return tok_lib.train_bpe_tokenizer(texts, vocab_size=vocab)


def _row(name, res, n_ep):
  t = res.timing
  total = t["total_s"]
  gen_tokens = int(res.arrays["loss_mask"].sum())
  all_tokens = int(res.arrays["seq_len"].sum())
  other = t["parse_s"] + t["tokenize_s"]
  return (f"{name:<14} {n_ep / total:>8.2f} {gen_tokens / total:>9.1f} {all_tokens / total:>9.1f} "
          f"{100 * t['policy_s'] / total:>6.1f}% {100 * other / total:>6.1f}% "
          f"{100 * t['env_s'] / total:>6.1f}% {100 * (other + t['env_s']) / total:>8.1f}% "
          f"{total:>7.2f}s")


def oracle_check(n: int) -> None:
  """Oracle success on ``n`` tasks per split under every strategy (text path)."""
  catalog = procedural.build_catalog(seed=0, size=3000)
  gen = toolenv.TaskGenerator(catalog, seed=0)
  tok = _tokenizer(gen, catalog, 1024)
  config = rollout.RolloutConfig(max_turns=16, max_len=16384, max_obs_tokens=2000)
  for strat in toolenv.oracle.STRATEGIES:
    fmt = chat_format.ChatFormat(tok, strat)
    for split in ("train", "test"):
      tasks = gen.generate(n, split)
      env = toolenv.VectorToolEnv(catalog, len(tasks), **toolenv.oracle.env_options(strat))
      res = rollout.run_rollout(policies.OraclePolicy(fmt, strat), env, tasks, fmt, config)
      kinds: dict[str, list[bool]] = {}
      for e in res.episodes:
        kinds.setdefault(e["kind"], []).append(e["success"])
      print(f"{strat:<13} {split:<5} success {sum(e['success'] for e in res.episodes)}/{n} "
            + " ".join(f"{k}:{sum(v)}/{len(v)}" for k, v in kinds.items())
            + f" parse_errors {sum(e['parse_errors'] for e in res.episodes)}")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--group", type=int, default=2)
  ap.add_argument("--strategy", default="paraact")
  ap.add_argument("--turn_tokens", type=int, default=32)
  ap.add_argument("--max_turns", type=int, default=4)
  ap.add_argument("--max_len", type=int, default=1024)
  ap.add_argument("--obs_tokens", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--oracle_tasks", type=int, default=0,
                  help="if > 0: only run the oracle success check on this many tasks")
  args = ap.parse_args()
  if args.oracle_tasks > 0:
    oracle_check(args.oracle_tasks)
    return

  catalog = procedural.build_catalog(seed=0, size=3000)
  gen = toolenv.TaskGenerator(catalog, seed=0)
  tok = _tokenizer(gen, catalog, 4096)
  fmt = chat_format.ChatFormat(tok, args.strategy)
  cfg = qwen3.Qwen3Config.preset("demo", vocab_size=len(tok))
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  tasks = [t for t in gen.generate(args.batch // args.group, "train")
           for _ in range(args.group)]
  groups = [i // args.group for i in range(len(tasks))]
  config = rollout.RolloutConfig(max_turns=args.max_turns, max_turn_tokens=args.turn_tokens,
                                 max_len=args.max_len, max_obs_tokens=args.obs_tokens)
  env = toolenv.VectorToolEnv(catalog, len(tasks), **toolenv.oracle.env_options(args.strategy))
  policy = policies.JaxPolicy(model, fmt, max_len=args.max_len,
                              max_turn_tokens=args.turn_tokens, temperature=1.0)

  start = time.perf_counter()
  rollout.run_rollout(policy, env, tasks, fmt, config, group_ids=groups, seed=0)
  warm = time.perf_counter() - start
  best = None
  for r in range(args.repeats):
    res = rollout.run_rollout(policy, env, tasks, fmt, config, group_ids=groups, seed=r + 1)
    if best is None or res.timing["total_s"] < best.timing["total_s"]:
      best = res
  oracle_cfg = rollout.RolloutConfig(max_turns=16, max_len=8192, max_obs_tokens=args.obs_tokens)
  oracle = rollout.run_rollout(policies.OraclePolicy(fmt, args.strategy), env, tasks, fmt,
                               oracle_cfg, group_ids=groups)

  st = best.policy_stats
  print(f"batch {len(tasks)} ({len(tasks) // args.group} tasks x {args.group}), strategy "
        f"{args.strategy}, demo model ({cfg.num_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {cfg.vocab_size}), <= {args.turn_tokens} new tokens/turn, "
        f"{args.max_turns} turns, max_len {args.max_len}")
  print(f"warm-up rollout (compiles): {warm:.1f}s; timed rollout compilations: "
        f"{st.get('compilations', 0)}")
  print(f"{'policy':<14} {'ep/s':>8} {'gen tok/s':>9} {'all tok/s':>9} {'model':>7} "
        f"{'parse':>7} {'env':>7} {'env+parse':>9} {'wall':>8}")
  print(_row("jax demo", best, len(tasks)))
  print(_row("oracle (peer)", oracle, len(tasks)))
  print(f"model rollout: {np.mean([e['turns'] for e in best.episodes]):.1f} turns/episode, "
        f"{np.mean([e['parse_errors'] for e in best.episodes]):.1f} parse errors/episode, "
        f"truncated {int(best.arrays['truncated'].sum())}/{len(tasks)}; sampler: "
        f"{st.get('prefill_tokens', 0)} prefilled, {st.get('decode_tokens', 0)} decoded, "
        f"{st.get('decode_steps', 0)} decode steps")
  print(f"oracle rollout: success {np.mean([e['success'] for e in oracle.episodes]):.0%}")


if __name__ == "__main__":
  main()
