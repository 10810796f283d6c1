"""Slot uid claims: disjoint across servers of one host, kept across restarts, and cheap to make.

Two `UidClaims` in one process behave as two servers: `flock` locks belong to the open file, so
the second one's lock on a uid the first holds fails as it would in another process.
"""

from __future__ import annotations

import fcntl
import pwd

import pytest

from temporal_rollouts.sandbox_server.isolation import uids
from temporal_rollouts.sandbox_server.errors import SandboxRequired
from temporal_rollouts.sandbox_server.isolation.uids import UidClaims

FIRST = 61_000


@pytest.fixture
def lock_attempts(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = fcntl.flock

    def counted(fd, operation):
        calls.append(fd)
        return real(fd, operation)

    monkeypatch.setattr(uids.fcntl, "flock", counted)
    return calls


def test_servers_of_one_host_get_disjoint_uids(tmp_path):
    first, second = UidClaims(tmp_path, FIRST, 100), UidClaims(tmp_path, FIRST, 100)
    try:
        a = [first.claim() for _ in range(40)]
        b = [second.claim() for _ in range(40)]
        assert len(set(a)) == 40 and len(set(b)) == 40
        assert not set(a) & set(b)
    finally:
        first.close()
        second.close()


def test_a_server_starting_beside_others_tries_each_of_their_uids_once_not_once_per_slot(tmp_path, lock_attempts):
    others = [UidClaims(tmp_path, FIRST, 2_000) for _ in range(3)]
    last = UidClaims(tmp_path, FIRST, 2_000)
    try:
        for other in others:
            for _ in range(300):
                other.claim()
        lock_attempts.clear()
        claimed = [last.claim() for _ in range(300)]
        assert len(set(claimed)) == 300
        # 900 uids held elsewhere are each tried once, then 300 free ones; the search from the
        # range's start for every slot made 300 x 900 attempts here.
        assert len(lock_attempts) == 900 + 300
    finally:
        for claims in [*others, last]:
            claims.close()


def test_a_restarted_slot_keeps_its_uid_unless_another_server_took_it(tmp_path):
    before = UidClaims(tmp_path, FIRST, 50)
    kept = before.claim()
    before.close()  # the server stopped: the kernel (here: close) drops its locks

    thief = UidClaims(tmp_path, FIRST, 50)
    restarted = UidClaims(tmp_path, FIRST, 50)
    try:
        assert restarted.claim(preferred=kept) == kept
        taken = thief.claim(preferred=FIRST + 7)
        assert restarted.claim(preferred=taken) != taken
    finally:
        thief.close()
        restarted.close()


def test_uids_that_name_a_user_are_never_claimed(tmp_path):
    nobody = pwd.getpwnam("nobody").pw_uid
    span = range(nobody - 2, nobody + 3)
    free = [uid for uid in span if uid not in {entry.pw_uid for entry in pwd.getpwall()}]
    claims = UidClaims(tmp_path, span.start, len(span))
    try:
        assert sorted(claims.claim() for _ in free) == free
        with pytest.raises(SandboxRequired):
            claims.claim(preferred=nobody)
    finally:
        claims.close()


def test_an_exhausted_range_is_a_clear_error(tmp_path):
    claims = UidClaims(tmp_path, FIRST, 3)
    try:
        for _ in range(3):
            claims.claim()
        with pytest.raises(SandboxRequired, match="raise sandbox.slot_uid_count"):
            claims.claim()
    finally:
        claims.close()
