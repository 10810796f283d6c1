"""A slot's root on an item image: the image's layers below, the slot's own writable layer above.

A server started with an image (`--image-layer`, given by the local backend from the host's
image store) runs every slot on it. The image's layers are folders the store keeps, one per
Dockerfile step, shared by every slot and never written. For a slot, each layer is bind-mounted
read-only, nosuid and nodev, and idmapped: a file the image's root owns belongs to the slot's
uid in that mount. A kernel overlay stacks them under the slot's writable layer (`upper`,
`work`), which lives on the slot's volume, so what the agent changes anywhere in its root lands
there, held to the slot's disk and file limits, and a reset throws it away with the volume.

Inside the slot the agent is root of a user namespace of its own whose only id is the slot's uid
(`isolation`): the image is its own, as in a container, so it can install packages, edit /etc and
run what the image expects to run as root, and on the host it is still the slot's unprivileged
uid. Files the image gives to other users (a service account) belong to nobody in the slot: the
agent reads them as the image's permissions allow and cannot take them over, nor become another
user. No setuid bit and no device node of an image works in a slot (nosuid, nodev, a fresh /dev).

The idmapped mounts use the kernel's new mount API (open_tree, mount_setattr with
MOUNT_ATTR_IDMAP, move_mount: Linux 5.12+, overlay over idmapped layers 5.19+) through ctypes, as
the standard library has no binding for it; the user namespace that carries the id map is one a
short-lived child makes, kept by descriptor per uid. It all needs a root server; the mounts live
in the server's own mount namespace (`mount_namespace`) and go with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from temporal_rollouts.sandbox_server.files.beneath import folder_beneath, open_root
from temporal_rollouts.sandbox_server.config import ContainerConfig

log = logging.getLogger(__name__)

LAYERS_DIR = "image-layers"
RUN_ROOTS = Path("/run/temporal-rollouts/slot-roots")
"""Where slots' roots are mounted (one folder per slot, named by a digest of the slot's folder)."""
HOME = "/root"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_MOUNT_OPTIONS = 4000
"""A mount's options fit in one page: the overlay's list of layer folders must too."""
IMAGE_PYTHON = "/usr/bin/python3"
"""The Python the slot's resident launcher runs on, where the image has one."""

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every architecture
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_OPEN_TREE_CLONE = 0x1
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_IDMAP = 0x1, 0x2, 0x4, 0x00100000
_MNT_DETACH = 2


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class ImageRoot:
    """The image every slot of a server runs on: its layer folders (topmost first) and how to run in it."""

    layers: tuple[Path, ...]
    workdir: str = "/"
    env: tuple[str, ...] = ()
    name: str = ""

    @classmethod
    def from_config(cls, config: ContainerConfig) -> ImageRoot | None:
        """The image a `ContainerConfig` names (`image_layers`), or None for the server's own root."""
        if not config.image_layers:
            return None
        return cls(tuple(config.image_layers), config.image_workdir, tuple(config.image_env), config.image_name or "")

    def environment(self) -> dict[str, str]:
        """A command's environment in the slot: the image's ENV over root's HOME, a UTF-8 locale and a dumb
        terminal, with a PATH where the image gives none."""
        environment = {"HOME": HOME, "LANG": "C.UTF-8", "TERM": "dumb", "PATH": DEFAULT_PATH}
        for entry in self.env:
            name, equals, value = entry.partition("=")
            if equals and name:
                environment[name] = value
        return environment

    def problem(self) -> str | None:
        """Why slots cannot run on this image here, or None: a root server and layers that exist. A kernel
        that cannot mount idmapped overlays is found when a slot's root is mounted: that slot is quarantined
        with the kernel's error."""
        if os.geteuid() != 0:
            return "slots on an item image need a sandbox server run as root (to mount the image's layers)"
        missing = [str(layer) for layer in self.layers if not layer.is_dir()]
        if not self.layers or missing:
            return f"the image's layer folders are missing: {missing or 'none given'}"
        return None


