"""Each slot's volume: the one place its files live, held to its disk and file limits.

A slot's folder `root/slot-N/` is the server's (its uid claim, its terminal's record, transfer
spools). Its volume `root/slot-N/volume/` holds the workspace (`volume/workspace`), and later, for
a slot on a task image, the overlay's `upper/` and `work/`: whatever a slot makes lands in one
place held to its limits, and the server's own files (journals, results, leases) are never there.

How a volume holds the limits, best first (`SlotVolumes.choose`; `/health` says which):

- `loop`: an ext4 filesystem of its own (`loop_fs`), sized to the disk limit, with the file limit as
  its inode count. A write past either fails in that slot alone, usage is one statfs (no walk), and a
  reset makes a new filesystem, in constant time whatever the agent made. Needs root and loop
  devices. A server run as a program mounts in a namespace of its own (`mount_namespace`), so a
  killed server leaves no mount behind; the image stays, and a restarted server mounts it again.
- `checked`: a folder on the data folder's filesystem. Bytes and files are counted by walking the
  workspace (`disk_watch`) after commands and every few seconds while the slot runs something,
  and the slot's processes are stopped once it is over. Between two checks a slot can write past
  its limit into the disk the other slots and the server share. Containers without CAP_SYS_ADMIN
  (Modal sandboxes, Nomad's docker driver) get this.

The whole lifecycle is here: `prepare` at start (a leased slot's volume comes back as it was, any
other is made afresh; a volume an earlier server left attached is taken over, never attached
twice), `reset` at release, `remake` when a lease narrows the limits of an empty volume, and
`release` at shutdown.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from temporal_rollouts.sandbox_server.volumes import loop_fs
from temporal_rollouts.sandbox_server.config import MIB, SlotLimits
from temporal_rollouts.sandbox_server.files.disk_usage import DiskUsage
from temporal_rollouts.sandbox_server.files.workspace import TRASH_PREFIX, prepare_workspace, remove_tree

log = logging.getLogger(__name__)

VolumeKind = Literal["loop", "checked"]
Leftover = Callable[[], None]
"""What a reset leaves to do in the background: tear the old filesystem down, or delete the old tree."""
VolumeChoice = Literal["auto", "loop", "checked"]
VOLUME_DIR = "volume"
IMAGE_FILE = "volume.img"
SPARE_PREFIX = "spare-volume-"
MAKING_PREFIX = "making-volume-"
WORKSPACE_DIR = "workspace"
LAYER_DIR = "layer"
"""A slot on an item image: its writable layer (`layer/upper`, `layer/work`) is the slot's files (`image_root`)."""


def slot_folder(root: Path, index: int) -> Path:
    """The server's folder of slot `index` under its root."""
    return root / f"slot-{index}"


