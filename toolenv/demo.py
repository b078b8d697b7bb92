"""The quickest look at ToolEnv: one task, its oracle episode, its rewards.

    python -m toolenv.demo [--kind mixed --split test --seed 0 --strategy paraact]

Prints the task (instruction, gold DAG, gold answer values), then plays the
oracle's steps through `VectorToolEnv` one by one (phase, thought, calls and
the observation the agent would read), then the reward parts at each level:
the step rewards, the phase segments with their rewards, the trajectory
reward and whether the episode succeeded.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

import toolenv
from toolenv import oracle
from toolenv.schema import EpisodeRewards
from toolenv.tasks import KINDS, SPLITS


def _args_text(args: Any) -> str:
  return json.dumps(args, ensure_ascii=False, default=str)


def _indent(text: str, prefix: str = "      ") -> str:
  return "\n".join(prefix + line for line in text.splitlines())


def print_task(task: toolenv.Task) -> None:
  """Writes the instruction, the gold DAG and the gold answer values."""
  print(f"Task {task.id}  (kind {task.kind}, split {task.split}, "
        f"max {task.max_turns} turns, writes: {task.writes})")
  print(f"Instruction: {task.instruction}")
  print("Gold DAG (level: node tool(arguments) <- deps):")
  for n in task.nodes:
    deps = f" <- {', '.join(n['deps'])}" if n["deps"] else ""
    late = "  [need appears late]" if n["late"] else ""
    print(f"  L{n['level']}: {n['id']} {n['tool']}({_args_text(n['arguments'])}){deps}{late}")
  print("Gold answer values: " + "; ".join(
      f"{a['label']} = {a['value']}" for a in task.answers))


def run_episode(catalog, task: toolenv.Task, strategy: str = "paraact") -> EpisodeRewards:
  """Plays the oracle for ``task`` step by step, printing each; returns the rewards."""
  env = toolenv.VectorToolEnv(catalog, num_envs=1, **oracle.env_options(strategy))
  print(f"\nEpisode ({strategy} oracle)")
  print(_indent(env.reset([task])[0], "  > "))
  for t, step in enumerate(oracle.solve(task, strategy=strategy)):
    if env.done[0]:
      break
    res = env.step([step])[0]
    print(f"\nTurn {t + 1} [{step.phase}] {step.thought}")
    if step.phase == "answer":
      print(f"  answer: {step.answer}")
    for call in step.calls:
      print(f"  call: {call.name}({_args_text(call.arguments)})")
    print(f"  observation:\n{_indent(res.observation)}")
    print(f"  step reward: {res.reward:+.3f}")
  return env.rewards(0)


def print_rewards(parts: EpisodeRewards) -> None:
  """Writes the reward parts at the three levels."""
  print("\nRewards")
  print("  step:       [" + ", ".join(f"{r:+.3f}" for r in parts.step) + "]")
  print("  phase:      " + ", ".join(f"{p} {r:.3f}" for p, r in parts.phase))
  print(f"  trajectory: {parts.trajectory:.4f}")
  print(f"  success:    {parts.success}  ({parts.turns} turns, "
        f"{parts.completed}/{parts.nodes} gold nodes completed)")


def main(argv: Sequence[str] | None = None) -> int:
  """Command-line entry point; returns the exit status (0 on oracle success)."""
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--kind", default="mixed", choices=KINDS)
  ap.add_argument("--split", default="test", choices=SPLITS)
  ap.add_argument("--seed", type=int, default=0, help="TaskGenerator seed")
  ap.add_argument("--index", type=int, default=0, help="task number within the kind")
  ap.add_argument("--strategy", default="paraact", choices=oracle.STRATEGIES)
  ap.add_argument("--catalog-seed", type=int, default=0)
  a = ap.parse_args(argv)
  cat = toolenv.load_catalog("procedural", seed=a.catalog_seed)
  task = toolenv.TaskGenerator(cat, seed=a.seed).task(a.index, a.split, a.kind)
  print_task(task)
  parts = run_episode(cat, task, a.strategy)
  print_rewards(parts)
  return 0 if parts.success else 1


if __name__ == "__main__":
  sys.exit(main())
