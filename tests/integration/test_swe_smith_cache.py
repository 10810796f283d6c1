"""swe_smith's per-container repository cache, on a real sandbox server with bubblewrap: two
rollouts of one repository in two slots of one container put the repository once and share it,
keep their own edits, cannot write the cache (nor see it from their own commands), and set up
concurrently without racing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tarfile
import uuid
from pathlib import Path

import pytest

from envs import get_env
from envs.swe_smith.env import SweSmithEnv
from envs.swe_smith.transfer import local_bundle, repository_entry, wheels_entry
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.lease import Lease
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import CacheEntry, CacheQuery, SlotLease
from tests.support.sandbox import holder, needs_bubblewrap, ONE_CONTAINER

pytestmark = [pytest.mark.slow, needs_bubblewrap]

FIRST = "pypi__idna-3.10.drop_statement__fed67d2d"
SECOND = "pypi__idna-3.10.flip_comparison__126781d5"


def slot_of(pool: SandboxPool, lease: SlotLease, name: str, meta: dict | None = None) -> LeasedSlot:
    return LeasedSlot(pool, lease, f"{uuid.uuid4().hex[:8]}/{name}", meta=meta)


def cache_folder(backend: LocalBackend, lease: SlotLease) -> Path:
    return backend.container_dir(lease.container_id) / "root" / "cache"


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under `folder` (its dot-files aside) with the digest of its bytes."""
    found = {}
    for parent, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            path = Path(parent, name)
            if not path.relative_to(folder).parts[0].startswith("."):
                found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def record_shares(monkeypatch: pytest.MonkeyPatch) -> list[CacheEntry]:
    """What every `share` answered: `created` tells a put that sent the entry from one that found it."""
    answers: list[CacheEntry] = []
    share = Lease.share

    async def recorded(self: Lease, *args, **kwargs) -> CacheEntry:
        answers.append(entry := await share(self, *args, **kwargs))
        return entry

    monkeypatch.setattr(Lease, "share", recorded)
    return answers


def swe_env() -> SweSmithEnv:
    env = get_env("swe_smith")
    assert isinstance(env, SweSmithEnv)
    return env


