"""Gets a repository (and the grader's wheels) from the worker into a slot's container.

The worker finds the repository under `repo_base_url` (a `<repo>.bundle`, or a git repository
it bundles) and turns it into a bare repository; that and the wheelhouse become two entries
of the container's shared, read-only cache (`LeasedSlot.share`, streamed, binary), each put
once per container and named by the digest of its content. The wheels' entry also holds them
installed (`site/`, by the worker's own pip, once per process), which each grading copies into
its venv instead of running pip over the same wheels every time. Setup and grading commands name
the entries they read (`exec(..., cache=[...])`); the agent's commands see none of them. A
remote `repo_base_url` (a URL) is not cached: the slot fetches the commit itself, with the
network on.

What the worker builds for this (bundles, entry archives) lives in `scratch`: the last few per
process, removed when dropped and at exit.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from envs.base import SlotHandle
from envs.swe_smith.model import SweInstance
from envs.swe_smith.scratch import ScratchCache
from temporal_rollouts.core.errors import ConfigError, TaskError

BUNDLE_NAME = "repo.bundle"
WHEELS_NAME = "wheels"
SITE_NAME = "site"
WHEELS_LAYOUT = b"wheels+site/1"
"""Part of the wheels entry's digest: an entry of another layout (wheels alone) gets another name."""
REPOSITORY_NAME = "repo.git"
DIGEST_CHARS = 20
BUNDLES: ScratchCache[Path] = ScratchCache("bundle", capacity=32)
"""Bundles made of git repositories under `repo_base_url` (a `.bundle` there is sent as it is)."""
REPOSITORY_ENTRIES: ScratchCache[tuple[str, Path]] = ScratchCache("repo", capacity=32)
WHEELS_ENTRIES: ScratchCache[tuple[str, Path]] = ScratchCache("wheels", capacity=4)


def local_bundle(repo_base_url: str, repo: str) -> Path:
    """The bundle for `repo` under the folder `repo_base_url`: `<repo>.bundle` as it is, or a bundle
    made (once per process) of a git repository `<repo>.git` or `<repo>/`."""
    base = Path(repo_base_url)
    names = dict.fromkeys([repo, repo.replace("/", "__"), repo.rsplit("/", 1)[-1]])
    for name in names:
        if (bundle := base / f"{name}.bundle").is_file():
            return bundle
        for candidate in (base / f"{name}.git", base / name):
            if (candidate / "HEAD").is_file() or (candidate / ".git").exists():
                key = (str(candidate), candidate.stat().st_mtime_ns)
                return BUNDLES.get(key, lambda folder, repository=str(candidate): _bundled(repository, folder))
    raise TaskError(f"repository {repo!r} not found under {repo_base_url!r} (no .bundle, .git or checkout)")


