"""Activities: one module per step kind, each a class handed its dependencies when the worker is built."""
