r"""Training entry point: ``python -m paraagent_jax.train``.

  python -m paraagent_jax.train --config=configs/demo.py --workdir=/tmp/demo
  python -m paraagent_jax.train --config=configs/demo.py:stage=sft \
      --workdir=/tmp/x --config.total_steps=200
  python -m paraagent_jax.train --config=configs/paraagent_4b.py --dry_run

``--config`` is a Python config file (`paraagent_jax.cli`); ``config.stage``
picks what runs (`paraagent_jax.trainer.pipeline`): ``sft``, ``rl``,
``demos`` or the ``pipeline`` of them. Restarting the same command resumes
from the newest complete checkpoint in the workdir. ``--dry_run`` builds the
abstract state on a fake CPU mesh and prints memory per device
(`paraagent_jax.dry_run`); it needs no ``--workdir``.

Bad input (config, init_from, checkpoint) and NaN/Inf stop with one line on
stderr, ``paraagent_jax.train: error: ...``, and exit code 1; Ctrl-C (or
SIGTERM) saves and exits with 130.

This file only reads flags and reports errors; the stages live in
`paraagent_jax.trainer`.
"""

from __future__ import annotations

import sys

from absl import flags
from absl import logging
import jax

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import cli
from paraagent_jax import config_utils
from paraagent_jax import dry_run
from paraagent_jax import fileio
from paraagent_jax import interrupts
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import rundir
from paraagent_jax.models import attention as attention_lib
from paraagent_jax.trainer import liveness
from paraagent_jax.trainer import pipeline
from paraagent_jax.trainer import state as state_lib

PROG = "paraagent_jax.train"
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Build the abstract state on a fake CPU mesh, print memory "
    "per device and shardings, lower the train and sample steps; allocates no "
    "weights (paraagent_jax.dry_run). --workdir is not needed.")
_FAKE_DEVICES = flags.DEFINE_integer(
    "fake_devices", 0, "With --dry_run: fake CPU devices (0 = as many as the "
    "config's mesh needs).")

USER_ERRORS = (config_utils.ConfigError, ckpt_lib.CheckpointError,
               metrics_lib.NonFiniteError, NotImplementedError)

# The library entry point, for notebooks and tests: run(config, workdir).
run = pipeline.run


def main(argv) -> None:
  """Command-line entry point: one-line errors, no tracebacks for bad input."""
  if len(argv) > 1:
    cli.fail(PROG, f"unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # Orbax logs every file it writes at INFO; keep the console readable.
    logging.set_verbosity(logging.WARNING)
  config = cli.config_value(PROG)
  if cli.PRINT_CONFIG.value:
    cli.print_config_and_exit(config)
  if config.get("model") is not None and config.model.get("attention") == "tokamax":
    try:   # the optional package: say so now, not after the demonstrations
      attention_lib.import_tokamax()
    except ImportError as e:
      cli.fail(PROG, str(e))
  if _DRY_RUN.value:
    sys.exit(dry_run.main(config, _FAKE_DEVICES.value))
  if not cli.WORKDIR.value:
    cli.fail(PROG, "--config and --workdir are required")
  cli.check_paths(PROG, cli.WORKDIR.value)
  try:
    state_lib.maybe_initialize_distributed(config.get("distributed", "auto"),
                                           float(config.get("host_timeout_s", 120)), PROG)
    workdir = fileio.abspath(cli.WORKDIR.value)
    # One run per workdir (primary host only: the hosts of a job share it).
    with rundir.held(workdir, enabled=jax.process_index() == 0), \
        interrupts.graceful():
      pipeline.run(config, workdir)
    liveness.finished()
  except USER_ERRORS as e:
    cli.fail(PROG, str(e))
  except jax.errors.JaxRuntimeError:
    # Several processes: a collective failed, most often because another
    # process is gone; the watchdog then names it in one line.
    liveness.wait_for_verdict()
    raise
  except interrupts.Interrupted as e:
    liveness.finished()   # every process stops at the same step
    sys.stdout.flush()
    print(f"{PROG}: {e}", file=sys.stderr, flush=True)
    sys.exit(130)
  except KeyboardInterrupt:
    sys.stdout.flush()
    print(f"{PROG}: interrupted; rerun the same command to resume from the last "
          "checkpoint", file=sys.stderr, flush=True)
    sys.exit(130)


if __name__ == "__main__":
  cli.run(main, PROG, __doc__, own=("dry_run", "fake_devices", "print_config"))
