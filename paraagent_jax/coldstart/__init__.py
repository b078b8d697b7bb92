"""paraagent_jax.coldstart."""
