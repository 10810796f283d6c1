"""What a pack costs the server is bounded by what the slot holds, not by what its files claim to be."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import tarfile

import pytest

from temporal_rollouts.sandbox_server.files import archive
from temporal_rollouts.sandbox_server.files.archive import pack_folder, unpack_archive
from temporal_rollouts.sandbox_server.files.workspace import Trash

MIB = 1024 * 1024


class TooLarge(Exception):
    pass


def pack(folder, max_seconds: float | None = None) -> io.BytesIO:
    out = io.BytesIO()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pack_folder(fd, out, "w:gz", 1 << 30, TooLarge, max_seconds)
    finally:
        os.close(fd)
    out.seek(0)
    return out


def test_a_file_with_holes_is_packed_and_restored_as_sparse(tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir(), target.mkdir()
    with open(source / "holes", "wb") as file:
        file.seek(1000 * MIB)
        file.write(b"data")
        file.seek(200 * MIB)
        file.write(b"middle")
    (source / "dense").write_bytes(b"x" * 10_000)
    packed = pack(source)
    assert len(packed.getvalue()) < 64 * 1024
    with tarfile.open(fileobj=packed) as tar:
        assert tar.getmember("holes").issparse() and not tar.getmember("dense").issparse()
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        try:
            unpack_archive(tar, fd, None, trash=Trash(tmp_path), replace=False, limit=MIB)
        finally:
            os.close(fd)
    restored = (target / "holes").stat()
    assert restored.st_size == 1000 * MIB + 4 and restored.st_blocks * 512 < MIB
    with open(target / "holes", "rb") as file:
        file.seek(200 * MIB)
        assert file.read(6) == b"middle"
        file.seek(1000 * MIB)
        assert file.read() == b"data"
    assert (target / "dense").read_bytes() == b"x" * 10_000


def test_a_pack_past_its_time_limit_fails_with_the_reason(tmp_path):
    (tmp_path / "noise").write_bytes(os.urandom(16 * MIB))
    with pytest.raises(TooLarge, match="longer than its limit of 0.05 s"):
        pack(tmp_path, max_seconds=0.05)


def test_a_tree_deeper_than_a_walk_goes_fails_the_pack_with_the_reason(tmp_path):
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for _ in range(2100):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)
    try:
        with pytest.raises(TooLarge, match="deeper than 2048 levels"):
            pack(tmp_path)
    finally:  # pytest's own clean-up recurses, and fails at this depth
        subprocess.run(["rm", "-rf", "--", str(tmp_path / "d")], check=True)


def test_a_link_swapped_for_a_folder_while_it_is_packed_is_left_out(tmp_path, monkeypatch):
    """The swapper's race: listed as a link, a folder by the time it is read (readlink: EINVAL)."""
    (tmp_path / "swap").symlink_to("/etc")
    (tmp_path / "kept").write_text("kept")

    def swapped(*args, **kwargs):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(archive.os, "readlink", swapped)
    with tarfile.open(fileobj=pack(tmp_path)) as tar:
        assert tar.getnames() == ["kept"]
