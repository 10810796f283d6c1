"""Every install line the docs give installs what its commands import.

`pip install -e .` must cover `rollouts ...` and `python worker.py`; `pip install -e '.[rl]'`
(README, docs/training.md, docs/train-a-policy.md) must cover the CPU policy server, the token-level
client, the Atropos env, the GRPO example and `bench/train_loop.py`; `cluster` the Nomad and Modal
backends; `s3` the S3 store. CI installs the `test` extra, which has everything, so a command that
needs a package only `test` lists passes CI and fails the user who followed the docs (the `rl`
extra lacked `accelerate`, which transformers needs to load SmolLM2's GGUF).

The check reads imports, it installs nothing: from each command's modules it follows the project's
own imports (module-level ones everywhere; every import, those inside functions too, in the modules
the extra is for) and maps each third-party import to its distribution through the installed
metadata (`packages_distributions`). That distribution must be the extra's, the base install's, or
a dependency of one of them, as installed here. What a library imports only when asked (a
transformers feature that needs accelerate) is declared where the project relies on it, with an
import in the module that does (`smollm2.load_model`), so this check sees it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement

from tests.support import REPO

PROJECT = "temporal-rollouts"
PROJECT_ROOTS = {"temporal_rollouts", "workflows", "activities", "envs", "worker", "bench", "examples"}

COMMANDS = {
    "": ["temporal_rollouts.cli.main", "worker", "temporal_rollouts.view.__main__", "temporal_rollouts.view.app"],
    "rl": [
        "temporal_rollouts.policy_servers.cpu_generate",
        "temporal_rollouts.integrations.atropos.env",
        "examples.grpo.trainer",
        "examples.grpo.sync_loop",
        "bench.train_loop",
    ],
    "cluster": ["temporal_rollouts.sandbox.backends.nomad", "temporal_rollouts.sandbox.backends.modal"],
    "s3": ["temporal_rollouts.storage.objects"],
}
"""Each extra ("" is the base install) -> the modules its documented commands run."""
WHOLE = {
    "": [],
    "rl": [
        "temporal_rollouts.policy_servers",
        "temporal_rollouts.llm",
        "temporal_rollouts.integrations.atropos",
        "examples.grpo",
        "bench.train_loop",
        "bench.training_stack",
    ],
    "cluster": ["temporal_rollouts.sandbox.backends.nomad", "temporal_rollouts.sandbox.backends.modal"],
    "s3": ["temporal_rollouts.storage"],
}
"""The modules each extra is for: every import in them counts, those inside functions too (elsewhere only
module-level imports do: a lazy import there belongs to a feature another extra covers)."""


def module_path(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def imports_of(module: str, whole: bool) -> tuple[str, ...]:
    """Absolute imports of a repo module: all of them, or only those run when it is imported."""
    path = module_path(module)
    assert path is not None, module
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
        elif not whole and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skipped.update(id(child) for child in ast.walk(node) if child is not node)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return tuple(found)


def third_party_imports(extra: str) -> dict[str, str]:
    """Top-level third-party import name -> a project module that imports it, over the extra's commands."""
    whole = tuple(WHOLE[extra])
    seen: set[str] = set()
    found: dict[str, str] = {}
    todo = list(COMMANDS[extra])
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in imports_of(module, module.startswith(whole) if whole else False):
            top = name.split(".")[0]
            if top in PROJECT_ROOTS:
                target = name
                while target and module_path(target) is None:
                    target = target.rpartition(".")[0]
                if target:
                    todo.append(target)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, module)
    return found


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extra: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(text) for text in project["dependencies"]]
    if extra:
        reqs += [Requirement(text) for text in project["optional-dependencies"][extra]]
    return reqs


def installed_closure(extra: str) -> set[str]:
    """The distributions installing the project with `extra` brings in, as their installed metadata says."""
    closure: set[str] = set()
    todo = [(req, extra) for req in declared(extra)]
    while todo:
        req, _ = todo.pop()
        name = normal(req.name)
        if name == PROJECT:  # the project naming its own extra, e.g. temporal-rollouts[cluster]
            todo += [(r, "") for x in req.extras for r in declared(x)]
            continue
        if name in closure:
            continue
        closure.add(name)
        try:
            below = requires(req.name) or []
        except PackageNotFoundError:
            continue  # not installed here: its own dependencies cannot be read, the name itself counts
        for text in below:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append((dep, ""))
    return closure


def missing(extra: str) -> dict[str, str]:
    """Import name -> where it is imported, for every import the extra's install does not cover."""
    owners = packages_distributions()
    closure = installed_closure(extra)
    gaps = {}
    for top, where in sorted(third_party_imports(extra).items()):
        dists = {normal(d) for d in owners.get(top, [])}
        if not dists & closure:
            gaps[top] = f"{where} (distribution {', '.join(sorted(dists)) or 'unknown'})"
    return gaps


def test_the_base_install_covers_the_cli_and_the_worker() -> None:
    assert missing("") == {}


def test_the_rl_extra_covers_the_cpu_policy_server_the_atropos_env_and_the_grpo_example() -> None:
    assert missing("rl") == {}


def test_the_cluster_extra_covers_the_nomad_and_modal_backends() -> None:
    assert missing("cluster") == {}


def test_the_s3_extra_covers_the_s3_store() -> None:
    assert missing("s3") == {}


def test_the_check_sees_what_transformers_needs_to_load_a_gguf() -> None:
    """transformers raises "accelerate is required when loading a GGUF file" without it."""
    assert "accelerate" in third_party_imports("rl")
    assert "accelerate" not in {normal(r.name) for r in declared("")}
