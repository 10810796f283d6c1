"""Sandbox slots: the server that owns them, the client that talks to it, and the backends that run it."""
