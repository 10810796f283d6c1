"""The image store: podman and buildah on a containers-storage of the worker's own.

The store lives in a folder of its own (`images.store`, by default `<data_dir>/images`) rather
than in the host's `/var/lib/containers`, so the images of one data folder are found, kept and
removed with it and nothing else on the host changes them. Both tools read the same two files
written here: `storage.conf` (where the images are) and `containers.conf`, which makes podman
work where its defaults do not: runc (crun fails on a hybrid cgroup layout), cgroupfs (no
systemd session), no default ulimits (raising nofile needs CAP_SYS_RESOURCE), no network, and a
file events log. Every command runs with those files and nothing else of the caller's
environment that could redirect it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from temporal_rollouts.core.errors import ConfigError, SandboxError
from temporal_rollouts.core.images import ImageConfig

CONTAINERS_CONF = """\
# Written by temporal-rollouts for its image store; see sandbox/images/store.py.
[containers]
default_ulimits = []
netns = "none"

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
events_logfile_path = "{events}"
"""
STORAGE_CONF = """\
# Written by temporal-rollouts for its image store; see sandbox/images/store.py.
[storage]
driver = "overlay"
graphroot = "{graphroot}"
runroot = "{runroot}"
"""
TOOLS = ("podman", "buildah")
KEPT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "HOME")
QUERY_TIMEOUT_S = 120.0
LOCK_POLL_S = 0.2


@dataclass(frozen=True)
class Ran:
    returncode: int
    output: str


class ImageStore:
    """One containers-storage and the podman/buildah commands that work on it."""

    root: Path
    graphroot: Path
    """Where the images' layers are."""
    runroot: Path
    """containers-storage's run state (locks, mount counts): on a tmpfs where there is one."""
    conf_dir: Path
    """The two config files every command reads."""
    logs: Path
    """Build and bootstrap logs, kept for people."""
    locks: Path

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.graphroot = self.root / "storage"
        self.runroot = run_root_for(self.root)
        self.conf_dir = self.root / "conf"
        self.logs = self.root / "logs"
        self.locks = self.root / "locks"

    def prepare(self) -> None:
        """Create the folders and write the two config files (idempotent)."""
        for folder in (self.graphroot, self.runroot, self.conf_dir, self.logs, self.locks):
            folder.mkdir(parents=True, exist_ok=True)
        _write_if_changed(self.conf_dir / "containers.conf", CONTAINERS_CONF.format(events=self.runroot / "events.log"))
        _write_if_changed(
            self.conf_dir / "storage.conf", STORAGE_CONF.format(graphroot=self.graphroot, runroot=self.runroot)
        )

    def environment(self) -> dict[str, str]:
        """The whole environment of a podman or buildah command on this store."""
        env = {key: os.environ[key] for key in KEPT_ENVIRONMENT if key in os.environ}
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env["CONTAINERS_CONF"] = str(self.conf_dir / "containers.conf")
        env["CONTAINERS_STORAGE_CONF"] = str(self.conf_dir / "storage.conf")
        env["BUILDAH_ISOLATION"] = "oci"
        return env

    async def run(
        self,
        tool: str,
        *args: str,
        timeout_s: float = QUERY_TIMEOUT_S,
        log: Path | None = None,
        extra_env: dict[str, str] | None = None,
        grace_s: float = 0.0,
    ) -> Ran:
        """Run `tool args` on this store; its output (stdout and stderr) is returned, or appended to `log`
        and its tail returned. Past `timeout_s` (or when cancelled) it gets SIGTERM and `grace_s` to clean
        up (buildah then stops its RUN container and removes its working container), then its whole
        process group is killed, and TimeoutError raised."""
        if tool not in TOOLS:
            raise ValueError(f"not an image tool: {tool}")
        self.prepare()
        env = {**self.environment(), **(extra_env or {})}
        sink = log.open("ab") if log is not None else None
        try:
            process = await asyncio.create_subprocess_exec(
                tool,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink if sink is not None else asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=self.root,
                start_new_session=True,
            )
        except FileNotFoundError:
            if sink is not None:
                sink.close()
            raise ConfigError(
                f"{tool} is not installed: item images need podman and buildah (apt-get install podman buildah runc)"
            ) from None
        try:
            async with asyncio.timeout(timeout_s):
                out, _ = await process.communicate()
        except BaseException:
            await asyncio.shield(_stop(process, grace_s))
            raise
        finally:
            if sink is not None:
                sink.close()
        text = out.decode(errors="replace") if out is not None else tail(log) if log is not None else ""
        return Ran(process.returncode or 0, text)

    async def checked(self, tool: str, *args: str, timeout_s: float = QUERY_TIMEOUT_S) -> str:
        """Run a command that must succeed; its output."""
        ran = await self.run(tool, *args, timeout_s=timeout_s)
        if ran.returncode != 0:
            raise SandboxError(
                f"{tool} {' '.join(args[:2])} failed (status {ran.returncode}): {ran.output.strip()[-500:]}"
            )
        return ran.output

    async def exists(self, name: str) -> bool:
        return (await self.run("podman", "image", "exists", name)).returncode == 0

    async def inspect(self, name: str) -> tuple[str, ImageConfig]:
        """The image's id and the parts of its config a slot honours."""
        described = json.loads(await self.checked("podman", "image", "inspect", "--format", "json", name))[0]
        config = described.get("Config") or {}
        return described["Id"], ImageConfig(
            workdir=config.get("WorkingDir") or "/",
            env=list(config.get("Env") or []),
            user=config.get("User") or "",
        )

    async def layers(self, name: str) -> list[Path]:
        """The image's layer folders in this store, topmost first (what a slot's root stacks, `image_root`)."""
        described = json.loads(await self.checked("podman", "image", "inspect", "--format", "json", name))[0]
        data = (described.get("GraphDriver") or {}).get("Data") or {}
        if "UpperDir" not in data:
            raise SandboxError(f"image {name} is not in an overlay store: its layers cannot be stacked for a slot")
        lower = [Path(folder) for folder in (data.get("LowerDir") or "").split(":") if folder]
        return [Path(data["UpperDir"]), *lower]

    async def content_id(self, name: str) -> str | None:
        """A digest of what the image is (its layers' content digests and its config), the same in every
        store that holds it: an image's own id differs per import (it covers the import's time). None
        when the store lacks it."""
        if not await self.exists(name):
            return None
        described = json.loads(await self.checked("podman", "image", "inspect", "--format", "json", name))[0]
        config = described.get("Config") or {}
        content = {
            "layers": (described.get("RootFS") or {}).get("Layers") or [],
            "config": {key: config.get(key) for key in ("Env", "WorkingDir", "User", "Entrypoint", "Cmd")},
        }
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()

    async def import_tar(self, tar: Path, name: str, changes: Sequence[str] = ()) -> str:
        """Import a root filesystem tar as image `name` (with Dockerfile-style `changes`); its id."""
        args = [arg for change in changes for arg in ("--change", change)]
        out = await self.checked("podman", "import", "--quiet", *args, str(tar), name, timeout_s=600)
        return out.strip().splitlines()[-1].removeprefix("sha256:")

    async def load(self, archive: Path) -> list[str]:
        """Load a `podman save` archive (docker-archive or oci-archive) into the store; the names it brought."""
        out = await self.checked("podman", "load", "--input", str(archive), timeout_s=1800)
        return [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Loaded image")]

    async def listing(self) -> list[dict]:
        """Every image in the store: names, id, size and creation time, as podman lists them."""
        return json.loads(await self.checked("podman", "images", "--format", "json") or "[]")

    async def mount(self, name: str) -> Path:
        """Mount the image's root read-only where the host can see it (podman counts the mounts)."""
        return Path((await self.checked("podman", "image", "mount", name)).strip())

    async def unmount(self, name: str) -> None:
        await self.run("podman", "image", "unmount", name)

    def locked(self, key: str, wait_s: float) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the store's lock for `key` (every process on this host shares it): one build of a build
        context at a time, the others waiting to find it built. Waits at most `wait_s`."""
        self.prepare()
        return file_lock(self.locks / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock", wait_s)

    @contextlib.asynccontextmanager
    async def build_turn(self, turns: int) -> AsyncIterator[None]:
        """Hold one of `turns` build turns of this host (a lock file each beside the run state, shared by
        every process and store of the host), waiting as long as it takes: the caller's step heartbeats
        meanwhile, and its timeout bounds it."""
        self.prepare()
        folder = self.runroot.parent / "build-turns"
        folder.mkdir(parents=True, exist_ok=True)
        while True:
            for turn in range(turns):
                fd = os.open(folder / f"turn-{turn}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                try:
                    yield
                finally:
                    os.close(fd)
                return
            await asyncio.sleep(LOCK_POLL_S * 5)


@contextlib.asynccontextmanager
async def file_lock(path: Path, wait_s: float) -> AsyncIterator[None]:
    """An exclusive flock on `path` (created if missing), waited for at most `wait_s` without blocking
    the event loop; the process dying drops it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stayed locked for {wait_s:g}s") from None
                await asyncio.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def run_root_for(store: Path) -> Path:
    """containers-storage's run state (locks, mount counts) belongs on a tmpfs that a reboot empties:
    /run for root, $XDG_RUNTIME_DIR otherwise, else beside the store."""
    tag = hashlib.sha256(str(store).encode()).hexdigest()[:12]
    for base in ("/run" if os.geteuid() == 0 else None, os.environ.get("XDG_RUNTIME_DIR")):
        if base and os.access(base, os.W_OK):
            return Path(base) / "temporal-rollouts" / f"images-{tag}"
    return store / "run"


def tail(path: Path | None, chars: int = 3000) -> str:
    if path is None:
        return ""
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(file.tell() - chars, 0))
            return file.read().decode(errors="replace")
    except OSError:
        return ""


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


async def _stop(process: asyncio.subprocess.Process, grace_s: float) -> None:
    if grace_s > 0 and process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()
