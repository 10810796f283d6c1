"""One verifier command (`ExecOp.verifier`): a task's tests run after the agent is done, with folders of
their own, the reward read back by the server.

The agent must not be able to write its own score, so:
- the tests are a cache entry bound read-only (`tests_at`): nothing the command runs can change them, and
  the agent never saw them (they enter the slot with this command alone);
- the output folder (`output_at`) is a fresh empty folder of the server's, bound writable: nothing the
  agent left at that path inside the slot is there;
- the server reads the collected files itself, by descriptor, regular files only and never through a
  link, after the command's whole process tree is gone: a verdict is never parsed out of output that the
  code under test can print too;
- `pristine` on an item image: the command runs on the image as built, under a layer of its own, with
  only the agent's WORKDIR carried over (`SlotRoot.mount_pristine`). On the server's own root every
  system folder is read-only to a slot already, so the root is pristine as it is.
Everything this command writes goes to a scratch folder on the slot's volume, so the slot's limits hold
for it, and the folder is removed when it ends.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
import uuid
from pathlib import Path

from temporal_rollouts.sandbox_server.calls.operations import SlotContext, settle_after_command
from temporal_rollouts.sandbox_server.errors import BadToolRequest
from temporal_rollouts.sandbox_server.files.beneath import folder_beneath, open_root
from temporal_rollouts.sandbox_server.isolation.bubblewrap import isolation_mode, run_command
from temporal_rollouts.sandbox_server.schema import (
    MAX_COLLECTED_BYTES,
    CollectedFile,
    ExecOp,
    ToolOutput,
    VerifierMounts,
)

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


async def run_verifier(call_id: str, op: ExecOp, mounts: VerifierMounts, slot: SlotContext) -> ToolOutput:
    if op.timeout_s <= 0:
        raise BadToolRequest("timeout_s must be positive")
    if isolation_mode(slot.sandbox.require_isolation) != "bubblewrap":
        raise BadToolRequest("a verifier command needs bubblewrap, and this server runs commands unisolated")
    if slot.volume is None:
        raise BadToolRequest("a verifier command needs the slot's volume for its scratch folder")
    if mounts.tests is not None and slot.cache is None:
        raise BadToolRequest("this sandbox has no shared cache for the tests")
    entry = slot.cache.path(mounts.tests) if mounts.tests is not None and slot.cache is not None else None
    scratch = slot.volume.path / f"verifier-{uuid.uuid4().hex[:12]}"
    output_dir = scratch / "output"
    try:
        try:
            folders, root, verifier_root = await _prepare(slot, mounts, entry, scratch)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            full = "the verifier has no room in the slot: its volume is full (the agent's files fill it)"
            return ToolOutput(call_id=call_id, ok=False, output=f"{full}: {os.strerror(err.errno)}")
        if root is None and slot.root is not None and (problem := _mount_points(slot, mounts, slot.owner)):
            return ToolOutput(call_id=call_id, ok=False, output=problem, verifier_root=verifier_root)
        binds = [(folders["tests"], mounts.tests_at)] if "tests" in folders else []
        result = await run_command(
            op.command,
            slot.sandbox,
            timeout_s=op.timeout_s,
            max_output_chars=slot.max_output_chars,
            binds=binds,
            writable=[(folders["output"], mounts.output_at)],
            root=root,
        )
        collected = await asyncio.to_thread(_collect, output_dir, mounts.collect)
    finally:
        if slot.root is not None:
            await asyncio.to_thread(slot.root.unmount_pristine)
            await asyncio.to_thread(slot.root.unexpose)
        await asyncio.to_thread(shutil.rmtree, scratch, True)
    output = result.output
    if verifier_root == "shared" and (over_disk := await settle_after_command(slot, result.duration_s, False)):
        output += over_disk
    return ToolOutput(
        call_id=call_id,
        ok=result.exit_code == 0 and not result.timed_out,
        output=output,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        truncated=result.truncated,
        duration_s=result.duration_s,
        collected=collected,
        verifier_root=verifier_root,
    )


async def _prepare(
    slot: SlotContext, mounts: VerifierMounts, entry: Path | None, scratch: Path
) -> tuple[dict[str, Path], Path | None, str]:
    """The verifier's folders in `scratch` (an output folder of the slot's uid, a readable copy of the tests),
    placed where the slot's uid reaches them, and its root: (folders by name, the pristine root or None,
    which root it runs on)."""
    os.mkdir(scratch, 0o711)  # the slot's uid passes through to its output folder, and sees nothing else here
    os.mkdir(scratch / "output", 0o700)
    if (owner := slot.owner) is not None:
        os.chown(scratch / "output", *owner)
    folders = {"output": scratch / "output"}
    if entry is not None:  # a copy of the server's, readable by the slot's uid, bound read-only
        await asyncio.to_thread(_copy_readable, entry, scratch / "tests")
        folders["tests"] = scratch / "tests"
    if slot.root is None:  # the server's own root: its system folders are read-only to a slot already
        return folders, None, "pristine" if mounts.pristine else "shared"
    folders = await asyncio.to_thread(slot.root.expose, folders)  # bwrap runs as the slot's uid and opens by path
    root = await asyncio.to_thread(slot.root.mount_pristine, scratch / "layer") if mounts.pristine else None
    return folders, root, "pristine" if root is not None else "shared"


def _copy_readable(source: Path, target: Path) -> None:
    """The cache entry's files and folders (it holds nothing else), the server's, readable by everyone."""
    shutil.copytree(source, target, symlinks=True)
    for folder, folders, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o111 else 0o644)


def _mount_points(slot: SlotContext, mounts: VerifierMounts, owner: tuple[int, int] | None) -> str:
    """On the root the agent changed, the folders the verifier's mounts go on, made by descriptor and never
    through a link (bwrap would follow one the agent placed); why not, or ""."""
    assert slot.root is not None
    top = open_root(slot.root.path)
    try:
        for inside in (mounts.tests_at, mounts.output_at):
            try:
                os.close(folder_beneath(top, [part for part in inside.split("/") if part], owner=owner))
            except OSError as err:
                return f"the verifier's folder {inside} cannot be made in the slot ({os.strerror(err.errno or 0)}): is it a link?"
    finally:
        os.close(top)
    return ""


def _collect(folder: Path, names: list[str]) -> dict[str, CollectedFile]:
    """The named files in the verifier's output folder, read by the server: a regular file of at most
    `MAX_COLLECTED_BYTES`, opened without following a link or blocking on a FIFO; anything else is reported."""
    collected: dict[str, CollectedFile] = {}
    top = open_root(folder)
    try:
        for name in names:
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=top)
            except FileNotFoundError:
                continue
            except OSError as err:
                collected[name] = CollectedFile(problem=f"not a regular file ({os.strerror(err.errno or 0)})")
                continue
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    collected[name] = CollectedFile(problem="not a regular file")
                elif info.st_size > MAX_COLLECTED_BYTES:
                    collected[name] = CollectedFile(problem=f"{info.st_size} bytes, over {MAX_COLLECTED_BYTES}")
                else:
                    data = os.read(fd, MAX_COLLECTED_BYTES + 1)
                    collected[name] = CollectedFile(text=data.decode("utf-8", "replace"))
            finally:
                os.close(fd)
    finally:
        os.close(top)
    return collected
