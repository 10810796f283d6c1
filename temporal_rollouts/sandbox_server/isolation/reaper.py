"""The sandboxes' orphans, adopted and reaped by the server.

bubblewrap's own init in a command's pid namespace can outlive the bwrap the server started:
that bwrap exits as soon as the init reports the command's status, so the init ends as an orphan.
An orphan goes to the nearest subreaper, and as a zombie it keeps its pid and its count in the
slot's pids cgroup until someone reaps it. A host's init may reap late (on the 2-core VM this was
measured on: after dozens of commands, enough to fill a slot's process limit, so that its next
command could not start), and in a container whose pid 1 is this server, never. So the server
makes itself a child subreaper and reaps the orphans that come to it.

It reaps only zombies from a pid namespace nested below its own (more pids in /proc/<pid>/status's
NSpid than in its own): the server starts every process of its own in its own namespace, so a
child it is waiting for (asyncio's, subprocess's) is never taken from under the code waiting for it.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process a child subreaper (Linux 3.4+); False where that is refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("cannot become a child subreaper (errno %d): sandbox orphans go to init", ctypes.get_errno())
        return False
    return True


def reap_orphans() -> int:
    """Reap the zombie children that came from a sandbox, oldest first, up to the first that did not
    (its own waiter reaps that one, and the next call goes on); returns how many were reaped."""
    reaped = 0
    while True:
        try:
            zombie = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if zombie is None or _namespace_depth(zombie.si_pid) <= _namespace_depth("self"):
            return reaped
        try:
            os.waitpid(zombie.si_pid, os.WNOHANG)
            reaped += 1
        except ChildProcessError:
            pass


def _namespace_depth(pid: int | str) -> int:
    """How many pid namespaces, from this /proc's down, the process has a pid in (0 if unknown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) - 1
    except OSError:
        pass
    return 0
