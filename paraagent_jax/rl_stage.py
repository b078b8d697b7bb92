"""The RL stage of `paraagent_jax.train` (``config.stage = "rl"``): a hook.

The RL engineer fills `run_rl` (GRPO with the decoupled advantages of
`paraagent_jax.rl`) and `rl_defaults`. The trainer calls
``run_rl(config, workdir)`` with the loaded ConfigDict and the stage's
workdir; inside the pipeline, ``config.init_from`` already points at the SFT
stage's workdir. The building blocks of the SFT stage are meant to be
reused, all in `paraagent_jax.train`:

* ``make_mesh(config)``, ``model_config(config, vocab_size)``;
* ``build_train_state(config, mesh, optimizer, model_cfg, workdir)`` ->
  `TrainState` (graphdef, sharded state and optimizer state, step, rng,
  data position, checkpointer): abstract shapes via ``jax.eval_shape``,
  jitted sharded init, resume from the workdir or ``init_from``;
* ``checkpointer.save(step, state, opt_state, data_state=..., rng=...,
  extra=...)`` (Orbax, async, keep last K);
* ``metrics.MetricsWriter`` and ``metrics.check_finite``.

Keep this module light at import time: `config_utils.train_defaults` imports
it for `rl_defaults`.
"""

from __future__ import annotations

import ml_collections


def rl_defaults() -> ml_collections.ConfigDict:
  """Defaults of ``config.rl`` (typed keys for command-line overrides)."""
  return ml_collections.ConfigDict()


def run_rl(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs the RL stage in ``workdir``; returns final metrics.

  Raises:
    NotImplementedError: until the RL stage is written.
  """
  del config, workdir
  raise NotImplementedError(
      "stage=rl is not implemented yet: paraagent_jax/rl_stage.py:run_rl is "
      "a stub until the RL stage lands; use stage=sft")