@dataclass
class SlotVolume:
    """One slot's volume: where it is, and the limits it was made for (a loop volume's size)."""

    folder: Path
    kind: VolumeKind
    limits: SlotLimits
    layered: bool = False
    """The slot runs on an item image: what it changes is the image's writable layer in this volume."""

    @property
    def path(self) -> Path:
        return self.folder / VOLUME_DIR

    @property
    def layer(self) -> Path:
        return self.path / LAYER_DIR

    @property
    def tree(self) -> Path:
        """What the slot's files are, as walks count them: its writable layer on an image, else its workspace."""
        return self.layer / "upper" if self.layered else self.workspace

    def make_layer(self, owner: tuple[int, int] | None) -> tuple[Path, Path]:
        """The slot's writable layer on an image (`upper`, given to the slot's uid: the root of its `/`) and
        overlay's work folder beside it, made where missing; (upper, work)."""
        upper, work = self.layer / "upper", self.layer / "work"
        for folder in (self.layer, upper, work):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755)
        if owner is not None:
            os.lchown(upper, *owner)
        os.chmod(upper, 0o755)
        return upper, work

    @property
    def workspace(self) -> Path:
        return self.path / WORKSPACE_DIR

    @property
    def image(self) -> Path:
        return self.folder / IMAGE_FILE

    def files_limit(self, limits: SlotLimits | None = None) -> int:
        """The file limit in force under a lease's `limits` (the volume's own by default): for a filesystem of
        its own, no more than its inodes, which a small disk caps."""
        wanted = (limits or self.limits).max_files
        if not self.own_filesystem:
            return wanted
        inodes = _geometry(self.limits).inodes
        return min(wanted, inodes) if wanted else inodes

    @property
    def own_filesystem(self) -> bool:
        return self.kind == "loop" and bool(self.limits.disk_bytes)

    def prepare(self, owner: tuple[int, int] | None, keep: bool) -> Leftover | None:
        """At start: with `keep` (a live lease) the volume as it was, mounted again where it is not; else made
        afresh. Returns what is left to do with an old workspace (an older layout's, a checked one's)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        older = self._older_layout()
        if keep and (not self.own_filesystem or self.image.exists()):
            if self.own_filesystem and not loop_fs.mounted(self.path):
                loop_fs.mount(self.image, self.path)
            self.path.mkdir(exist_ok=True)
            prepare_workspace(self.workspace, owner)
            return None if older is None else functools.partial(remove_tree, older)
        leftover = self.reset(owner)
        if older is not None:
            self._discard(older)
        return leftover

    def reset(self, owner: tuple[int, int] | None, limits: SlotLimits | None = None) -> Leftover | None:
        """An empty workspace, in constant time: a new filesystem, or (checked) the old workspace moved aside.
        Returns what is left to do with the old one (tear it down, delete it), to run in the background."""
        if limits is not None:
            self.limits = limits
        if self.own_filesystem:
            old = loop_fs.detach(self.path)
            try:
                spare = self._spare(self.limits)
                if spare.exists():  # made ahead (`make_spare`): the hand-over waits for no mkfs
                    os.replace(spare, self.image)
                else:
                    loop_fs.make(self.image, _geometry(self.limits))
                loop_fs.mount(self.image, self.path, fresh=True)
                prepare_workspace(self.workspace, owner)
            except BaseException:
                old()
                raise
            return old
        if self.kind == "loop":  # a disk limit of 0 holds nothing to size a filesystem by
            self.release()
            self.image.unlink(missing_ok=True)
        self.path.mkdir(exist_ok=True)
        if os.path.lexists(self.layer):  # a slot on an image: its layer goes with its workspace
            self._move_aside(self.layer, self.path)
        trash = self._move_aside(self.workspace) if os.path.lexists(self.workspace) else None
        try:
            prepare_workspace(self.workspace, owner)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT) or trash is None:
                raise
            # The slot filled the disk (or its inodes) it shares: the fresh workspace can only be made once its
            # old tree is gone, so the tree is deleted now instead of after.
            remove_tree(trash)
            trash = None
            prepare_workspace(self.workspace, owner)
        return None if trash is None else functools.partial(remove_tree, trash)

    def remake(self, owner: tuple[int, int] | None, limits: SlotLimits) -> bool:
        """Make an empty loop volume again for narrower limits; False (nothing done) when the workspace holds
        anything or the volume has no filesystem of its own."""
        if not self.own_filesystem or not limits.disk_bytes:
            return False
        with os.scandir(self.tree) as entries:
            if next(entries, None) is not None:
                return False
        self.reset(owner, limits)
        return True

    def make_spare(self, limits: SlotLimits) -> None:
        """Make the next reset's filesystem ahead of it, for `limits` (the server's): in the background after a
        hand-over, one at a time per slot. Spares made for other limits, or left half-made, go."""
        if self.kind != "loop" or not limits.disk_bytes:
            return
        spare = self._spare(limits)
        for other in [*self.folder.glob(f"{SPARE_PREFIX}*"), *self.folder.glob(f"{MAKING_PREFIX}*")]:
            if other != spare:
                other.unlink(missing_ok=True)
        if spare.exists():
            return
        making = self.folder / f"{MAKING_PREFIX}{uuid.uuid4().hex}.img"
        try:
            loop_fs.make(making, _geometry(limits))
            os.replace(making, spare)  # whole or not at all: a reset never takes a half-made one
        finally:
            making.unlink(missing_ok=True)

    def _spare(self, limits: SlotLimits) -> Path:
        geometry = _geometry(limits)
        return self.folder / f"{SPARE_PREFIX}{geometry.image_bytes}-{geometry.inodes}.img"

    def measure(self) -> DiskUsage | None:
        """The usage of a volume that is a filesystem of its own (one statfs); None when it must be walked."""
        if not self.own_filesystem:
            return None
        if os.stat(self.path).st_dev == os.stat(self.folder).st_dev:  # never the host's disk for the slot's
            raise OSError(f"slot volume {self.path} is not mounted")
        stats = os.statvfs(self.path)
        return DiskUsage(
            bytes=(stats.f_blocks - stats.f_bfree) * stats.f_frsize,
            files=stats.f_files - stats.f_ffree,
            free_bytes=stats.f_bavail * stats.f_frsize,
            free_files=stats.f_favail,
        )

    def release(self) -> None:
        """At shutdown: unmount (the image stays for a restarted server)."""
        if self.kind == "loop":
            loop_fs.unmount(self.path)

    def leftover_trash(self) -> list[Path]:
        """Trees an earlier process moved aside and did not finish deleting."""
        found = []
        for parent in (self.folder, self.path):
            with contextlib.suppress(FileNotFoundError):
                found += [Path(e.path) for e in os.scandir(parent) if e.name.startswith(TRASH_PREFIX)]
        return found

    def _older_layout(self) -> Path | None:
        """A workspace of the layout before volumes (`slot-N/workspace`), moved aside to be deleted."""
        old = self.folder / WORKSPACE_DIR
        return self._move_aside(old, self.folder) if os.path.lexists(old) else None

    def _move_aside(self, tree: Path, parent: Path | None = None) -> Path:
        trash = (parent or tree.parent) / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        os.rename(tree, trash)
        return trash

    def _discard(self, tree: Path) -> None:
        try:
            remove_tree(tree)
        except OSError as err:
            log.warning("cannot delete %s: %s", tree, err)


@dataclass(frozen=True)
class SlotVolumes:
    """The kind of volume every slot of one server gets, and why not a better one."""

    kind: VolumeKind
    why_not_loop: str | None = None
    overcommitted: str | None = None
    """Why the slots' sparse filesystems together could fill the data folder's disk (None: they cannot)."""

    @classmethod
    def choose(cls, root: Path, limits: SlotLimits, slots: int, wanted: VolumeChoice = "auto") -> SlotVolumes:
        """The best kind this host allows (`wanted` forces one; `loop` where it cannot work raises)."""
        if wanted == "checked":
            return cls("checked", "sandbox.slot_volume is 'checked'")
        why = loop_fs.tools_missing() or _probe(root)
        if why is None:
            return cls("loop", overcommitted=_overcommitted(root, limits, slots))
        if wanted == "loop":
            raise OSError(f"sandbox.slot_volume is 'loop', but a loop filesystem cannot be mounted here: {why}")
        log.warning("slots' disk and file limits are checked, not held by a filesystem of their own: %s", why)
        return cls("checked", why)

    def not_held(self, limits: SlotLimits) -> dict[str, str]:
        """For /health: the disk and file limits a checked volume cannot hold, or that sparse filesystems
        promise more than the disk has."""
        if self.kind == "loop" and limits.disk_bytes:
            return {"disk": self.overcommitted} if self.overcommitted else {}
        why = f" ({self.why_not_loop})" if self.why_not_loop else ""
        found = {}
        if limits.disk_bytes:
            found["disk"] = f"no filesystem per slot{why}: a slot can write past its limit between two checks"
        if limits.max_files:
            found["files"] = f"no filesystem per slot{why}: a slot can make files past its limit between two checks"
        return found

    def describe(self, limits: SlotLimits) -> dict[str, str]:
        """For /health: how the disk and file limits are held, or why they cannot be."""
        if self.kind == "loop" and limits.disk_bytes:
            inodes = _geometry(limits).inodes
            own = "own filesystem per slot (ext4 on a loop device)"
            return {"disk": f"{own}; processes stopped at the limit", "files": f"{own}: {inodes} inodes"}
        checked = "checked (walked after commands and while the slot runs; processes stopped past it)"
        shared = "; between checks one slot can fill the disk every slot and the server share"
        why = f"; no filesystem per slot: {self.why_not_loop}" if self.why_not_loop else ""
        return {
            "disk": f"{checked}{shared}{why}" if limits.disk_bytes else "off",
            "files": f"{checked}{why}" if limits.max_files else "off",
        }


def _overcommitted(root: Path, limits: SlotLimits, slots: int) -> str | None:
    """Whether the slots' filesystems, each up to its disk limit, could together fill the disk they are on:
    their images are sparse, so none is refused, but full slots would leave the server's files no room."""
    stats = os.statvfs(root)
    free = stats.f_bavail * stats.f_frsize
    promised = slots * limits.disk_bytes
    if promised <= free:
        return None
    message = (
        f"the {slots} slots' filesystems (sparse) may hold {promised // MIB} MiB together, and the data folder's "
        f"disk has {free // MIB} MiB free: full slots could fill it (the server's journals then keep to memory)"
    )
    log.warning("%s", message)
    return message


def _geometry(limits: SlotLimits) -> loop_fs.Geometry:
    return loop_fs.Geometry.for_limits(limits.disk_bytes, limits.max_files)


def _probe(root: Path) -> str | None:
    """Whether a loop filesystem can be made and mounted under `root` (a small one, made and removed)."""
    root.mkdir(parents=True, exist_ok=True)
    probe = SlotVolume(root / ".volume-probe", "loop", SlotLimits(disk_limit_mb=16, max_files=1024))
    try:
        probe.folder.mkdir(exist_ok=True)
        probe.reset(None)
        probe.measure()
    except OSError as err:
        return str(err)
    finally:
        with contextlib.suppress(OSError):
            probe.release()
            remove_tree(probe.folder)
    return None
