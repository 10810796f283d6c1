"""Builds SWE-smith-format tasks from real pure-Python projects on PyPI, offline afterwards.

For each project version: download its sdist, make a git repository of the source (one
commit, fixed author and date, so a rebuild gives the same hashes), run its own test suite,
then try bug candidates from `envs.swe_smith.mutations` one at a time. A candidate becomes
an instance when some tests that passed now fail and every other test still passes; its
buggy tree is committed on a branch named after the instance, so `base_commit` is the bug
and `patch` (the diff back to the clean commit) is the reference fix. Out come
`<out>/repos/<repo>.bundle` (all branches), `<out>/instances.jsonl`, and `<out>/wheels/`,
the pinned wheels the grader installs pytest from inside a slot with the network off.

    python -m envs.swe_smith.build --out envs/swe_smith/data \\
        --project inflection==0.5.1 --project toolz==1.0.0 --project six==1.17.0 --per-project 12

Tests run with the interpreter slots run (`--python`, default python3 on the sandbox's PATH) in
a venv like the grader's, the source on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from envs.swe_smith.model import SweInstance
from envs.swe_smith.mutations import Mutation, candidate_mutations
from envs.swe_smith.grader.pytest_summary import PYTEST_FLAGS, parse_summary

log = logging.getLogger("envs.swe_smith.build")

GRADER_WHEELS = (
    "pytest==8.3.5",
    "pluggy==1.5.0",
    "iniconfig==2.0.0",
    "packaging==24.2",
    "wheel==0.45.1",
    "flit_core==3.10.1",
)
"""What the grader installs into its venv from `wheels/`: pytest, and the build backends the
shipped projects need for `pip install -e . --no-build-isolation` (setuptools is the system's)."""
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "swe-smith-build",
    "GIT_AUTHOR_EMAIL": "build@swe-smith.invalid",
    "GIT_COMMITTER_NAME": "swe-smith-build",
    "GIT_COMMITTER_EMAIL": "build@swe-smith.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
"""PATH inside a slot (temporal_rollouts.sandbox_server.isolation.bubblewrap), where the grader finds python3."""
SKIPPED_SOURCES = re.compile(
    r"(^|/)(tests?|docs?|examples?|benchmarks?)/|(^|/)(test_[^/]*|[^/]*_test|conftest|setup|versioneer|_version)\.py$"
)
LISTED_FAILURES = 10


class BuildError(Exception):
    """A project cannot be turned into tasks (no sdist, no tests, a baseline that fails to run)."""


@dataclass
class Project:
    name: str
    version: str
    tree: Path
    repo: Path

    @property
    def repo_name(self) -> str:
        return f"{self.name}-{self.version}".lower()


@dataclass(frozen=True)
class SuiteRun:
    outcomes: dict[str, str]
    messages: dict[str, str]
    duration_s: float
    timed_out: bool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.swe_smith.build", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--project",
        action="append",
        default=[],
        help="NAME==VERSION of a pure-Python sdist on PyPI (repeat)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for repos/, wheels/ and instances.jsonl",
    )
    parser.add_argument("--per-project", type=int, default=12, help="instances to keep per project")
    parser.add_argument(
        "--max-candidates",
        type=int,
        default=80,
        help="candidates to try per project at most",
    )
    parser.add_argument(
        "--max-failing",
        type=int,
        default=40,
        help="drop a bug that fails more tests than this",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wheels-from", type=Path, help="copy the grader's wheels from here instead of PyPI")
    parser.add_argument(
        "--wheels-only",
        action="store_true",
        help="only fetch the grader's wheels into OUT/wheels (they are not kept in the repository: make test does this)",
    )
    parser.add_argument(
        "--python",
        default=shutil.which("python3", path=SANDBOX_PATH) or sys.executable,
        help="interpreter the tests run with: the one slots run (python3 on the sandbox's PATH)",
    )
    parser.add_argument(
        "--sdist-dir",
        type=Path,
        help="take NAME-VERSION.tar.gz from here instead of PyPI",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.wheels_only:
        fetch_wheels(args.out / "wheels", args.wheels_from)
        return 0
    if not args.project:
        parser.error("name at least one --project (or --wheels-only)")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "repos").mkdir(exist_ok=True)
    fetch_wheels(args.out / "wheels", args.wheels_from)
    instances: list[SweInstance] = []
    with tempfile.TemporaryDirectory(prefix="swe-build-") as scratch:
        python = test_python(args.python, Path(scratch) / "venv", args.out / "wheels")
        for spec in args.project:
            project = prepare_project(spec, Path(scratch), args.sdist_dir)
            built = build_instances(
                project,
                python,
                per_project=args.per_project,
                max_candidates=args.max_candidates,
                max_failing=args.max_failing,
                seed=args.seed,
            )
            bundle = args.out / "repos" / f"{project.repo_name}.bundle"
            _git(project.repo, "-c", "pack.threads=1", "bundle", "create", str(bundle.resolve()), "--all")
            log.info(
                "%s: %d instances, bundle %d bytes",
                project.repo_name,
                len(built),
                bundle.stat().st_size,
            )
            instances += built
    with (args.out / "instances.jsonl").open("w") as out:
        for instance in instances:
            out.write(instance.model_dump_json(exclude_none=True) + "\n")
    print(json.dumps({"instances": len(instances), "out": str(args.out)}))
    return 0


def fetch_wheels(folder: Path, source: Path | None = None) -> None:
    """The grader's wheels into `folder`: downloaded from PyPI, or copied from `source`."""
    folder.mkdir(parents=True, exist_ok=True)
    if source is not None:
        names = {spec.split("==")[0].replace("-", "_").lower() for spec in GRADER_WHEELS}
        found = [p for p in sorted(source.glob("*.whl")) if p.name.split("-")[0].lower() in names]
        if len(found) < len(names):
            raise BuildError(f"{source} lacks some of the grader's wheels {sorted(names)}")
        for path in found:
            if path.resolve() != (folder / path.name).resolve():
                shutil.copy2(path, folder / path.name)
        return
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--only-binary",
            ":all:",
            "--no-deps",
            "-d",
            str(folder),
            *GRADER_WHEELS,
        ]
    )


