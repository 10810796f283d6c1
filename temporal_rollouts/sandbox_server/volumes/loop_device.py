"""Mounting an image through a loop device, and unmounting it, by the system calls themselves.

A slot's reset mounts a new filesystem (`loop_fs`). Done with util-linux it cost two processes
(`losetup -j`, `mount -o loop`, which also scans every loop device) and 20-400 ms on this shared
VM; here it is four ioctls and mount(2). The device is configured with autoclear, so it goes with
the last unmount. `loop_fs` falls back to util-linux wherever this fails (a kernel before
LOOP_CONFIGURE, 5.8; a container whose /dev lacks the device node).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from pathlib import Path

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID, MS_NODEV, MS_NOATIME = 0x2, 0x4, 0x400
MNT_DETACH = 2
ATTACH_TRIES = 8


class _LoopInfo64(ctypes.Structure):
    _fields_ = [
        ("lo_device", ctypes.c_uint64),
        ("lo_inode", ctypes.c_uint64),
        ("lo_rdevice", ctypes.c_uint64),
        ("lo_offset", ctypes.c_uint64),
        ("lo_sizelimit", ctypes.c_uint64),
        ("lo_number", ctypes.c_uint32),
        ("lo_encrypt_type", ctypes.c_uint32),
        ("lo_encrypt_key_size", ctypes.c_uint32),
        ("lo_flags", ctypes.c_uint32),
        ("lo_file_name", ctypes.c_uint8 * 64),
        ("lo_crypt_name", ctypes.c_uint8 * 64),
        ("lo_encrypt_key", ctypes.c_uint8 * 32),
        ("lo_init", ctypes.c_uint64 * 2),
    ]


class _LoopConfig(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("info", _LoopInfo64),
        ("reserved", ctypes.c_uint64 * 8),
    ]


def mount_image(image: Path, target: Path, options: str) -> None:
    """Attach `image` to a free loop device (autoclear) and mount its ext4 at `target`, nosuid, nodev and
    noatime, with the filesystem's `options`; raises OSError."""
    device, held = _attach(image)
    try:
        flags = MS_NOSUID | MS_NODEV | MS_NOATIME
        if _libc().mount(device.encode(), os.fsencode(target), b"ext4", flags, options.encode()) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"mount {device} on {target}: {os.strerror(code)}")
    finally:
        os.close(held)  # from now on the mount alone holds the device; without one, autoclear detaches it


def unmount(target: Path, lazily: bool = False) -> None:
    """umount2(2); `lazily`: detach now and let it go with its last user. Raises OSError."""
    if _libc().umount2(os.fsencode(target), MNT_DETACH if lazily else 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")


def _attach(image: Path) -> tuple[str, int]:
    """A free loop device attached to `image`, and its open descriptor (which keeps it attached until closed)."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(ATTACH_TRIES):  # another process may take the free device first
                number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                config = _LoopConfig(fd=backing)
                config.info.lo_flags = LO_FLAGS_AUTOCLEAR
                try:
                    fcntl.ioctl(loop, LOOP_CONFIGURE, config)
                except OSError as err:
                    os.close(loop)
                    if err.errno == errno.EBUSY:
                        continue
                    raise
                return device, loop
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(control)
    finally:
        os.close(backing)


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC
