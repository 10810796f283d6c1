"""The workspace walk after a command is paced by its cost once the sandbox refuses setuid bits."""

from __future__ import annotations

import os
import stat

import pytest

from temporal_rollouts.sandbox_server import isolation, syscall_filter
from temporal_rollouts.sandbox_server.disk_watch import PACE, DiskWatch

KIB = 1024
LIMIT = 1 << 30


def grow(workspace, name: str, size: int = 64 * KIB) -> None:
    (workspace / name).write_bytes(b"x" * size)


async def test_a_paced_watch_walks_again_only_once_the_slot_ran_long_enough(tmp_path):
    watch = DiskWatch()
    first = await watch.usage(tmp_path, 0.0, bits_refused=True, limit=LIMIT)  # never walked: walks
    assert watch.fresh and watch.walk_s > 0
    grow(tmp_path, "a")
    quick = max(watch.walk_s, 1e-6)
    assert await watch.usage(tmp_path, quick, bits_refused=True, limit=LIMIT) == first  # not due yet
    later = await watch.usage(tmp_path, PACE * quick, bits_refused=True, limit=LIMIT)
    assert later >= first + 64 * KIB


async def test_without_the_syscall_filter_every_command_is_walked(tmp_path):
    watch = DiskWatch()
    first = await watch.usage(tmp_path, 0.0, bits_refused=False, limit=LIMIT)
    grow(tmp_path, "a")
    assert await watch.usage(tmp_path, 0.0, bits_refused=False, limit=LIMIT) >= first + 64 * KIB


async def test_over_the_limit_every_command_is_walked_so_the_notice_goes_once_files_do(tmp_path):
    grow(tmp_path, "big", 256 * KIB)
    watch = DiskWatch()
    assert await watch.usage(tmp_path, 0.0, bits_refused=True, limit=128 * KIB) > 128 * KIB
    (tmp_path / "big").unlink()
    assert await watch.usage(tmp_path, 0.0, bits_refused=True, limit=128 * KIB) < 128 * KIB


async def test_an_upload_or_copy_makes_the_next_command_walk(tmp_path):
    watch = DiskWatch()
    first = await watch.usage(tmp_path, 0.0, bits_refused=True, limit=LIMIT)
    grow(tmp_path, "uploaded")
    watch.changed()
    assert await watch.usage(tmp_path, 0.0, bits_refused=True, limit=LIMIT) >= first + 64 * KIB


async def test_file_writes_count_until_the_next_walk(tmp_path):
    watch = DiskWatch()
    first = await watch.usage(tmp_path, 0.0, bits_refused=True, limit=LIMIT)
    watch.wrote(10 * KIB)
    assert await watch.usage(tmp_path, 0.0, bits_refused=True, limit=LIMIT) == first + 10 * KIB


async def test_with_no_limit_and_the_bits_refused_nothing_is_walked(tmp_path):
    watch = DiskWatch()
    grow(tmp_path, "a")
    assert await watch.usage(tmp_path, 10.0, bits_refused=True, limit=0) == 0
    assert not watch.fresh


async def test_where_the_bits_are_not_refused_the_walk_strips_them(tmp_path):
    """The fallback without a syscall filter (no libseccomp, or no bubblewrap)."""
    (tmp_path / "sub").mkdir()
    for name, mode in (("suid", 0o4755), ("sub/sgid", 0o2755), ("both", 0o6711)):
        grow(tmp_path, name)
        os.chmod(tmp_path / name, mode)
    await DiskWatch().usage(tmp_path, 0.0, bits_refused=False, limit=0)
    modes = {name: stat.S_IMODE((tmp_path / name).lstat().st_mode) for name in ("suid", "sub/sgid", "both")}
    assert modes == {"suid": 0o755, "sub/sgid": 0o755, "both": 0o711}


def test_a_filter_bubblewrap_cannot_load_is_left_out_and_the_bits_are_stripped_instead(monkeypatch):
    """A platform that refuses seccomp filters must not lose every command: the probe finds out once."""
    if isolation.bubblewrap_strategy() is None:
        pytest.skip("bubblewrap cannot build a sandbox here")
    monkeypatch.setattr(syscall_filter, "compiled", lambda: b"\x06\x00\x00\x00")  # half an instruction
    isolation.setuid_bits_refused.cache_clear()
    try:
        assert not isolation.setuid_bits_refused()
    finally:
        monkeypatch.undo()
        isolation.setuid_bits_refused.cache_clear()
    assert isolation.setuid_bits_refused()