def prepare_project(spec: str, scratch: Path, sdist_dir: Path | None) -> Project:
    """The sdist of `spec` unpacked into a git repository with one clean commit on `main`."""
    name, sep, version = spec.partition("==")
    if not sep or not name or not version:
        raise BuildError(f"project {spec!r} must be NAME==VERSION")
    downloads = scratch / "sdists"
    if sdist_dir is not None:
        archives = sorted(sdist_dir.glob(f"{name}-{version}.tar.gz")) + sorted(
            sdist_dir.glob(f"{name.replace('-', '_')}-{version}.tar.gz")
        )
    else:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-binary",
                ":all:",
                "--no-deps",
                "-d",
                str(downloads),
                spec,
            ]
        )
        archives = [p for p in downloads.glob("*.tar.gz") if _sdist_matches(p.name, name, version)]
    if not archives:
        raise BuildError(f"no sdist for {spec}")
    unpacked = scratch / "unpacked" / name
    with tarfile.open(archives[0]) as archive:
        archive.extractall(unpacked, filter="data")
    (top,) = [p for p in unpacked.iterdir() if p.is_dir()]
    repo = scratch / "repos" / f"{name}-{version}"
    shutil.copytree(top, repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{name} {version} from its PyPI sdist")
    work = scratch / "work" / f"{name}-{version}"
    shutil.copytree(repo, work, ignore=shutil.ignore_patterns(".git"))
    return Project(name=name, version=version, tree=work, repo=repo)


def test_python(python: str, venv: Path, wheels: Path) -> str:
    """A venv of `python` that sees its system packages, with the grader's wheels installed: the
    same interpreter and packages the grader uses in a slot, so a test that cannot pass there
    (a module the slot's Python lacks) is never taken as passing."""
    _run([python, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)])
    wheel_files = [str(path) for path in sorted(wheels.glob("*.whl"))]
    _run(
        [str(venv / "bin" / "python"), "-I", "-m", "pip", "install", "-q", "--no-index", "--no-cache-dir", *wheel_files]
    )
    return str(venv / "bin" / "python")


