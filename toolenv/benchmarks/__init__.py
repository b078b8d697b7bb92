"""Benchmark adapters (BFCL) that score agents with their own rules."""
