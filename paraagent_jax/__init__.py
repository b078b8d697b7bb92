"""ParaAgent-JAX: parallel acting in open-world tool environments, in JAX."""

__version__ = "0.1.0"
