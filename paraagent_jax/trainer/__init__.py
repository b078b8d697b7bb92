"""paraagent_jax.trainer: the stage loops and the state they run on.

  state     mesh, model config, abstract state, train state, resume
  sft       the SFT loop (and the demonstrations / greedy eval around it)
  rl        the RL loop: rollouts -> GRPO update -> logs, evals, checkpoints
  rl_tasks  which tasks an RL iteration draws
  rl_report the RL report, learning curve and paired before/after test
  pipeline  ``config.stage`` -> the stage; the pipeline of stages

Layer: below the command-line entry points (``train``, ``dry_run``); may
import every lower layer (evaluation, coldstart, data, rundir, paraact,
learner, sampling, models and the utilities) and toolenv, never an entry
point. Checked by ``lint-imports`` (pyproject.toml).
"""
