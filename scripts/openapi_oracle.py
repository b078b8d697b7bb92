"""The oracle on generated OpenAPI tasks, through VectorToolEnv: success table.

    .venv/bin/python scripts/openapi_oracle.py                  # 1000 x 5 kinds x 2 splits
    .venv/bin/python scripts/openapi_oracle.py --n 50 --others 20
    .venv/bin/python scripts/openapi_oracle.py --fixture        # tests/fixtures specs, no cache

For every split and kind it generates ``--n`` tasks with
``TaskGenerator(load_catalog("openapi"), seed)``, plays the paraact oracle on
all of them and the react / plan_execute / interleaved oracles on the first
``--others``, each batch in one `VectorToolEnv`, and prints the trajectory
success rate, the fraction of episodes that completed every gold node, and
the mean turns. Exit status 1 if any episode failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import toolenv  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from toolenv import oracle  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from toolenv.tasks import KINDS, SPLITS  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

from toolenv.catalog import openapi  # noqa: E402  pylint: disable=wrong-import-position
from toolenv.catalog.store import Catalog  # noqa: E402  pylint: disable=wrong-import-position

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "tests", "fixtures", "openapi_tasks")


def fixture_catalog(path: str = FIXTURE):
  """The small OpenAPI catalog parsed from the specs in ``path``."""
  return Catalog(openapi.parse_source(path), name="openapi")


def run_oracle(cat, tasks, strategy: str) -> list[dict]:
  """Plays ``strategy``'s oracle on ``tasks`` in one VectorToolEnv; reward parts."""
  env = toolenv.VectorToolEnv(cat, num_envs=len(tasks), **oracle.env_options(strategy))
  env.reset(tasks)
  plans = [oracle.solve(t, strategy) for t in tasks]
  t = 0
  while not all(env.done):
    steps = [p[t] if t < len(p) and not d else None for p, d in zip(plans, env.done)]
    if all(s is None for s in steps):   # a plan ran out before its episode ended
      break
    env.step(steps)
    t += 1
  return [dict(env.rewards(i).asdict(), plan_len=len(plan)) for i, plan in enumerate(plans)]


def main(argv=None) -> int:
  """Runs the table; returns 0 when every episode succeeded."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=1000, help="paraact tasks per split and kind")
  ap.add_argument("--others", type=int, default=200,
                  help="tasks per split and kind for react/plan_execute/interleaved")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--fixture", action="store_true",
                  help="use the specs in tests/fixtures/openapi_tasks instead of the cache")
  args = ap.parse_args(argv)
  t0 = time.time()
  cat = fixture_catalog() if args.fixture else toolenv.load_catalog("openapi")
  gen = toolenv.TaskGenerator(cat, seed=args.seed)
  print(f"catalog {cat.name} ({len(cat)} tools), generator {type(gen).__name__} "
        f"seed {args.seed}, index {time.time() - t0:.1f}s")
  print("generator stats:", gen.stats)
  rows, bad = [], 0
  for split in SPLITS:
    for kind in KINDS:
      t1 = time.time()
      tasks = gen.generate(args.n, split=split, kinds=(kind,))
      gen_s = time.time() - t1
      for strategy in oracle.STRATEGIES:
        sub = tasks if strategy == "paraact" else tasks[:args.others]
        parts = run_oracle(cat, sub, strategy)
        ok = sum(p["success"] for p in parts)
        full = sum(p["completed"] == p["nodes"] and not p["truncated"] for p in parts)
        turns = sum(p["turns"] for p in parts) / len(parts)
        bad += len(parts) - ok
        rows.append((split, kind, strategy, len(parts), ok, full, turns))
      print(f"  {split:5s} {kind:8s} generated {len(tasks)} in {gen_s:.1f}s", flush=True)
  print(f"\n{'split':6s}{'kind':9s}{'strategy':13s}{'tasks':>6s}{'success':>9s}"
        f"{'all nodes':>10s}{'turns':>7s}")
  for split, kind, strategy, n, ok, full, turns in rows:
    print(f"{split:6s}{kind:9s}{strategy:13s}{n:6d}{100 * ok / n:8.1f}%"
          f"{100 * full / n:9.1f}%{turns:7.2f}")
  print(f"\nfailed episodes: {bad}; total {time.time() - t0:.0f}s")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
