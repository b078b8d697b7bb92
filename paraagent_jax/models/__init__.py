"""paraagent_jax.models."""
