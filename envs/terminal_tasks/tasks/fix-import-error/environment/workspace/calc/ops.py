"""Arithmetic helpers used by main.py."""


def add(a, b):
    return a + b


def mul(a, b):
    return a * b