@dataclass
class SlotRoot:
    """One slot's root on the image: its idmapped layers and the overlay over them (`path`)."""

    image: ImageRoot
    folder: Path
    """The server's folder of the slot: the mount points live here, never in the slot's volume."""
    _mapped_for: int | None = field(default=None, repr=False)
    _mounted_with: tuple[Path, Path, int] | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        """Where the slot's root is mounted: what its commands see as `/`, and its file tools' root. Not under
        the server's folder, whose parents the slot's uid may not search (bwrap runs as that uid and opens
        it by path), but in a folder of /run every uid may pass through (the mount is in the server's own
        mount namespace, seen by nobody else)."""
        tag = hashlib.sha256(str(self.folder.resolve()).encode()).hexdigest()[:16]
        return RUN_ROOTS / tag

    @property
    def mounted(self) -> bool:
        return os.path.ismount(self.path)  # an overlay has a device of its own

    def mount(self, upper: Path, work: Path, uid: int) -> None:
        """Mount the slot's root: the image's layers, idmapped for `uid`, under `upper` (the slot's own layer,
        on its volume, owned by `uid`) with overlay's `work` folder beside it."""
        self.unmount()
        if self._mapped_for != uid:
            self._map_layers(uid)
        RUN_ROOTS.mkdir(parents=True, exist_ok=True)
        for folder in (RUN_ROOTS.parent, RUN_ROOTS):
            os.chmod(folder, 0o711)  # every uid may pass through, none may list
        self.path.mkdir(mode=0o755, exist_ok=True)
        lower = ":".join(str(self._layer_mount(index)) for index in range(len(self.image.layers)))
        options = f"lowerdir={lower},upperdir={upper},workdir={work}"
        if len(options) >= MAX_MOUNT_OPTIONS:
            raise OSError(
                errno.E2BIG, f"image {self.image.name} has too many layers ({len(self.image.layers)}) to stack"
            )
        _mount_overlay(options, self.path)
        self._mounted_with = (upper, work, uid)
        self._make_workdir(uid)

    @contextlib.contextmanager
    def remounted(self) -> Iterator[None]:
        """Unmount the slot's root while its layer is rewritten from outside (a snapshot restored, a copy from
        another slot), then mount it again over the new layer: overlay must not see its layer change under it."""
        again = self._mounted_with
        self.unmount()
        try:
            yield
        finally:
            if again is not None:
                self.mount(*again)

    @property
    def pristine_path(self) -> Path:
        """Where `mount_pristine` mounts the image as built, beside the slot's root."""
        return self.path.with_name(self.path.name + "-pristine")

    def mount_pristine(self, scratch: Path) -> Path | None:
        """The image as it was built, for one verifier command: the slot's idmapped layers under a fresh writable
        layer in `scratch` (a folder on the slot's volume, so what the command writes is held to the slot's
        limits), with the slot's WORKDIR, as the agent left it, bound over the image's. What the agent changed
        anywhere else (PATH, interpreters, site-packages, /etc) is not there. The slot's root must be mounted.
        None when the image's WORKDIR is `/`: the agent's whole root would be carried, so nothing is pristine.
        A WORKDIR the agent removed or replaced by a link is carried as an empty folder."""
        if self._mounted_with is None:
            raise OSError(errno.ENOENT, "the slot's root is not mounted")
        parts = [part for part in self.image.workdir.split("/") if part]
        if not parts:
            return None
        uid = self._mounted_with[2]
        upper, work, empty = scratch / "upper", scratch / "work", scratch / "empty"
        for folder in (upper, work, empty):
            folder.mkdir(parents=True)
            os.chown(folder, uid, uid)
        self.unmount_pristine()
        self.pristine_path.mkdir(mode=0o755, exist_ok=True)
        lower = ":".join(str(self._layer_mount(index)) for index in range(len(self.image.layers)))
        _mount_overlay(f"lowerdir={lower},upperdir={upper},workdir={work}", self.pristine_path)
        try:
            _carry_folder(self.path, self.pristine_path, parts, empty, uid)
        except BaseException:
            self.unmount_pristine()
            raise
        return self.pristine_path

    def unmount_pristine(self) -> None:
        """Unmount `mount_pristine`'s root and the WORKDIR carried into it (a detach takes both)."""
        if os.path.ismount(self.pristine_path):
            _umount(self.pristine_path)

    @property
    def exposed_path(self) -> Path:
        return self.path.with_name(self.path.name + "-exposed")

    def expose(self, folders: dict[str, Path]) -> dict[str, Path]:
        """The server's `folders` bound where the slot's uid can reach them by path, beside its root (bwrap,
        run as that uid on an image, opens every bind source by path; the server's folders are not
        searchable to it). Each is bound by descriptor; the result maps the names to their new places."""
        self.unexpose()
        base = self.exposed_path
        base.mkdir(mode=0o711, exist_ok=True)
        placed = {}
        for name, folder in folders.items():
            target = base / name
            target.mkdir(mode=0o755, exist_ok=True)
            source, into = open_root(folder), open_root(target)
            try:
                _bind_by_descriptor(source, into)
            finally:
                os.close(source)
                os.close(into)
            placed[name] = target
        return placed

    def unexpose(self) -> None:
        if self.exposed_path.is_dir():
            for child in self.exposed_path.iterdir():
                if os.path.ismount(child):
                    _umount(child)

    def _make_workdir(self, uid: int) -> None:
        """The image's WORKDIR, made (as the slot's, so root's inside) where the image lacks it, as a container
        runtime makes it; never through a link: one on the way is left for the sandbox to follow in its own view."""
        top = open_root(self.path)
        try:
            os.close(folder_beneath(top, [part for part in self.image.workdir.split("/") if part], owner=(uid, uid)))
        except OSError as err:
            log.info("the image's WORKDIR %s is not made by the server: %s", self.image.workdir, err)
        finally:
            os.close(top)

    def unmount(self) -> None:
        """Unmount the slot's root (its processes must be gone), and a verifier's mounts beside it if a crash
        left them; the idmapped layers stay for the next one."""
        self.unmount_pristine()
        self.unexpose()
        if self.mounted:
            _umount(self.path)

    def release(self) -> None:
        """At shutdown: unmount the root and the layers."""
        self.unmount()
        self._unmap_layers()
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def _layer_mount(self, index: int) -> Path:
        return self.folder / LAYERS_DIR / str(index)

    def _map_layers(self, uid: int) -> None:
        self._unmap_layers()
        userns = user_namespace(uid)
        try:
            for index, layer in enumerate(self.image.layers):
                target = self._layer_mount(index)
                target.mkdir(parents=True, exist_ok=True)
                mount_idmapped(layer, target, userns)
        finally:
            os.close(userns)
        self._mapped_for = uid

    def _unmap_layers(self) -> None:
        """Unmount every layer's bind (tried on each folder: a bind of a folder on the same filesystem has
        the same device, so `ismount` cannot tell it; unmounting a folder that is none does nothing)."""
        folder = self.folder / LAYERS_DIR
        if folder.is_dir():
            for target in sorted(folder.iterdir(), reverse=True):
                _umount(target)
        self._mapped_for = None


