"""docs/write-an-env.md shows the example env's real code: its Python blocks, put together, are
examples/add_numbers/add_numbers_env.py and its TOML block is the package's pyproject.toml, so the
page cannot drift from what tests/e2e/test_write_an_env.py installs and runs."""

from __future__ import annotations

from tests.support import REPO
from tests.support.doc_pages import blocks_in

PAGE = REPO / "docs" / "write-an-env.md"
PACKAGE = REPO / "examples" / "add_numbers"


def test_the_pages_python_blocks_are_the_example_module() -> None:
    assert "\n".join(blocks_in(PAGE, "python")) == (PACKAGE / "add_numbers_env.py").read_text()


def test_the_pages_toml_block_is_the_example_pyproject() -> None:
    assert blocks_in(PAGE, "toml") == [(PACKAGE / "pyproject.toml").read_text()]
