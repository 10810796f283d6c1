"""What a slot's workspace holds: walked (a checked volume) paced by its cost, bounded by the file limit."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from temporal_rollouts.sandbox_server.isolation import bubblewrap
from temporal_rollouts.sandbox_server.isolation import syscall_filter
from temporal_rollouts.sandbox_server.config import SlotLimits
from temporal_rollouts.sandbox_server.volumes.disk_watch import PACE, DiskWatch
from temporal_rollouts.sandbox_server.volumes.slot_volume import SlotVolume

KIB = 1024
LIMITS = SlotLimits(disk_limit_mb=1024, max_files=1000)
NO_LIMITS = SlotLimits.off()


def grow(workspace, name: str, size: int = 64 * KIB) -> None:
    (workspace / name).write_bytes(b"x" * size)


@pytest.fixture
def volume(tmp_path) -> SlotVolume:
    checked = SlotVolume(tmp_path, "checked", LIMITS)
    checked.workspace.mkdir(parents=True)
    return checked


async def used(watch: DiskWatch, volume: SlotVolume, ran_s: float, refused: bool = True, limits=LIMITS) -> int:
    return (await watch.after(volume, ran_s, bits_refused=refused, limits=limits)).bytes


async def test_a_paced_watch_walks_again_only_once_the_slot_ran_long_enough(volume):
    watch = DiskWatch()
    first = await used(watch, volume, 0.0)  # never walked: walks
    assert watch.fresh and watch.walk_s > 0
    grow(volume.workspace, "a")
    quick = max(watch.walk_s, 1e-6)
    assert await used(watch, volume, quick) == first  # not due yet
    assert await used(watch, volume, PACE * quick) >= first + 64 * KIB


async def test_without_the_syscall_filter_every_command_is_walked(volume):
    watch = DiskWatch()
    first = await used(watch, volume, 0.0, refused=False)
    grow(volume.workspace, "a")
    assert await used(watch, volume, 0.0, refused=False) >= first + 64 * KIB


async def test_over_the_limit_the_walks_stay_paced_so_a_huge_tree_costs_a_share_of_the_time(volume):
    """The issue's 300k files over the limit cost 2 CPU-s on every call: over the limit, walks are paced too."""
    small = SlotLimits(disk_limit_mb=1, max_files=1000)
    grow(volume.workspace, "big", 2048 * KIB)
    watch = DiskWatch()
    assert await used(watch, volume, 0.0, limits=small) > 1024 * KIB
    (volume.workspace / "big").unlink()
    assert await used(watch, volume, 0.0, limits=small) > 1024 * KIB and watch.walks == 1  # not due yet
    assert await used(watch, volume, PACE * max(watch.walk_s, 1e-6), limits=small) < 1024 * KIB


async def test_a_walk_stops_past_the_file_limit(volume):
    for index in range(50):
        (volume.workspace / f"f{index}").touch()
    usage = await DiskWatch().after(volume, 0.0, bits_refused=True, limits=SlotLimits(max_files=10))
    assert usage.cut and usage.files == 11
    assert usage.passed(SlotLimits(max_files=10), 10) == "files"


async def test_a_tree_deeper_than_a_walk_goes_is_said_never_raised(volume):
    here = os.getcwd()
    os.chdir(volume.workspace)
    try:
        for _ in range(2100):  # one level at a time: the whole path would pass PATH_MAX
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)
    roomy = SlotLimits(disk_limit_mb=1024, max_files=10_000)  # the walk must not stop at the file limit first
    try:
        usage = await DiskWatch().after(volume, 0.0, bits_refused=False, limits=roomy)
        assert usage.too_deep and usage.passed(roomy, 10_000) == "depth"
    finally:  # pytest's own clean-up recurses, and fails at this depth
        subprocess.run(["rm", "-rf", "--", str(volume.workspace / "d")], check=True)


async def test_processes_are_stopped_once_per_crossing_and_again_only_if_it_grew(volume):
    small = SlotLimits(disk_limit_mb=1, max_files=1000)
    watch = DiskWatch()
    grow(volume.workspace, "big", 2048 * KIB)
    usage = await watch.after(volume, 0.0, bits_refused=False, limits=small)
    assert watch.judge(usage, volume, small) == ("disk", True)
    assert watch.judge(usage, volume, small) == ("disk", False)  # stopped already: the agent may `rm` now
    grow(volume.workspace, "more", 2048 * KIB)
    usage = await watch.after(volume, 0.0, bits_refused=False, limits=small)
    assert watch.judge(usage, volume, small) == ("disk", True)  # a writer started again
    for name in ("big", "more"):
        (volume.workspace / name).unlink()
    usage = await watch.after(volume, 0.0, bits_refused=False, limits=small)
    assert watch.judge(usage, volume, small) == (None, False)
    grow(volume.workspace, "again", 2048 * KIB)
    usage = await watch.after(volume, 0.0, bits_refused=False, limits=small)
    assert watch.judge(usage, volume, small) == ("disk", True)  # a new crossing


async def test_an_upload_or_copy_makes_the_next_command_walk(volume):
    watch = DiskWatch()
    first = await used(watch, volume, 0.0)
    grow(volume.workspace, "uploaded")
    watch.changed()
    assert await used(watch, volume, 0.0) >= first + 64 * KIB


async def test_file_writes_count_until_the_next_walk(volume):
    watch = DiskWatch()
    first = await used(watch, volume, 0.0)
    watch.wrote(10 * KIB)
    assert await used(watch, volume, 0.0) == first + 10 * KIB


async def test_with_no_limit_and_the_bits_refused_nothing_is_walked(volume):
    watch = DiskWatch()
    grow(volume.workspace, "a")
    assert await used(watch, volume, 10.0, limits=NO_LIMITS) == 0
    assert not watch.fresh


async def test_where_the_bits_are_not_refused_the_walk_strips_them(volume):
    """The fallback without a syscall filter (no libseccomp, or no bubblewrap)."""
    workspace = volume.workspace
    (workspace / "sub").mkdir()
    for name, mode in (("suid", 0o4755), ("sub/sgid", 0o2755), ("both", 0o6711)):
        grow(workspace, name)
        os.chmod(workspace / name, mode)
    await DiskWatch().after(volume, 0.0, bits_refused=False, limits=NO_LIMITS)
    modes = {name: stat.S_IMODE((workspace / name).lstat().st_mode) for name in ("suid", "sub/sgid", "both")}
    assert modes == {"suid": 0o755, "sub/sgid": 0o755, "both": 0o711}


def test_a_filter_bubblewrap_cannot_load_is_left_out_and_the_bits_are_stripped_instead(monkeypatch):
    """A platform that refuses seccomp filters must not lose every command: the probe finds out once."""
    if bubblewrap.bubblewrap_strategy() is None:
        pytest.skip("bubblewrap cannot build a sandbox here")
    monkeypatch.setattr(syscall_filter, "compiled", lambda: b"\x06\x00\x00\x00")  # half an instruction
    bubblewrap.setuid_bits_refused.cache_clear()
    try:
        assert not bubblewrap.setuid_bits_refused()
    finally:
        monkeypatch.undo()
        bubblewrap.setuid_bits_refused.cache_clear()
    assert bubblewrap.setuid_bits_refused()
