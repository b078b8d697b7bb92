r"""Evaluation entry point: policies x strategies x benchmarks -> reports.

    python -m paraagent_jax.evaluate --config=configs/evaluate.py \
        --workdir=/tmp/eval [--checkpoint=/tmp/demo/rl]
    python -m paraagent_jax.evaluate --compare=/tmp/eval_a,/tmp/eval_b

``--checkpoint`` is a training workdir (Orbax; its ``config.json`` gives the
model) or a Hugging Face directory; without it the config's ``policy`` is
used (``oracle``: the scripted upper bound through the text protocol;
``api``: an OpenAI-compatible endpoint). Per-task records are appended as
they finish (`evaluation.runner`), so a killed evaluation resumes; at the end
``report.md``, ``report.json`` and PNG plots are written to the workdir.

Benchmarks (``benchmarks=`` in the config): ``toolenv`` (held-out test split
of each catalog in ``catalog``), ``bfcl`` (open-world and closed settings,
scored by the BFCL-rule checker) and ``stabletoolbench`` (a user's query and
tool files on ToolEnv's simulator, judge-free metrics); see
`paraagent_jax.evaluation.benchmarks`. The suite itself is
`paraagent_jax.evaluation.suite`; this file only reads flags.
"""

from __future__ import annotations

import os
import sys

from absl import flags
from absl import logging

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import cli
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax.evaluation import report as report_lib
from paraagent_jax.evaluation import runner
from paraagent_jax.evaluation import suite
from paraagent_jax.trainer import state as state_lib

PROG = "paraagent_jax.evaluate"
DEFAULT_CONFIG = "configs/evaluate.py"
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Training workdir or HF dir "
                                  "to evaluate (sets policy=checkpoint).")
_STEP = cli.STEP
_COMPARE = flags.DEFINE_list("compare", [], "Workdirs (or report.json files) to "
                             "put side by side instead of evaluating.")
_TRANSCRIPTS = flags.DEFINE_integer("transcripts", 0, "Print this many example "
                                    "transcripts (one solved and one failed per "
                                    "kind first) after the table.")

# The library entry point, for notebooks and tests.
run = suite.run


def main(argv) -> None:
  """Command line: one-line errors for bad input."""
  if len(argv) > 1:
    cli.fail(PROG, f"unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    if _COMPARE.value:
      paths = [p if p.endswith(".json") else os.path.join(p, "report.json")
               for p in _COMPARE.value]
      for given, path in zip(_COMPARE.value, paths):
        if not fileio.isfile(path):
          cli.fail(PROG, f"--compare: {given} is neither an evaluate workdir (with "
                   "report.json) nor a report.json file")
      print(report_lib.compare_reports(paths))
      return
    config = cli.config_value(PROG, default=DEFAULT_CONFIG)
    if cli.PRINT_CONFIG.value:
      cli.print_config_and_exit(config, DEFAULT_CONFIG)
    if not cli.WORKDIR.value:
      cli.fail(PROG, "--workdir is required")
    if _STEP.value is not None and not _CHECKPOINT.value:
      cli.fail(PROG, "--step needs --checkpoint (a training workdir)")
    cli.check_paths(PROG, cli.WORKDIR.value, _CHECKPOINT.value)
    state_lib.on_process_0(PROG, "the evaluation", lambda: suite.run(
        config, fileio.abspath(cli.WORKDIR.value), _CHECKPOINT.value,
        transcripts=_TRANSCRIPTS.value, step=_STEP.value))
  except (config_utils.ConfigError, ckpt_lib.CheckpointError, OSError) as e:
    cli.fail(PROG, str(e))
  except KeyboardInterrupt:
    sys.stdout.flush()
    print(f"{PROG}: interrupted; {_records_kept(cli.WORKDIR.value)} rerun the same "
          "command to resume", file=sys.stderr, flush=True)
    sys.exit(130)


def _records_kept(workdir: str | None) -> str:
  """"N finished episodes are kept in DIR;" for the interrupt line."""
  d = os.path.join(fileio.abspath(workdir), "records") if workdir else ""
  if not d or not fileio.isdir(d):
    return "no episode had finished;"
  n = 0
  for name in fileio.listdir(d):
    if name.endswith(".jsonl"):
      n += len(runner.read_records(os.path.join(d, name)))
  return f"{n} finished episodes are kept in {d};"


if __name__ == "__main__":
  cli.run(main, PROG, __doc__, own=("checkpoint", "compare", "transcripts", "print_config"),
          shared=("config", "workdir", "step"))
