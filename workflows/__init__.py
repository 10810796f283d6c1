"""Workflow code only: deterministic, no I/O, no env code."""
