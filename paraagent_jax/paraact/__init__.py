"""paraagent_jax.paraact."""
