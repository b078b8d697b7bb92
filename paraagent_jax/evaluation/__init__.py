"""Evaluation: benchmark runners, metrics, reports."""
