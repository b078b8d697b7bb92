"""paraagent_jax.data."""
