"""The fenced code blocks of a docs page, for tests that run a page's code as it is written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    language: str
    text: str


def code_blocks(page: Path) -> list[Block]:
    """Every fenced block at the top level of `page`, in order, with its language (`""` when none)."""
    return [
        Block(match["info"].strip().split(" ")[0] if match["info"].strip() else "", match["body"])
        for match in FENCE.finditer(page.read_text(encoding="utf-8"))
    ]


def blocks_in(page: Path, language: str) -> list[str]:
    return [block.text for block in code_blocks(page) if block.language == language]


def commands(block: str) -> list[str]:
    """The shell commands of a bash block, one per line (a line ending in a backslash goes on in the
    next), without their trailing comments."""
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        if command and not command.startswith("#"):
            lines.append(command)
    return lines
