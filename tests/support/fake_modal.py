"""A fake of the part of the `modal` client the Modal backend uses: no Modal account here.

`FakeModal` stands where the backend expects the `modal` module: `App.lookup`,
`Image.from_registry(...).apt_install(...).pip_install(...).add_local_dir(...)`,
`Image.from_dockerfile`, `Image.build`, `Image.from_id`,
`Secret.from_name`, `Secret.from_dict`, `Sandbox.create`, `Sandbox.from_name`,
`Sandbox.list`, and on a sandbox `get_tags`, `tunnels`, `poll`, `terminate`,
`object_id`, each with `.aio` where modal has it. Every call is first bound to
the installed modal's own signature (`inspect.signature(...).bind`), so a keyword
an upgrade renames or drops fails here, and every call is recorded in `calls`.

What it does like Modal: a sandbox runs its command as a real local process with
the secrets' and `env`'s variables; `name` is unique among running sandboxes of an
app (`modal.exception.AlreadyExistsError`, the real type); `from_name` raises the
real `NotFoundError` for none running; `list(tags=...)` returns running sandboxes
that carry at least those tags; a sandbox ends when its process exits or after
its `timeout` (its lifetime); the image is honoured in one way: only folders added
with `add_local_dir` are importable (mapped to local paths), so the server must
run from its package alone. `build` gives an image an id (`im-N`) that `from_id`
finds again; a Dockerfile image whose file contains `FAKE-MODAL-BUILD-FAILS` fails
its build with the real `ImageBuildError`, as a failing step does in Modal.

What it does not: containers and images (the process runs on this host with this
Python for `python`; a Dockerfile is read, never run), `idle_timeout` (recorded, not enforced), gpu/cpu/memory
limits, network policy, tunnels over TLS (the tunnel URL is plain
http://127.0.0.1:<port>, where Modal's is https://<host>), `exec`, snapshots,
environments, and Modal's gRPC control plane (the backend's calls are faked at the
client's Python surface, not on the wire).
"""

from __future__ import annotations

import inspect
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import modal
import modal.exception


def _check(real: Any, args: tuple[Any, ...], kwargs: dict[str, Any], bound_self: bool = False) -> None:
    """Bind the call to the installed modal's signature; raises TypeError on a bad keyword."""
    signature = inspect.signature(real)
    if bound_self:
        signature.bind(None, *args, **kwargs)
    else:
        signature.bind(*args, **kwargs)


