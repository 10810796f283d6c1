"""The seccomp filter the agent's sandboxes run under: no process of theirs can set a setuid or setgid bit.

Stripping the bits after each command (`workspace.settle`) left them on the host's disk while the
command ran, and cost a walk of the whole workspace per command: on an SWE checkout of a few
thousand files that walk is 10-20 CPU-ms of stat calls, several times the rest of a tool call.
Refused at the syscall, the bits never exist, so after the agent's commands the walk is needed
only for the disk limit and can be paced (`disk_watch`). The agent's sandboxes are its resident
launcher (and every command it forks) and its stateful terminal. Hooks (setup, verification) keep
sandboxes of their own without the filter, walked after every command as before: a verifier's
tests must pass or fail as they would anywhere, and some test suites set those bits on purpose.

Every call that takes a mode is refused with EPERM when the mode carries S_ISUID or S_ISGID:
chmod, fchmod, fchmodat, fchmodat2, creat, open, openat, mknod, mknodat. Calls whose mode seccomp
cannot read (openat2 keeps it in a struct; io_uring submits opens from a ring) answer ENOSYS, so
libraries fall back to the calls above. Syscalls of another ABI (i386 or x32 on x86_64) answer
ENOSYS too, so the filter cannot be stepped around. mkdir needs no rule: the kernel drops those bits
from its mode. The filter is built with libseccomp (through `pyseccomp`) once per server. Where
libseccomp is missing or bwrap cannot load the filter (`bubblewrap.setuid_bits_refused` tries it
once), sandboxes run without it and the server strips the bits after every command.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import tempfile

log = logging.getLogger(__name__)

PRIVILEGE_BITS = (stat.S_ISUID, stat.S_ISGID)
MODE_ARGUMENT = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "creat": 1,
    "open": 2,
    "openat": 3,
    "mknod": 1,
    "mknodat": 2,
}
"""Each call that sets a mode, and which of its arguments the mode is (0-based)."""
UNINSPECTABLE = ("openat2", "io_uring_setup", "io_uring_enter", "io_uring_register")
"""Calls that can set a mode the filter cannot read: refused as if the kernel lacked them."""


@functools.cache
def compiled() -> bytes | None:
    """The filter as a BPF program for bwrap's --seccomp, or None where libseccomp is missing."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as err:  # pyseccomp raises RuntimeError without libseccomp
        log.warning("no seccomp filter (%s): setuid bits are stripped after each command instead", err)
        return None
    refuse, absent = seccomp.ERRNO(errno.EPERM), seccomp.ERRNO(errno.ENOSYS)
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    program.set_attr(seccomp.Attr.ACT_BADARCH, absent)
    for name, index in MODE_ARGUMENT.items():
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) < 0:  # not on this architecture (open on arm64)
            continue
        for bit in PRIVILEGE_BITS:
            program.add_rule(refuse, name, seccomp.Arg(index, seccomp.MASKED_EQ, bit, bit))
    for name in UNINSPECTABLE:
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0:
            program.add_rule(absent, name)
    with tempfile.TemporaryFile() as out:
        program.export_bpf(out)
        out.seek(0)
        return out.read()


def descriptor() -> int | None:
    """A fresh descriptor holding the program, read from its start (bwrap reads it once and closes it);
    the caller passes it to the child and closes its own copy. None where there is no filter."""
    program = compiled()
    if program is None:
        return None
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
