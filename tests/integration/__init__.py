"""Integration tests: the real Temporal dev server, real sandbox server processes, real HTTP endpoints."""
