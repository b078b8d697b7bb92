r"""Wall time of evaluating ToolEnv tasks with the demo-preset model (the worst case).

    .venv/bin/python benchmarks/eval_speed.py --tasks=200 --batch_sizes=200,64
    .venv/bin/python benchmarks/eval_speed.py --checkpoint=/tmp/demo/rl   # a trained one

Without ``--checkpoint`` it builds a randomly initialised ``demo`` Qwen3
(4 layers, hidden 256, vocab 4096) with a demo BPE tokenizer, saved as an HF
directory under ``--workdir``. Random weights never write a stop string, so
every turn runs to ``max_turn_tokens`` and every episode to ``max_len`` or
its turn budget: the slowest an evaluation can be. Each batch size is timed
with a fresh records directory through `paraagent_jax.evaluate.run` (the
command-line path: rollout, ToolEnv, records, report), compile time
included; the scripted oracle's run is the peer row. Prints a table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flax import nnx  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import evaluate  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.data import demo_tokenizer  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.evaluation import report as report_lib  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.evaluation import runner  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.models import hf_io, qwen3  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.paraact import strategies  # noqa: E402  pylint: disable=wrong-import-position
import toolenv  # noqa: E402  pylint: disable=wrong-import-position

# pylint: disable=g-import-not-at-top,wrong-import-position
from paraagent_jax import config_utils


def build_random_demo(out_dir: str) -> str:
  """A random-init demo-preset HF directory with a demo tokenizer (cached)."""
  if os.path.exists(os.path.join(out_dir, "config.json")):
    return out_dir
  gen = toolenv.TaskGenerator(toolenv.load_catalog("procedural", seed=0), seed=1)
  texts = [strategies.get_strategy(s).system_prompt() for s in strategies.STRATEGY_NAMES]
  for t in gen.generate(300, split="train"):
    texts.append(t.instruction)
    texts += [strategies.get_strategy("paraact").render_step(x)
              for x in toolenv.oracle.solve(t, "paraact")]
  tok_dir = out_dir + "_tok"
  tok = demo_tokenizer.train_demo_tokenizer(texts, tok_dir, vocab_size=4096)
  model = qwen3.Qwen3(qwen3.Qwen3Config.preset("demo", vocab_size=len(tok)),
                      rngs=nnx.Rngs(0))
  hf_io.save_hf(model, out_dir, tokenizer=tok)
  return out_dir


def _cpu_s() -> float:
  ru = resource.getrusage(resource.RUSAGE_SELF)
  return ru.ru_utime + ru.ru_stime


def time_eval(config_arg: str, workdir: str, checkpoint: str = ""
              ) -> tuple[float, float, dict]:
  """Runs one evaluation from scratch; returns (wall s, CPU s, overall summary).

  CPU seconds (all threads) are reported too: on a shared machine the wall
  time measures the other users' load as much as ours.
  """
  shutil.rmtree(os.path.join(workdir, "records"), ignore_errors=True)
  config = config_utils.load_config(f"configs/evaluate.py:{config_arg}")
  t0, c0 = time.perf_counter(), _cpu_s()
  evaluate.run(config, workdir, checkpoint)
  wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
  recs = []
  for f in sorted(os.listdir(os.path.join(workdir, "records"))):
    recs += runner.read_records(os.path.join(workdir, "records", f))
  return wall, cpu, report_lib.summarise(recs)


def main() -> None:
  """Times the evaluation at each batch size and prints a table."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--tasks", type=int, default=200)
  p.add_argument("--batch_sizes", default="200,64")
  p.add_argument("--strategy", default="paraact")
  p.add_argument("--checkpoint", default="")
  p.add_argument("--workdir", default="/tmp/eval_speed")
  p.add_argument("--extra", default="", help="more config overrides, key=value,...")
  a = p.parse_args()
  os.makedirs(a.workdir, exist_ok=True)
  ckpt = a.checkpoint or build_random_demo(os.path.join(a.workdir, "random_demo"))
  per_kind = max(1, a.tasks // 5)
  base = f"num_per_kind={per_kind},strategies={a.strategy}" + (
      f",{a.extra}" if a.extra else "")
  rows = []
  rows.append(("oracle (peer)", "-", *time_eval(base, os.path.join(a.workdir, "oracle"))))
  for bs in [int(x) for x in a.batch_sizes.split(",") if x]:
    rows.append(("random demo" if not a.checkpoint else a.checkpoint, bs,
                 *time_eval(f"{base},batch_size={bs}",
                            os.path.join(a.workdir, f"model_b{bs}"), ckpt)))
  print(f"\n{5 * per_kind} ToolEnv test tasks, strategy {a.strategy}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
  print("| policy | batch | wall s | CPU s | s/task | success % | turns | tokens/task | "
        "truncated |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name, bs, wall, cpu, s in rows:
    print(f"| {name} | {bs} | {wall:.1f} | {cpu:.1f} | {wall / s['n']:.3f} | "
          f"{100 * s['success']:.1f} | {s['turns']:.2f} | {s['tokens_generated']:.0f} | "
          f"{s['truncated']:.2f} |")


if __name__ == "__main__":
  main()
