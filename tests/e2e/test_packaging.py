"""Every top-level package of the checkout is installed: the tests import from the
checkout, so a package missing from pyproject's list only shows once installed (twice
it broke the `rollouts` command on a clean clone)."""

from __future__ import annotations

import fnmatch
import tomllib

from tests.support import REPO

NOT_INSTALLED = {"tests", "bench"}


def test_every_top_level_package_is_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - NOT_INSTALLED
    missing = sorted(p for p in packages if not any(fnmatch.fnmatch(p, pattern) for pattern in patterns))
    assert packages and not missing, f"add {missing} to [tool.setuptools.packages.find] include"