class _Method:
    """A fake modal function: callable, with `.aio`, checked against `real` before it runs."""

    def __init__(self, fake: FakeModal, name: str, real: Any, impl: Any, bound_self: bool = False) -> None:
        self.fake, self.name, self.real, self.impl, self.bound_self = fake, name, real, impl, bound_self

    def _record(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _check(self.real, args, kwargs, self.bound_self)
        self.fake.calls.append((self.name, args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._record(args, kwargs)
        return self.impl(*args, **kwargs)

    def aio(self, *args: Any, **kwargs: Any) -> Any:
        """Like modal's `.aio`: a coroutine that does the work (and raises) when awaited, or an async
        generator for the listing calls; a bad keyword fails at the call, as Python's binding does."""
        self._record(args, kwargs)
        if inspect.isasyncgenfunction(self.impl):
            return self.impl(*args, **kwargs)

        async def answer() -> Any:
            return self.impl(*args, **kwargs)

        return answer()


@dataclass
class FakeTunnel:
    url: str


@dataclass
class FakeApp:
    name: str
    app_id: str


@dataclass
class FakeImage:
    fake: FakeModal
    tag: str
    local_dirs: dict[str, Path] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    dockerfile: Path | None = None
    object_id: str | None = None

    def __post_init__(self) -> None:
        cls = modal.Image
        self.build = _Method(self.fake, "Image.build", cls.build, self._build, bound_self=True)
        self.apt_install = _Method(self.fake, "Image.apt_install", cls.apt_install, self._step("apt"), bound_self=True)
        self.pip_install = _Method(self.fake, "Image.pip_install", cls.pip_install, self._step("pip"), bound_self=True)
        self.add_local_dir = _Method(
            self.fake, "Image.add_local_dir", cls.add_local_dir, self._add_dir, bound_self=True
        )

    def _step(self, kind: str) -> Any:
        def add(*packages: str, **_: Any) -> FakeImage:
            self.steps.append(f"{kind} {' '.join(packages)}")
            return self

        return add

    def _add_dir(self, local_path: Any, remote_path: str, **_: Any) -> FakeImage:
        self.local_dirs[remote_path] = Path(local_path)
        return self

    def _build(self, app: Any = None) -> FakeImage:
        if self.dockerfile is not None and "FAKE-MODAL-BUILD-FAILS" in self.dockerfile.read_text():
            image_id = f"im-{next(self.fake._ids)}"
            raise modal.exception.ImageBuildError(
                f"Image build for {image_id} failed. See build logs for more details.", image_id
            )
        if self.object_id is None:  # Modal gives an identical definition the id it built before
            definition = (self.tag, tuple(self.steps), tuple(sorted(self.local_dirs.items())))
            self.object_id = self.fake.built_definitions.setdefault(definition, f"im-{next(self.fake._ids)}")
            self.fake.images.setdefault(self.object_id, self)
        return self.fake.images[self.object_id]


@dataclass
class FakeSecret:
    values: dict[str, str]


class FakeSandbox:
    def __init__(
        self,
        fake: FakeModal,
        object_id: str,
        app: FakeApp,
        name: str | None,
        tags: dict[str, str],
        process: subprocess.Popen[bytes],
        port_map: dict[int, int],
        timeout: int | None,
    ) -> None:
        self.fake, self.object_id, self.app, self.name, self.tags = fake, object_id, app, name, dict(tags)
        self.process, self.port_map = process, port_map
        self.ends_at = time.monotonic() + timeout if timeout else None
        self.listed_after_exit = False
        """Stay listed and found by name after the server exited (until terminated), as a sandbox does for a
        moment until Modal marks it finished; `poll` still gives its exit code."""
        self.terminated = False
        real = modal.Sandbox
        self.get_tags = _Method(fake, "Sandbox.get_tags", real.get_tags, lambda: dict(self.tags), bound_self=True)
        self.tunnels = _Method(fake, "Sandbox.tunnels", real.tunnels, self._tunnels, bound_self=True)
        self.poll = _Method(fake, "Sandbox.poll", real.poll, self.returncode, bound_self=True)
        self.terminate = _Method(fake, "Sandbox.terminate", real.terminate, self._terminate, bound_self=True)

    def returncode(self) -> int | None:
        return self.process.poll()

    @property
    def running(self) -> bool:
        return self.process.poll() is None or (self.listed_after_exit and not self.terminated)

    def _tunnels(self, timeout: int = 50) -> dict[int, FakeTunnel]:
        if self.fake.tunnel_error is not None:
            raise self.fake.tunnel_error  # e.g. SandboxTimeoutError: the tunnel is not open yet
        return {inner: FakeTunnel(f"http://127.0.0.1:{outer}") for inner, outer in self.port_map.items()}

    def _terminate(self, *, wait: bool = False) -> int | None:
        self.terminated = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode if wait else None


class _Namespace:
    pass


class FakeModal:
    exception = modal.exception

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.tunnel_error: Exception | None = None
        self.sandboxes: list[FakeSandbox] = []
        self.apps: dict[str, FakeApp] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.App = _Namespace()
        self.App.lookup = _Method(self, "App.lookup", modal.App.lookup, self._lookup)
        self.Image = _Namespace()
        self.Image.from_registry = _Method(
            self, "Image.from_registry", modal.Image.from_registry, lambda tag, **_: FakeImage(self, tag)
        )
        self.Image.from_dockerfile = _Method(
            self,
            "Image.from_dockerfile",
            modal.Image.from_dockerfile,
            lambda path, **_: FakeImage(self, f"dockerfile:{path}", dockerfile=Path(path)),
        )
        self.Image.from_id = _Method(self, "Image.from_id", modal.Image.from_id, self._image_by_id, bound_self=True)
        self.images: dict[str, FakeImage] = {}
        self.built_definitions: dict[tuple, str] = {}
        self.Secret = _Namespace()
        self.Secret.from_dict = _Method(
            self, "Secret.from_dict", modal.Secret.from_dict, lambda d={}: FakeSecret(dict(d))
        )
        self.Secret.from_name = _Method(self, "Secret.from_name", modal.Secret.from_name, self._named_secret)
        self.named_secrets: dict[str, dict[str, str]] = {}
        self.Sandbox = _Namespace()
        self.Sandbox.create = _Method(self, "Sandbox.create", modal.Sandbox.create, self._create)
        self.Sandbox.from_name = _Method(self, "Sandbox.from_name", modal.Sandbox.from_name, self._from_name)
        self.Sandbox.list = _Method(self, "Sandbox.list", modal.Sandbox.list, self._list)

    # Test controls
    def running(self) -> list[FakeSandbox]:
        self._end_expired()
        return [sandbox for sandbox in self.sandboxes if sandbox.running]

    def by_name(self, name: str) -> FakeSandbox:
        return next(sandbox for sandbox in self.running() if sandbox.name == name)

    def close(self) -> None:
        for sandbox in self.sandboxes:
            sandbox._terminate()

    def call_names(self) -> list[str]:
        return [name for name, _, _ in self.calls]

    # Modal behaviour
    def _lookup(self, name: str, *, create_if_missing: bool = False, **_: Any) -> FakeApp:
        if name not in self.apps:
            if not create_if_missing:
                raise modal.exception.NotFoundError(f"App '{name}' not found")
            self.apps[name] = FakeApp(name, f"ap-{next(self._ids)}")
        return self.apps[name]

    def _image_by_id(self, image_id: str, **_: Any) -> FakeImage:
        if image_id not in self.images:
            raise modal.exception.NotFoundError(f"Image '{image_id}' not found")
        return self.images[image_id]

    def _named_secret(self, name: str, **_: Any) -> FakeSecret:
        if name not in self.named_secrets:
            raise modal.exception.NotFoundError(f"Secret '{name}' not found")
        return FakeSecret(self.named_secrets[name])

    def _create(
        self,
        *args: str,
        app: FakeApp | None = None,
        name: str | None = None,
        tags: dict[str, str] | None = None,
        image: FakeImage | None = None,
        env: dict[str, str] | None = None,
        secrets: list[FakeSecret] | None = None,
        timeout: int | None = 300,
        workdir: str | None = None,
        encrypted_ports: list[int] = (),
        **_: Any,
    ) -> FakeSandbox:
        if app is None:
            raise modal.exception.InvalidError("App is required")
        with self._lock:
            if name is not None and any(s.name == name and s.app is app for s in self.running()):
                raise modal.exception.AlreadyExistsError(f"Sandbox with name '{name}' already exists")
            object_id = f"sb-{next(self._ids)}"
            root = self.data_dir / object_id
            root.mkdir(parents=True)
            port_map = {port: _free_port() for port in encrypted_ports}
            process = self._run(list(args), root, image, env or {}, secrets or [], workdir, port_map)
            sandbox = FakeSandbox(self, object_id, app, name, tags or {}, process, port_map, timeout)
            self.sandboxes.append(sandbox)
            return sandbox

    def _run(
        self,
        argv: list[str],
        root: Path,
        image: FakeImage | None,
        env: dict[str, str],
        secrets: list[FakeSecret],
        workdir: str | None,
        port_map: dict[int, int],
    ) -> subprocess.Popen[bytes]:
        remote_to_local: dict[str, str] = {}
        if image is not None:
            for remote, local in image.local_dirs.items():
                target = root / "image" / remote.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(local.resolve(), target_is_directory=True)
            remote_to_local["/opt"] = str(root / "image" / "opt")
        if workdir:
            remote_to_local[workdir] = str(root / "workdir")
            (root / "workdir").mkdir()

        def localise(value: str) -> str:
            for remote, local in remote_to_local.items():
                if value == remote or value.startswith(remote + "/"):
                    return local + value[len(remote) :]
            return value

        argv = [sys.executable if argv[0] == "python" else argv[0], *map(localise, argv[1:])]
        for index, value in enumerate(argv[:-1]):
            if value == "--host":
                argv[index + 1] = "127.0.0.1"
            if value == "--port" and int(argv[index + 1]) in port_map:
                argv[index + 1] = str(port_map[int(argv[index + 1])])
        process_env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
        for secret in secrets:
            process_env.update(secret.values)
        process_env.update({key: localise(value) for key, value in env.items()})
        with open(root / "sandbox.log", "ab") as log:
            return subprocess.Popen(
                argv,
                cwd=localise(workdir) if workdir else root,
                env=process_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _from_name(self, app_name: str, name: str, **_: Any) -> FakeSandbox:
        for sandbox in self.running():
            if sandbox.app.name == app_name and sandbox.name == name:
                return sandbox
        raise modal.exception.NotFoundError(f"Sandbox with name '{name}' not found")

    async def _list(self, *, app_id: str | None = None, tags: dict[str, str] | None = None, **_: Any) -> Any:
        for sandbox in self.running():
            if (app_id is None or sandbox.app.app_id == app_id) and (tags or {}).items() <= sandbox.tags.items():
                yield sandbox

    def _end_expired(self) -> None:
        now = time.monotonic()
        for sandbox in self.sandboxes:
            if sandbox.running and sandbox.ends_at is not None and now > sandbox.ends_at:
                sandbox._terminate()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
