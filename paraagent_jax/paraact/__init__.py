"""paraagent_jax.paraact: the ParaAct acting loop.

  protocol     render / parse one step (never raises on model output)
  chat_format  the chat template around steps and observations
  formats      protocol.format: tags (<call>) or qwen3 (<tool_call> blocks)
  qwen3_format a step as Qwen3 tool calls (render / parse)
  template_turns  turns through the tokenizer's own chat template, prefix-checked
  strategies   ParaAct and the baselines (ReAct, plan-then-execute, ...)
  episode      per-episode token bookkeeping and the fixed-shape arrays
  policies     JAX (KV-cache sampler) and oracle policies
  api_policy   an OpenAI-compatible model (native tool calls or our text)
  rollout      batched episodes against a VectorToolEnv -> TrajectoryBatch

Layer: may import learner (the batch and its codes), sampling, tokenizer,
api_client and toolenv; never rundir, data, evaluation, coldstart, trainer.
"""