async def test_two_slots_share_the_repository_once_and_keep_their_own_edits(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = swe_env()
    first, second = env.instance(Item(id=FIRST)), env.instance(Item(id=SECOND))
    assert first.repo == second.repo
    name = first.checkout_name
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        shares = record_shares(monkeypatch)
        one = await pool.acquire(holder("cache-one"), ttl_s=600, wait_s=60)
        two = await pool.acquire(holder("cache-two"), ttl_s=600, wait_s=60)
        assert one.container_id == two.container_id and one.slot != two.slot
        cache = cache_folder(backend, one)

        meta_one = await env.setup_workspace(Item(id=FIRST), slot_of(pool, one, "setup"))
        assert [entry.created for entry in shares] == [True, True], shares  # wheels, then the repository
        entries = sorted(path.name for path in cache.iterdir() if not path.name.startswith("."))
        assert [entry.split("-")[0] for entry in entries] == ["repo", "wheels"], entries
        inodes = {entry: (cache / entry).stat().st_ino for entry in entries}
        before = fingerprint(cache)

        meta_two = await env.setup_workspace(Item(id=SECOND), slot_of(pool, two, "setup"))
        assert [entry.created for entry in shares[2:]] == [False, False], shares  # found, nothing sent
        assert all(entry.bytes == 0 for entry in shares[2:])
        assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == entries
        assert {entry: (cache / entry).stat().st_ino for entry in entries} == inodes
        assert fingerprint(cache) == before

        # Each slot has its own checkout of its own base_commit: an edit in one is not in the other.
        a, b = slot_of(pool, one, "edit"), slot_of(pool, two, "look")
        edited = await a.terminal(f"cd {name} && echo '# slot one was here' >> idna/core.py && git status --short")
        assert edited.ok and "idna/core.py" in edited.output, edited.output
        clean = await b.terminal(f"cd {name} && git status --short && grep -c 'slot one was here' idna/core.py")
        assert "slot one was here" not in clean.output and clean.exit_code == 1, clean.output
        assert "idna/core.py" not in clean.output

        # The agent's own commands never see the cache (it holds every commit, the fixes included).
        hidden = await a.terminal('ls /cache; echo "[$SANDBOX_CACHE]"; git -C /cache log --all 2>&1 | head -1')
        assert "No such file or directory" in hidden.output and "[]" in hidden.output, hidden.output

        # Grading reads the repository and wheels from the cache: a fixed slot scores 1, the other 0.
        fix = slot_of(pool, two, "fix")
        assert (await fix.write_file(".swe/fix.patch", second.patch or "")).ok
        assert (await fix.terminal(f"cd {name} && git apply ../.swe/fix.patch")).ok
        fixed = await env.verify(Item(id=SECOND), slot_of(pool, two, "verify", meta=meta_two), [])
        broken = await env.verify(Item(id=FIRST), slot_of(pool, one, "verify", meta=meta_one), [])
        assert fixed.score == 1.0, fixed.details
        assert broken.score == 0.0 and broken.details["installed"], broken.details
        assert fingerprint(cache) == before

        # The cache outlives the slots' leases and resets.
        await pool.release(one)
        await pool.release(two)
        assert fingerprint(cache) == before


async def test_a_slot_cannot_write_the_cache(backend: LocalBackend) -> None:
    env = swe_env()
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        lease = await pool.acquire(holder("cache-write"), ttl_s=600, wait_s=60)
        await env.setup_workspace(Item(id=FIRST), slot_of(pool, lease, "setup"))
        cache = cache_folder(backend, lease)
        repo = next(path.name for path in cache.iterdir() if path.name.startswith("repo-"))
        before = fingerprint(cache)
        assert any(path.endswith("repo.git/HEAD") for path in before)

        slot = slot_of(pool, lease, "attack")
        attempts = [
            f"touch /cache/{repo}/planted",
            f"echo ref: refs/heads/evil > /cache/{repo}/repo.git/HEAD",
            f"rm -rf /cache/{repo}/repo.git/objects",
            f"git -C /cache/{repo}/repo.git update-ref refs/heads/evil HEAD",
            f"mount -o remount,rw /cache/{repo}",
            "mkdir /cache/another",
        ]
        for index, attempt in enumerate(attempts):
            result = await slot.terminal(attempt, key=f"attempt-{index}", cache=[repo])
            assert not result.ok, (attempt, result.output)
        seen = await slot.terminal(f"ls /cache/{repo}/repo.git/HEAD && ls /cache", cache=[repo])
        assert seen.ok and seen.output.split()[-1] == repo, seen.output  # it sees only what it named
        assert fingerprint(cache) == before
        await pool.release(lease)


async def test_concurrent_setups_of_one_repository_both_succeed(backend: LocalBackend, tmp_path: Path) -> None:
    env = swe_env()
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        one = await pool.acquire(holder("race-one"), ttl_s=600, wait_s=60)
        two = await pool.acquire(holder("race-two"), ttl_s=600, wait_s=60)
        assert one.container_id == two.container_id
        metas = await asyncio.gather(
            env.setup_workspace(Item(id=FIRST), slot_of(pool, one, "setup")),
            env.setup_workspace(Item(id=SECOND), slot_of(pool, two, "setup")),
        )
        assert [meta["instance_id"] for meta in metas] == [FIRST, SECOND]
        cache = cache_folder(backend, one)
        assert len([p for p in cache.iterdir() if p.name.startswith("repo-")]) == 1
        assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
        for lease, instance_id in ((one, FIRST), (two, SECOND)):
            name = env.instance(Item(id=instance_id)).checkout_name
            look = await slot_of(pool, lease, "look").terminal(
                f"cd {name} && git log --oneline | wc -l && ls ../.swe/wheels"
            )
            assert look.ok and look.output.split()[0] == "1" and "pytest-" in look.output, look.output

        # Two puts of one new entry at once, past the presence check: one stores it, the other finds it.
        bundle = local_bundle(env.settings.repo_base_url, env.instance(Item(id=FIRST)).repo)
        _, archive = repository_entry(bundle)
        client = await pool.fleet.client(one.container_id)
        query = CacheQuery(name="raced-entry")
        answers = await asyncio.gather(*(client.upload(query, archive) for _ in range(4)))
        assert sorted(answer.created for answer in answers) == [False, False, False, True], answers
        assert (cache / "raced-entry" / "repo.git" / "HEAD").is_file()
        assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
        wheels_name, _ = wheels_entry(env.settings.wheelhouse)
        assert (await client.send(CacheQuery(name=wheels_name))).present
        assert not (await client.send(CacheQuery(name="never-put"))).present
        await pool.release(one)
        await pool.release(two)


def test_the_wheels_entry_holds_the_wheels_installed_with_bytecode_checked_by_hash(tmp_path: Path) -> None:
    """The grader copies `site/` into its venv rather than running pip over the wheels each time: every
    wheel is installed there, its bytecode valid whatever times the cache gives the files, and nothing
    names the worker's paths or holds its scripts."""
    wheelhouse = get_env("swe_smith").settings.wheelhouse
    name, archive = wheels_entry(wheelhouse)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    site = tmp_path / "site"
    wheels = sorted(p.name for p in (tmp_path / "wheels").glob("*.whl"))
    assert wheels == sorted(p.name for p in Path(wheelhouse).glob("*.whl"))
    installed = sorted(p.name.split("-")[0].lower() for p in site.glob("*.dist-info"))
    assert installed == sorted(wheel.split("-")[0].lower() for wheel in wheels)
    assert not (site / "bin").exists() and not list(site.glob("*.dist-info/direct_url.json"))
    compiled = list(site.glob("_pytest/**/*.pyc"))
    assert compiled and all(int.from_bytes(p.read_bytes()[4:8], "little") & 0b11 == 0b11 for p in compiled)
    assert name.startswith("wheels-")
