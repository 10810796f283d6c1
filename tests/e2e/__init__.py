"""End-to-end tests: the README's own commands, run as a user would."""
