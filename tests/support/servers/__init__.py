"""Real model servers that tests run as processes (see generate_server.py)."""
