"""paraagent_jax.rl: GRPO with trajectory / phase / step-decoupled advantages.

Modules:
  batch        TrajectoryBatch (the rollout -> learner pytree) and helpers
               (drop_no_spread_groups, token budget, micro-batch split).
  advantages   token_advantages / compute_advantages: segment-reduction
               multi-level advantages, jittable.
  grpo         GRPOConfig, grpo_loss, make_train_step, make_eval_step.
  sft_loss     sft_loss, make_sft_train_step, make_sft_eval_step.
  train_step   OptimizerConfig, make_optimizer, shard_train_state, and the
               shared jitted/sharded/micro-batched step builder.
"""
