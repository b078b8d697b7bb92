"""Paired comparison of two policies on the same tasks (McNemar's exact test).

Both policies are evaluated greedily on the same held-out tasks, so their
successes are paired: what decides whether one is better is how many tasks
only one of them solves (the discordant pairs), not the two rates alone.
McNemar's exact test asks whether those discordant pairs split more
unevenly than a fair coin would: under "no difference" the tasks only B
solves are Binomial(only_a + only_b, 1/2).

    python -m paraagent_jax.evaluation.paired A.jsonl B.jsonl

reads two per-task files (JSON lines with ``task_id`` and ``success``, as
the RL stage writes ``eval_before.jsonl`` / ``eval_after.jsonl``) and prints
the comparison.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Mapping, Sequence

from paraagent_jax import fileio


def mcnemar_exact(only_a: int, only_b: int) -> float:
  """Two-sided exact McNemar p-value for the discordant counts."""
  n = only_a + only_b
  if n == 0:
    return 1.0
  k = min(only_a, only_b)
  tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
  return min(1.0, 2.0 * tail)


def paired_comparison(a: Mapping[str, bool], b: Mapping[str, bool],
                      names: Sequence[str] = ("a", "b")) -> dict:
  """Rates, discordant counts and McNemar's p of per-task successes.

  Args:
    a, b: task id -> success of each policy; only ids in both are compared.
    names: labels of a and b in the result's keys.

  Raises:
    ValueError: the two share no task.
  """
  ids = sorted(set(a) & set(b))
  if not ids:
    raise ValueError("the two evaluations share no task id")
  na, nb = names
  only_a = sum(bool(a[i]) and not b[i] for i in ids)
  only_b = sum(bool(b[i]) and not a[i] for i in ids)
  both = sum(bool(a[i]) and bool(b[i]) for i in ids)
  return {"tasks": len(ids),
          f"success_{na}": sum(bool(a[i]) for i in ids) / len(ids),
          f"success_{nb}": sum(bool(b[i]) for i in ids) / len(ids),
          f"only_{na}": only_a, f"only_{nb}": only_b, "both": both,
          "neither": len(ids) - only_a - only_b - both,
          "mcnemar_p": mcnemar_exact(only_a, only_b)}


def format_paired(result: Mapping, names: Sequence[str] = ("a", "b")) -> str:
  """One line: both rates, the discordant counts, the p-value."""
  na, nb = names
  return (f"{na} {result[f'success_{na}']:.1%} vs {nb} {result[f'success_{nb}']:.1%} "
          f"on {result['tasks']} paired tasks: {result[f'only_{nb}']} solved only by "
          f"{nb}, {result[f'only_{na}']} only by {na} (McNemar exact p = "
          f"{result['mcnemar_p']:.3g})")


def read_per_task(path: str) -> dict[str, bool]:
  """task id -> success from a per-task JSON-lines file."""
  out = {}
  with fileio.open(path) as f:
    for line in f:
      if line.strip():
        rec = json.loads(line)
        out[str(rec["task_id"])] = bool(rec["success"])
  return out


def main(argv: Sequence[str]) -> int:
  if len(argv) != 3:
    print("usage: python -m paraagent_jax.evaluation.paired A.jsonl B.jsonl",
          file=sys.stderr)
    return 2
  try:
    a, b = read_per_task(argv[1]), read_per_task(argv[2])
    result = paired_comparison(a, b, ("a", "b"))
  except (OSError, ValueError, KeyError) as e:
    print(f"paraagent_jax.evaluation.paired: error: {e}", file=sys.stderr)
    return 1
  print(format_paired(result, ("a", "b")))
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
