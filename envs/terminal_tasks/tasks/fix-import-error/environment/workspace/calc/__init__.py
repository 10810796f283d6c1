"""Tiny arithmetic package."""
