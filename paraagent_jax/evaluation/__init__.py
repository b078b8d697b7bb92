"""paraagent_jax.evaluation: benchmark runs, held-out evaluations, reports.

  suite       policies x strategies x benchmarks -> report (``evaluate``'s)
  runner      ToolEnv / BFCL episodes with resumable per-task records
  benchmarks  BFCL and StableToolBench on ToolEnv's simulator
  greedy      greedy held-out success per kind (SFT and RL stages share it)
  report      report.md / report.json / PNG plots, comparisons
  paired      paired per-task comparison (McNemar)

Layer: may import rundir, paraact and the layers below, and toolenv; the
trainer and the ``evaluate`` entry point import it.
"""