def user_namespace(uid: int) -> int:
    """A descriptor of a new user namespace whose only id is `uid`, root inside (0 -> uid, for gids too)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise OSError(errno.ENOENT, "unshare (util-linux) is missing: it makes the user namespace of an id map")
    child = subprocess.Popen([unshare, "--user", "cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        _wait_for_new_namespace(child.pid)
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{child.pid}/{name}").write_text(f"0 {uid} 1")
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def _wait_for_new_namespace(pid: int) -> None:
    mine = os.readlink("/proc/self/ns/user")
    for _ in range(100_000):
        try:
            if os.readlink(f"/proc/{pid}/ns/user") != mine:
                return
        except FileNotFoundError:
            break
        os.sched_yield()
    raise OSError(errno.ECHILD, "the child that makes a user namespace did not make one")


def _carry_folder(source_root: Path, target_root: Path, parts: list[str], empty: Path, uid: int) -> None:
    """Bind the folder `parts` of `source_root` (the agent's root) at the same place in `target_root`, each
    opened by descriptor and never through a link (an agent may have made its WORKDIR one, pointing anywhere
    on the host as the server would resolve it); where it is no folder, `empty` is bound instead."""
    source_top = open_root(source_root)
    try:
        try:
            source = folder_beneath(source_top, parts, create=False)
        except OSError:
            source = open_root(empty)
    finally:
        os.close(source_top)
    try:
        target_top = open_root(target_root)
        try:
            target = folder_beneath(target_top, parts, owner=(uid, uid))
        finally:
            os.close(target_top)
        try:
            _bind_by_descriptor(source, target)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _bind_by_descriptor(source_fd: int, target_fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    tree = libc.syscall(_SYS_OPEN_TREE, source_fd, b"", _AT_EMPTY_PATH | _OPEN_TREE_CLONE | os.O_CLOEXEC)
    if tree < 0:
        raise OSError(ctypes.get_errno(), "open_tree of the slot's WORKDIR")
    try:
        flags = _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH
        if libc.syscall(_SYS_MOVE_MOUNT, tree, b"", target_fd, b"", flags) != 0:
            raise OSError(ctypes.get_errno(), "move_mount of the slot's WORKDIR into its pristine root")
    finally:
        os.close(tree)


def mount_idmapped(source: Path, target: Path, userns_fd: int) -> None:
    """Bind `source` at `target`, read-only, nosuid and nodev, its ids shifted by `userns_fd`'s map."""
    libc = ctypes.CDLL(None, use_errno=True)
    tree = libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE | os.O_CLOEXEC)
    if tree < 0:
        raise OSError(ctypes.get_errno(), f"open_tree {source}")
    try:
        flags = _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
        attr = _MountAttr(flags, 0, 0, userns_fd)
        if libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
            raise OSError(ctypes.get_errno(), f"cannot idmap {source} (mount_setattr)")
        if libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH) != 0:
            raise OSError(ctypes.get_errno(), f"move_mount {source} -> {target}")
    finally:
        os.close(tree)


def _mount_overlay(options: str, target: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV
    if libc.mount(b"overlay", os.fsencode(target), b"overlay", flags, options.encode()) != 0:
        raise OSError(ctypes.get_errno(), f"cannot mount the slot's root at {target} ({options})")


def _umount(target: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(target), _MNT_DETACH) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
        raise OSError(ctypes.get_errno(), f"cannot unmount {target}")
