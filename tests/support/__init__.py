"""What tests share: process helpers, sandbox fixtures, loopback servers. Test modules import from here, never from each other."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root."""
TEMPLATES = REPO / "tests" / "data" / "templates"
"""Real chat templates the tokenizer and parser tests render."""
