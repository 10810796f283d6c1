"""The server's own mount namespace: the slots' volumes are mounted where only it and its sandboxes see them.

A sandbox server that mounts a filesystem per slot (`loop_fs`) would leave those mounts, and their
loop devices, on the host when it is killed (SIGKILL, a crashed worker's container, a test that
ends): nothing would ever unmount them. Mounted in a namespace of the server's own, they go with
the server's last process, whatever ends it; the image files stay, so a restarted server mounts
them again. Mounts propagate from the host into the namespace (a slave of the host's), never back.

Called once at start, before any thread: a namespace unshared later holds only the calling thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

log = logging.getLogger(__name__)

CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_SLAVE = 0x80000


def enter_own_mount_namespace() -> bool:
    """Move this (single-threaded) process into a mount namespace of its own; False where it cannot."""
    if os.geteuid() != 0 or threading.active_count() != 1:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        log.info("the server keeps the host's mount namespace: unshare: %s", os.strerror(ctypes.get_errno()))
        return False
    if libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:  # nothing mounted here reaches the host
        raise OSError(ctypes.get_errno(), "cannot make the server's mounts private")
    return True
