"""paraagent_jax.paraact: the ParaAct acting loop.

  protocol     render / parse one step (never raises on model output)
  chat_format  the chat template around steps and observations
  strategies   ParaAct and the baselines (ReAct, plan-then-execute, ...)
  episode      per-episode token bookkeeping and the fixed-shape arrays
  policies     JAX (KV-cache sampler) and oracle policies
  api_policy   an OpenAI-compatible model (native tool calls or our text)
  rollout      batched episodes against a VectorToolEnv -> TrajectoryBatch

Layer: may import learner (the batch and its codes), sampling, tokenizer,
api_client and toolenv; never rundir, data, evaluation, coldstart, trainer.
"""
