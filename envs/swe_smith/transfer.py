"""Gets a repository (and the grader's wheels) from the worker into a slot.

The worker finds the repository under `repo_base_url` (a `<repo>.bundle`, or a git repository
it bundles), packs it with the wheelhouse into one tar.gz, and `put_archive` unpacks that in
the slot. Until the slot handle has file transfer, the archive travels as base64 through one
`exec` (commands are read from stdin, so any length works); `put_archive` is the only place
that knows, so switching to an upload is a change here alone. A remote `repo_base_url` (a
URL) is not packed: the slot fetches the commit itself, with the network on.
"""

from __future__ import annotations

import base64
import functools
import io
import os
import shlex
import subprocess
import tarfile
import tempfile
from pathlib import Path

from envs.base import SlotHandle
from envs.swe_smith.model import SweInstance
from temporal_rollouts.core.errors import ConfigError, TaskError

BUNDLE_NAME = "repo.bundle"
WHEELS_NAME = "wheels"
BASE64_LINE = 76


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
                return _bundled(str(candidate), candidate.stat().st_mtime_ns)
    raise TaskError(f"repository {repo!r} not found under {repo_base_url!r} (no .bundle, .git or checkout)")


@functools.lru_cache(maxsize=32)
def _bundled(repository: str, _stamp: int) -> Path:
    target = Path(tempfile.mkdtemp(prefix="swe-bundle-")) / BUNDLE_NAME
    done = subprocess.run(
        ["git", "-C", repository, "bundle", "create", str(target), "--all"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise TaskError(f"cannot bundle {repository}: {done.stderr[-500:]}")
    return target


def grader_archive(bundle: Path | None, wheelhouse: str) -> bytes:
    """A tar.gz of `repo.bundle` (when given) and `wheels/*.whl`."""
    wheels = Path(wheelhouse)
    stamps = tuple(sorted((p.name, p.stat().st_mtime_ns) for p in wheels.glob("*.whl"))) if wheels.is_dir() else ()
    if not stamps:
        raise ConfigError(
            f"wheelhouse {wheelhouse!r} holds no wheels: fetch the grader's pinned wheels with "
            "`python -m envs.swe_smith.build --out envs/swe_smith/data --wheels-only` (make test does it)"
        )
    bundle_key = (str(bundle), bundle.stat().st_mtime_ns) if bundle is not None else None
    return _archive(bundle_key, str(wheels), stamps)


@functools.lru_cache(maxsize=16)
def _archive(bundle_key: tuple[str, int] | None, wheelhouse: str, stamps: tuple) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        if bundle_key is not None:
            archive.add(bundle_key[0], arcname=BUNDLE_NAME)
        for name, _ in stamps:
            archive.add(os.path.join(wheelhouse, name), arcname=f"{WHEELS_NAME}/{name}")
    return buffer.getvalue()


async def put_archive(slot: SlotHandle, key: str, archive: bytes, folder: str) -> None:
    """Unpack `archive` into the workspace folder `folder`, replacing what was there."""
    encoded = base64.b64encode(archive).decode()
    lines = "\n".join(encoded[i : i + BASE64_LINE] for i in range(0, len(encoded), BASE64_LINE))
    target = shlex.quote(folder)
    command = f"set -e\nrm -rf {target}\nmkdir -p {target}\nbase64 -d <<'__ARCHIVE__' | tar -xzf - -C {target}\n{lines}\n__ARCHIVE__\n"
    result = await slot.exec(key, command, timeout_s=120)
    if not result.ok:
        raise TaskError(f"copying the repository into the slot failed: {result.output[-500:]}")


def fetch_commands(instance: SweInstance, repo_base_url: str, git_dir: str) -> str:
    """Shell lines that fetch `base_commit` of a remote repository into the bare repo `git_dir`
    (shallow where the server allows, else the whole history), as the original did."""
    url = shlex.quote(f"{repo_base_url.rstrip('/')}/{instance.repo}.git")
    commit = shlex.quote(instance.base_commit)
    return (
        f"git init -q --bare {git_dir}\n"
        f"git -C {git_dir} fetch -q --depth 1 {url} {commit} || git -C {git_dir} fetch -q {url} '+refs/heads/*:refs/heads/*'\n"
    )
