"""The network a build's RUN steps get: the package mirrors, and nothing else.

A Dockerfile comes with the task data, so a build is treated like an agent: with the host's
network it could reach this host's services (Temporal, sandbox servers, the model server) or
anything the host can. With `images.build_network = "mirror"` each build runs in a network
namespace of its own that has only a loopback device, so the kernel routes nothing out of it.
Inside it, each allowed mirror (`images.mirror_hosts`, `host:port`) gets a loopback address of
its own, and a relay listening there (the listening socket is made inside the namespace, the
outgoing connection outside it) carries bytes to the real host: the build resolves the
mirror's name to that address (`--add-host`), TLS stays end to end, and any other name does
not resolve and any other address is unreachable. Making a namespace needs root; elsewhere
choose `none` (no network at all) or `host` (trusted Dockerfiles only).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from temporal_rollouts.core.errors import ConfigError

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
NETNS_PREFIX = "rollouts-build-"
"""Build namespaces are named `rollouts-build-<pid of the worker>-<random>`, so one a dead worker left is found."""
RELAY_CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 30.0


@dataclass
class BuildNetwork:
    """What buildah is told: `--network` and the `--add-host` entries."""

    network: str
    add_hosts: list[str] = field(default_factory=list)

    def buildah_args(self) -> list[str]:
        return [f"--network={self.network}", *(arg for host in self.add_hosts for arg in ("--add-host", host))]


@contextlib.asynccontextmanager
async def build_network(mode: str, mirror_hosts: Sequence[str]) -> AsyncIterator[BuildNetwork]:
    """The network of one build, for as long as it runs."""
    if mode == "host":
        yield BuildNetwork("host")
    elif mode == "none":
        yield BuildNetwork("none")
    elif mode == "mirror":
        async with _mirror_only(mirror_hosts) as network:
            yield network
    else:
        raise ConfigError(f"images.build_network: unknown mode {mode!r} (mirror, none or host)")


def parse_mirrors(mirror_hosts: Sequence[str]) -> dict[str, list[int]]:
    """`host:port` entries as {host: [ports]}, in order."""
    mirrors: dict[str, list[int]] = {}
    for entry in mirror_hosts:
        host, colon, port = entry.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"images.mirror_hosts: {entry!r} is not host:port")
        mirrors.setdefault(host.lower(), []).append(int(port))
    return mirrors


@contextlib.asynccontextmanager
async def _mirror_only(mirror_hosts: Sequence[str]) -> AsyncIterator[BuildNetwork]:
    if os.geteuid() != 0:
        raise ConfigError(
            'images.build_network = "mirror" makes a network namespace per build, which needs root; '
            'set it to "none" (no network) or "host" (trusted Dockerfiles only)'
        )
    await _remove_stale_namespaces()
    name = f"{NETNS_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    await _ip("netns", "add", name)
    servers: list[asyncio.Server] = []
    try:
        await _ip("-n", name, "link", "set", "lo", "up")
        add_hosts = []
        for index, (host, ports) in enumerate(parse_mirrors(mirror_hosts).items()):
            address = f"127.0.{(index + 2) // 256}.{(index + 2) % 256}"
            add_hosts.append(f"{host}:{address}")
            for port in ports:
                listener = await asyncio.to_thread(_listen_in, NETNS_DIR / name, address, port)
                servers.append(await asyncio.start_server(_relay_to(host, port), sock=listener))
        yield BuildNetwork(f"ns:{NETNS_DIR / name}", add_hosts)
    finally:
        for server in servers:
            server.close()
        await _ip("netns", "delete", name, check=False)


async def _remove_stale_namespaces() -> None:
    """Delete the build namespaces of workers that died mid-build (SIGKILL leaves them behind)."""
    for entry in NETNS_DIR.glob(f"{NETNS_PREFIX}*") if NETNS_DIR.is_dir() else []:
        pid = entry.name[len(NETNS_PREFIX) :].partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            log.info("removing build network %s of a worker that is gone", entry.name)
            await _ip("netns", "delete", entry.name, check=False)


def _listen_in(netns: Path, address: str, port: int) -> socket.socket:
    """A listening socket made inside `netns` (setns applies to the calling thread alone, so a thread
    of its own enters it and ends; the socket stays in the namespace it was made in)."""
    made: list[socket.socket] = []
    failure: list[BaseException] = []

    def enter_and_listen() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
            finally:
                os.close(fd)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(128)
            listener.setblocking(False)
            made.append(listener)
        except BaseException as err:  # noqa: BLE001  handed to the caller's thread
            failure.append(err)

    thread = threading.Thread(target=enter_and_listen, name="build-netns")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return made[0]


def _relay_to(host: str, port: int):
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as err:
            log.warning("build relay to %s:%d: %s", host, port, err)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    return relay


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(RELAY_CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


async def _ip(*args: str, check: bool = True) -> None:
    ran = await asyncio.to_thread(subprocess.run, ["ip", *args], capture_output=True, text=True, check=False)
    if check and ran.returncode != 0:
        raise ConfigError(
            f"ip {' '.join(args)} failed: {ran.stderr.strip()} (the mirror-only build network needs iproute2)"
        )
