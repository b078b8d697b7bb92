"""paraagent_jax.learner: what a train step computes, as pure jittable functions.

  batch       TrajectoryBatch (rollout -> learner pytree) and its helpers;
              the token-kind and phase-type codes (the one source)
  advantages  step / phase / trajectory advantages, each normalised in its
              own group, by segment reductions (jittable)
  grpo        GRPOConfig, grpo_loss, make_train_step, make_eval_step
  sft_loss    sft_loss, make_sft_train_step, make_sft_eval_step
  step        the shared jitted, sharded, micro-batched train-step builder
  optimizer   OptimizerConfig, make_optimizer, make_schedule (Optax)

Layer: imports only sharding and config_utils of this package (and JAX,
Flax, Optax); the rollout (paraact) and the trainer import it.
"""