def build_instances(
    project: Project,
    python: str,
    *,
    per_project: int,
    max_candidates: int,
    max_failing: int,
    seed: int,
) -> list[SweInstance]:
    baseline = run_suite(python, project.tree, timeout_s=600)
    passing = sorted(nodeid for nodeid, outcome in baseline.outcomes.items() if outcome == "PASSED")
    if not passing:
        raise BuildError(f"{project.repo_name}: no test passes at the clean commit")
    # Keep only ids that pytest finds again when they are named on the command line (the grader names them).
    confirmed = run_suite(python, project.tree, timeout_s=600, nodeids=passing)
    passing = sorted(nodeid for nodeid in passing if confirmed.outcomes.get(nodeid) == "PASSED")
    log.info(
        "%s: %d tests pass at the clean commit (%.1fs)",
        project.repo_name,
        len(passing),
        baseline.duration_s,
    )

    candidates = _interleaved_candidates(project.tree, random.Random(f"{seed}/{project.repo_name}"))
    clean = _git(project.repo, "rev-parse", "HEAD").strip()
    instances: list[SweInstance] = []
    used_functions: set[tuple[str, str]] = set()
    timeout_s = max(60.0, baseline.duration_s * 4)
    tried = 0
    for mutation in candidates:
        if len(instances) >= per_project or tried >= max_candidates:
            break
        if (mutation.path, mutation.function) in used_functions:
            continue
        tried += 1
        path = project.tree / mutation.path
        original = path.read_text()
        path.write_text(mutation.new_source)
        try:
            run = run_suite(python, project.tree, timeout_s=timeout_s, nodeids=passing)
        finally:
            path.write_text(original)
        failing = [nodeid for nodeid in passing if run.outcomes.get(nodeid) != "PASSED"]
        verdict = "timed out" if run.timed_out else f"{len(failing)} failing"
        log.info(
            "%s: candidate %d %s at %s:%d: %s",
            project.repo_name,
            tried,
            mutation.kind,
            mutation.path,
            mutation.line,
            verdict,
        )
        if run.timed_out or not failing or len(failing) > max_failing:
            continue
        used_functions.add((mutation.path, mutation.function))
        instances.append(_commit_instance(project, clean, mutation, original, failing, passing, run))
    return instances


