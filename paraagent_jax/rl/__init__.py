"""paraagent_jax.rl."""
