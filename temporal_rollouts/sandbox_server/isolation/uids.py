"""Slot uids that no two slots on one host share, across servers and containers.

The kernel counts RLIMIT_NPROC per uid, and files belong to uids: two slots with one uid share
a process limit (one slot's processes starve another's verifier, which then fails with
`setpriv: failed to execute bash: Resource temporarily unavailable`) and each other's files. A
fixed `base + slot index` gives slot 2 of every container on a host the same uid.

So a root-run server claims one uid per slot from a range every server of the host shares, by
holding an exclusive `flock` on `<claims dir>/<uid>` for as long as it runs. The kernel drops the
lock when the process dies, so a crashed server's uids come free by themselves and no claim can
go stale. A slot keeps its uid across restarts of its server (written in `slot-<i>/uid`), so a
lease that survives the restart keeps owning its files; if another server took that uid
meanwhile, the slot gets another one (and `SlotManager` gives the workspace to it). Uids that
name a user on this host (`nobody` among them) are never claimed.

What the backends must guarantee: every root-run server on one host sees the same claims folder
(processes on the host do; a container must mount the host's) and draws from the same range, or
from ranges that do not overlap.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import SandboxRequired


class UidClaims:
    def __init__(self, directory: Path, first: int, count: int) -> None:
        self.directory, self.first, self.count = directory, first, count
        self._held: dict[int, int] = {}
        self._next = 0  # where the next search starts, so n claims cost O(n + uids held elsewhere), not O(n^2)
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as err:
            raise SandboxRequired(
                f"cannot make the slot uid claims folder {directory} ({err.strerror}); "
                "set sandbox.uid_claims_dir (--uid-claims-dir) to a folder every "
                "sandbox server on this host shares"
            ) from None

    def claim(self, preferred: int | None = None) -> int:
        """A uid of the range that no other slot on this host holds, `preferred` if it is free.

        The search goes on from where the last one stopped: a server of 500 slots starting beside
        three others would otherwise try every uid they hold again for each of its slots (minutes)."""
        if preferred is not None and self.first <= preferred < self.first + self.count and self._take(preferred):
            return preferred
        for _ in range(self.count):
            uid = self.first + self._next
            self._next = (self._next + 1) % self.count
            if self._take(uid):
                return uid
        raise SandboxRequired(
            f"every slot uid of {self.first}..{self.first + self.count - 1} is held by a sandbox server on this "
            "host: raise sandbox.slot_uid_count, or run fewer slots here"
        )

    def _take(self, uid: int) -> bool:
        if uid in self._held or _names_a_user(uid):
            return False
        fd = os.open(self.directory / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[uid] = fd
        return True

    def close(self) -> None:
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held.clear()


def saved_uid(slot_dir: Path) -> int | None:
    try:
        return int((slot_dir / "uid").read_text())
    except (OSError, ValueError):
        return None


def save_uid(slot_dir: Path, uid: int) -> None:
    slot_dir.mkdir(parents=True, exist_ok=True)
    (slot_dir / "uid").write_text(str(uid))


def _names_a_user(uid: int) -> bool:
    """Asked per uid (not listed once with getpwall): a name service that does not enumerate its
    users (LDAP, sssd) still answers for one."""
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False
