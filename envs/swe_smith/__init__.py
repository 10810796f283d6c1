"""SWE-smith tasks: fix an injected bug in a real Python project until its failing tests pass."""
