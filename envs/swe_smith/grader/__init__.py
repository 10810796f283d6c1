"""The swe_smith grader's own programs, which run inside the slot.

Every grading command carries these files as text and runs them with the slot's `python3 -I -S`:
no site-packages, no user site, nothing of the workspace on `sys.path`. So they use the standard
library only and import one another relatively: the same files are the package
`envs.swe_smith.grader` on the worker (where the env reads the report and the tests call them)
and the package `grader` in the slot.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).parent


def source_files() -> dict[str, str]:
    """Every module of this package by file name, as the grading command writes them in the slot."""
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(PACKAGE_DIR.glob("*.py"))}
