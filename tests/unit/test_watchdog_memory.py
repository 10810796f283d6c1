"""The watchdog counts what a memory cgroup would: private pages, and each shared object once."""

from __future__ import annotations

import mmap
import os

import pytest

from temporal_rollouts.sandbox_server.limits.shared_memory import FDS_PER_PASS, Held, MountCache, held_by
from temporal_rollouts.sandbox_server.limits.watchdog import SlotRule, Watchdog, _Watched

MIB = 1024 * 1024


def test_memfds_held_or_mapped_count_though_no_rss_shows_them():
    held_fd = os.memfd_create("held")
    mapped_fd = os.memfd_create("mapped")
    try:
        for _ in range(24):
            os.write(held_fd, b"x" * MIB)  # written, never mapped: in no process's RSS
        os.ftruncate(mapped_fd, 16 * MIB)
        with mmap.mmap(mapped_fd, 16 * MIB) as mapped:
            mapped[:] = b"y" * (16 * MIB)
            held = held_by(os.getpid(), MountCache(budget=FDS_PER_PASS))
        assert held is not None
        for fd, size in ((held_fd, 24 * MIB), (mapped_fd, 16 * MIB)):
            info = os.fstat(fd)
            assert held.shared[(info.st_dev, info.st_ino)] >= size
    finally:
        os.close(held_fd)
        os.close(mapped_fd)


def test_a_shared_object_leaves_the_total_with_the_last_process_that_held_it(monkeypatch):
    killed = []
    monkeypatch.setattr(
        "temporal_rollouts.sandbox_server.limits.watchdog._signal", lambda pid, signum: killed.append(pid) or True
    )
    watchdog = Watchdog(lambda slot: SlotRule(uid=None, memory_bytes=300 * MIB, cpus=0))
    memfd = (1, 99)
    held = {
        1: Held(private=10 * MIB, shared={memfd: 400 * MIB}),  # holds the memfd: the most
        2: Held(private=20 * MIB, shared={memfd: 400 * MIB}),  # holds it too
        3: Held(private=50 * MIB),
    }
    watched = _Watched()
    watchdog._hold_memory(watched, held, 300 * MIB)
    assert killed == [2, 1]  # the memfd is gone only once both holders are; process 3 fits then
    assert "memory limit of 300 MiB" in watched.notices[0]


def test_a_memfd_behind_many_open_files_is_found_over_a_few_passes_each_of_bounded_cost():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 12_000:
        pytest.skip("this process may not open 12,000 files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 12_000), hard))
    decoys = [os.dup(0) for _ in range(10_000)]
    memfd = os.memfd_create("behind")
    try:
        os.write(memfd, b"x" * MIB)
        key = (os.fstat(memfd).st_dev, os.fstat(memfd).st_ino)
        cache, passes = MountCache(), 0
        while True:
            passes += 1
            cache.budget = FDS_PER_PASS
            held = held_by(os.getpid(), cache)
            assert cache.budget >= 0
            if held is not None and key in held.shared:
                break
            assert passes < 10
        assert passes == 3  # 10,000 descriptors at 4,096 a pass
    finally:
        for fd in decoys:
            os.close(fd)
        os.close(memfd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