def _bundled(repository: str, folder: Path) -> Path:
    target = folder / BUNDLE_NAME
    done = subprocess.run(
        ["git", "-C", repository, "bundle", "create", str(target), "--all"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise TaskError(f"cannot bundle {repository}: {done.stderr[-500:]}")
    return target


def repository_entry(bundle: Path) -> tuple[str, Path]:
    """(name, tar.gz) of the container cache entry for a bundle: `repo.git`, a bare repository with
    every ref of the bundle. The name is the bundle's digest, so equal bundles share one entry."""
    key = (str(bundle), bundle.stat().st_mtime_ns)
    return REPOSITORY_ENTRIES.get(key, lambda folder: _repository_entry(str(bundle), folder))


def _repository_entry(bundle: str, work: Path) -> tuple[str, Path]:
    digest = hashlib.sha256(Path(bundle).read_bytes()).hexdigest()[:DIGEST_CHARS]
    bare = work / REPOSITORY_NAME
    done = subprocess.run(
        ["git", "clone", "-q", "--mirror", bundle, str(bare)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise TaskError(f"cannot unbundle {bundle}: {done.stderr[-500:]}")
    shutil.rmtree(bare / "hooks", ignore_errors=True)  # samples only; nothing in the cache runs
    archive = work / "entry.tar.gz"
    with tarfile.open(archive, mode="w:gz") as tar:
        tar.add(bare, arcname=REPOSITORY_NAME)
    shutil.rmtree(bare)
    return f"repo-{digest}", archive


def wheels_entry(wheelhouse: str) -> tuple[str, Path]:
    """(name, tar.gz) of the container cache entry for the grader's wheels: `wheels/*.whl`, and
    `site/`, the same wheels installed (pure Python: what pip would put in a venv's site-packages)."""
    wheels = Path(wheelhouse)
    stamps = tuple(sorted((p.name, p.stat().st_mtime_ns) for p in wheels.glob("*.whl"))) if wheels.is_dir() else ()
    if not stamps:
        raise ConfigError(
            f"wheelhouse {wheelhouse!r} holds no wheels: fetch the grader's pinned wheels with "
            "`python -m envs.swe_smith.build --out envs/swe_smith/data --wheels-only` (make test does it)"
        )
    return WHEELS_ENTRIES.get((str(wheels), stamps), lambda folder: _wheels_entry(str(wheels), stamps, folder))


def _wheels_entry(wheelhouse: str, stamps: tuple, folder: Path) -> tuple[str, Path]:
    digest = hashlib.sha256(WHEELS_LAYOUT + b"\0")
    for name, _ in stamps:
        digest.update(name.encode() + b"\0" + Path(wheelhouse, name).read_bytes())
    wheels = [os.path.join(wheelhouse, name) for name, _ in stamps]
    site = folder / SITE_NAME
    _install(wheels, site)
    archive = folder / "entry.tar.gz"
    with tarfile.open(archive, mode="w:gz") as tar:
        for path in wheels:
            tar.add(path, arcname=f"{WHEELS_NAME}/{os.path.basename(path)}")
        tar.add(site, arcname=SITE_NAME)
    shutil.rmtree(site)
    return f"wheels-{digest.hexdigest()[:DIGEST_CHARS]}", archive


def _install(wheels: list[str], site: Path) -> None:
    """Install the wheels into the folder `site` with this Python's pip (`--target`: nothing it writes
    names an interpreter but its scripts, left out), then compile them. The bytecode is checked by its
    source's hash, not its time, which the cache does not keep; it is named for this Python's version,
    and a slot's Python of another version ignores it and compiles its own."""
    pip = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--no-index", "--no-deps"]
    pip += ["--no-cache-dir", "--disable-pip-version-check", "--no-compile", "--target", str(site), *wheels]
    compile_all = [sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", str(site)]
    for argv in (pip, compile_all):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(
                f"installing the grader's wheels with {sys.executable} failed (the worker's Python needs pip): "
                f"{(done.stderr or done.stdout)[-800:]}"
            )
    shutil.rmtree(site / "bin", ignore_errors=True)
    for direct_url in site.glob("*.dist-info/direct_url.json"):
        direct_url.unlink()  # the worker's own paths to the wheels: nothing the grader needs


async def share_entries(slot: SlotHandle, bundle: Path | None, wheelhouse: str) -> tuple[str | None, str]:
    """Put the repository (when local) and the wheels into the slot's container cache, each once per
    container; (repository entry or None, wheels entry)."""
    wheels_name, wheels_archive = await asyncio.to_thread(wheels_entry, wheelhouse)
    await slot.share(wheels_name, wheels_archive)
    if bundle is None:
        return None, wheels_name
    repo_name, repo_archive = await asyncio.to_thread(repository_entry, bundle)
    await slot.share(repo_name, repo_archive)
    return repo_name, wheels_name


def fetch_commands(instance: SweInstance, repo_base_url: str, git_dir: str) -> str:
    """Shell lines that fetch `base_commit` of a remote repository into the bare repo `git_dir`
    (shallow where the server allows, else the whole history), as the original did."""
    url = shlex.quote(f"{repo_base_url.rstrip('/')}/{instance.repo}.git")
    commit = shlex.quote(instance.base_commit)
    return (
        f"git init -q --bare {git_dir}\n"
        f"git -C {git_dir} fetch -q --depth 1 {url} {commit} || git -C {git_dir} fetch -q {url} '+refs/heads/*:refs/heads/*'\n"
    )
