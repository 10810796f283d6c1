"""The program a slot's resident launcher runs, inside the slot's sandbox (see `launcher`).

Standard library only: the server runs this file's text with the sandbox's own Python
(`python3 -I -S /dev/fd/N rollouts-slot-launcher slot=K FD`, the text from a sealed memory
file the server passes it), so nothing from the workspace, the environment or site-packages
is imported. It talks to the server over one SOCK_SEQPACKET socket whose fd number is its
last argument (the ones before it name it for `ps`), and runs one command at a time:

    server -> launcher   b"run" + argv (NUL-separated), with fds: output, script, started, go
    command -> server    b"p" on fd 5 (the kernel attaches the command's pid as the server sees it)
    server -> command    b"g" on the go pipe (fd 6), once the command sits in its cgroup part
    launcher -> server   b"exit <code>" (128 + n: killed by signal n), b"fail <why>" (not started)
                         or b"lost" (its status was lost: the server replaces the launcher)

The argv is the server's (`bubblewrap.bash_script`): bash reports, waits for the go byte and
closes fds 5 and 6 before it reads the command. The command starts with posix_spawn, which
copies nothing of the launcher's memory (a fork of it costs more than the bash it starts),
in a new session, with fd 0 from /dev/null, 1 and 2 the output, 3 the script, 4 the started
pipe, and nothing else of the launcher's open.

The launcher makes itself non-dumpable first, so a command (same uid, same sandbox) can
neither ptrace it nor read or write its memory or descriptors through /proc. It is the
sandbox's pid 1 (bwrap --as-pid-1), which the kernel shields from every signal it does not
handle, SIGKILL included, sent from inside; and it reaps whatever its commands leave to it.
When a command's bash ends, it kills everything else in the sandbox before it reports: one
command runs at a time, so whatever else runs there is what that command left behind.
"""

import _signal as signal  # the C modules: `signal` and `socket` build enums at import, which costs more
import _socket as socket  # than the rest of this launcher's start (it starts once per lease)
import fcntl
import os
import select
import sys

PR_SET_DUMPABLE = 4
MAX_FDS = 8
MESSAGE_BYTES = 1 << 16
"""Far more than the server's fixed argv (the command itself comes in a memfd); at 1 MiB, each receive
mapped, shrank and unmapped a buffer: three syscalls per command."""
HIGH_FD = 100
"""Received fds are moved to here first, clear of the numbers the command gets them at."""
IGNORED = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT)
"""Ignored by the launcher (Python ignores the first two itself); the command gets them back."""
exited = {}
"""The status of the command being waited for, when the SIGCHLD handler reaped it."""
waiting_for = [0]


def high(fd):
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    os.close(fd)
    return moved


def spawn(argv, fds, channel):
    """Start the command; SIGCHLD waits until it is the one waited for, so no status is reaped unseen."""
    out, script, started, go = fds
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)]
    for source, target in ((out, 1), (out, 2), (script, 3), (started, 4), (channel, 5), (go, 6)):
        actions.append((os.POSIX_SPAWN_DUP2, source, target))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        pid = os.posix_spawnp(
            argv[0], argv, os.environ, file_actions=actions, setsid=True, setsigdef=IGNORED, setsigmask=()
        )
        waiting_for[0] = pid
        return pid
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def reap(*_):
    """Reap every child that ended: the command, and what it left behind (orphans come to pid 1)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == waiting_for[0]:
            exited[pid] = status


def wait_for(pid, channel, wakeups):
    """The command's wait status (None if it was lost, which `spawn` rules out). While it runs the
    launcher also watches its socket: if the server went away, it exits, and its sandbox with it
    (nothing else would end it: the parent-death signal bwrap set did not survive the uid change)."""
    poller = select.poll()
    poller.register(channel, 0)  # POLLHUP alone: the server closed its end
    poller.register(wakeups, select.POLLIN)  # a byte per signal (set_wakeup_fd): a child ended
    try:
        while True:
            try:
                died, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # the handler reaped it
                return exited.pop(pid, None)
            if died == pid:
                return status
            for fd, events in poller.poll():
                if fd == wakeups:
                    while True:
                        try:
                            os.read(wakeups, 64)
                        except BlockingIOError:
                            break
                elif events & (select.POLLHUP | select.POLLERR):
                    raise SystemExit("the server went away")
    finally:
        waiting_for[0] = 0
        exited.clear()


def serve(channel, wakeups):
    while True:
        message, ancillary, _, _ = channel.recvmsg(
            MESSAGE_BYTES, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
        )
        fds = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += [high(fd) for fd in memoryview(data[: len(data) - len(data) % 4]).cast("i")]
        if not message:
            return  # the server closed its end
        if not message.startswith(b"run") or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            channel.send(b"fail malformed request")
            continue
        argv = [part.decode("utf-8", "surrogateescape") for part in message[3:].split(b"\0")]
        try:
            pid = spawn(argv, fds, channel.fileno())
        except OSError as err:
            channel.send(f"fail cannot start bash: {err}".encode())
            continue
        finally:
            for fd in fds:
                os.close(fd)
        status = wait_for(pid, channel.fileno(), wakeups)
        end_leftovers()
        channel.send(b"lost" if status is None else b"exit %d" % exit_code(status))


def end_leftovers():
    """Kill and reap whatever the command left running: every process in the sandbox but this one,
    its pid 1 (kill(-1) signals none outside the pid namespace). A process killed while it forks
    cannot outrun the SIGKILL already pending on it."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def exit_code(status):
    """As bwrap reports its command's: a signal's death is 128 + its number, as in a shell."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def prctl(option, value):
    """prctl(2) through _ctypes, which loads in a fraction of the time `import ctypes` takes."""
    try:
        import _ctypes

        function = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")
        return _ctypes.call_function(function, (option, value, 0, 0, 0))
    except (ImportError, AttributeError):  # a Python without those internals
        import ctypes

        return ctypes.CDLL(None).prctl(option, value, 0, 0, 0)


def main():
    channel = socket.socket(fileno=high(int(sys.argv[-1])))
    os.closerange(3, HIGH_FD)  # the program's memory file, and anything else the server's side left open
    if prctl(PR_SET_DUMPABLE, 0) != 0:
        sys.exit("cannot make the launcher non-dumpable")
    for number in IGNORED:
        signal.signal(number, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, reap)
    wakeups, wake = os.pipe()
    os.set_blocking(wakeups, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    channel.send(b"ready")
    serve(channel, wakeups)


if __name__ == "__main__":
    main()