def run_suite(python: str, tree: Path, *, timeout_s: float, nodeids: list[str] | None = None) -> SuiteRun:
    """Outcome by test id of one pytest run in `tree` (all tests, or the named ones)."""
    command = [python, "-m", "pytest", *PYTEST_FLAGS]
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PYTHONDONTWRITEBYTECODE": "1",
        "COLUMNS": "400",
    }
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".args") as args_file:
        if nodeids:
            args_file.write("\n".join(nodeids))
            args_file.flush()
            command.append(f"@{args_file.name}")
        try:
            done = subprocess.run(
                command,
                check=False,
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return SuiteRun({}, {}, time.monotonic() - started, True)
    outcomes, messages = parse_summary(done.stdout, set(nodeids or ()))
    return SuiteRun(outcomes, messages, time.monotonic() - started, False)


def _interleaved_candidates(tree: Path, rng: random.Random) -> list[Mutation]:
    """Every candidate of the package's modules, shuffled, then dealt out kind by kind so
    that the first accepted ones are of mixed kinds."""
    by_kind: dict[str, list[Mutation]] = defaultdict(list)
    for path in sorted(tree.rglob("*.py")):
        relative = path.relative_to(tree).as_posix()
        if SKIPPED_SOURCES.search(relative):
            continue
        try:
            for mutation in candidate_mutations(relative, path.read_text()):
                by_kind[mutation.kind].append(mutation)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
    queues = [by_kind[kind] for kind in sorted(by_kind)]
    for queue in queues:
        rng.shuffle(queue)
    dealt: list[Mutation] = []
    while any(queues):
        for queue in queues:
            if queue:
                dealt.append(queue.pop())
    return dealt


def _commit_instance(
    project: Project,
    clean: str,
    mutation: Mutation,
    original: str,
    failing: list[str],
    passing: list[str],
    run: SuiteRun,
) -> SweInstance:
    digest = _short_hash(mutation.key)
    instance_id = f"pypi__{project.repo_name}.{mutation.kind}__{digest}"
    _git(project.repo, "checkout", "-q", "-B", instance_id, clean)
    (project.repo / mutation.path).write_text(mutation.new_source)
    _git(
        project.repo,
        "commit",
        "-q",
        "-am",
        f"{instance_id}: inject a {mutation.kind.replace('_', ' ')} bug",
    )
    buggy = _git(project.repo, "rev-parse", "HEAD").strip()
    patch = _git(project.repo, "diff", buggy, clean)
    _git(project.repo, "checkout", "-q", "main")
    failing_set = set(failing)
    return SweInstance(
        instance_id=instance_id,
        repo=project.repo_name,
        base_commit=buggy,
        patch=patch,
        FAIL_TO_PASS=failing,
        PASS_TO_PASS=[nodeid for nodeid in passing if nodeid not in failing_set],
        problem_statement=_problem_statement(project, failing, run.messages),
        text=_oracle_text(mutation, original),
        created_at=GIT_IDENTITY["GIT_COMMITTER_DATE"],
        mutation={
            "kind": mutation.kind,
            "path": mutation.path,
            "line": mutation.line,
            "function": mutation.function,
        },
    )


def _problem_statement(project: Project, failing: list[str], messages: dict[str, str]) -> str:
    lines = [
        f"After a recent change to {project.name} {project.version}, some of its own tests fail.",
        "",
        f"Failing tests ({len(failing)}):",
        *(f"- {nodeid}" for nodeid in failing[:LISTED_FAILURES]),
    ]
    if len(failing) > LISTED_FAILURES:
        lines.append(f"- ... and {len(failing) - LISTED_FAILURES} more")
    shown = [(nodeid, messages[nodeid]) for nodeid in failing if messages.get(nodeid)][:3]
    if shown:
        lines += [
            "",
            "What pytest reports:",
            *(f"{nodeid}: {_stable(message)[:300]}" for nodeid, message in shown),
        ]
    lines += [
        "",
        "Fix the library so that these tests pass and every other test keeps passing. Do not edit the tests.",
    ]
    return "\n".join(lines)


def _stable(message: str) -> str:
    """A failure message without what changes from run to run (object addresses), so a rebuild
    writes the same problem statement."""
    return re.sub(r"\b0x[0-9a-fA-F]{6,}\b", "0x...", message)


def _oracle_text(mutation: Mutation, original: str) -> str:
    """The function the bug is in, as it reads at base_commit: the `text` SWE-smith-oracle adds."""
    tree = ast.parse(mutation.new_source)
    for node in ast.walk(tree):
        is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == mutation.function
        if is_function and node.lineno <= mutation.line <= (node.end_lineno or node.lineno):
            segment = ast.get_source_segment(mutation.new_source, node, padded=True) or ""
            return f"The code involved is in `{mutation.path}`:\n\n```python\n{segment}\n```"
    return f"The code involved is in `{mutation.path}`."


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _sdist_matches(filename: str, name: str, version: str) -> bool:
    normalized = re.sub(r"[-_.]+", "_", name).lower()
    stem = filename.removesuffix(".tar.gz")
    return re.sub(r"[-_.]+", "_", stem).lower() == f"{normalized}_{re.sub(r'[-_.]+', '_', version)}"


def _git(repo: Path, *args: str) -> str:
    return _run(["git", "-C", str(repo), *args], env={**os.environ, **GIT_IDENTITY})


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(command[:4])}... failed ({done.returncode}): {done.stderr[-1000:]}")
    return done.stdout


if __name__ == "__main__":
    sys.exit(main())
