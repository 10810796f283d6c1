"""Files with holes, saved and restored as such: a 1,000 MB file of 4 KB on disk costs 4 KB to pack.

Packed densely, four such files took 63 s and about 40 CPU-s to snapshot (the issue's attack), and a
1 GiB compressed cap let a snapshot read about 1 TB of zeros. Here a file whose blocks hold less than
its size is read by its data segments (lseek SEEK_DATA / SEEK_HOLE) and written as a GNU sparse 1.0
member of the PAX tar: a map of the segments at the head of the member's data, then the segments
themselves, which Python's tarfile and GNU tar both read. Restoring writes only the segments, at
their offsets, and sets the size: the holes stay holes. So packing costs what the slot holds on
disk, which its limits bound, never what a file claims to be.
"""

from __future__ import annotations

import errno
import os
import tarfile
from collections.abc import Callable
from typing import BinaryIO

BLOCK = tarfile.BLOCKSIZE
COPY_CHUNK = 1024 * 1024
Segment = tuple[int, int]
"""(offset, length) of data in a file."""


def data_segments(fd: int, info: os.stat_result) -> list[Segment] | None:
    """The data segments of a file with holes, or None for a file stored whole (no holes, or a filesystem
    that cannot say where they are)."""
    if info.st_blocks * 512 >= info.st_size:
        return None
    segments: list[Segment] = []
    offset = 0
    try:
        while offset < info.st_size:
            start = os.lseek(fd, offset, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), info.st_size)
            if end > start:
                segments.append((start, end - start))
            offset = end
    except OSError as err:
        if err.errno != errno.ENXIO:  # ENXIO: no data after `offset`, the rest is a hole
            return None
    finally:
        os.lseek(fd, 0, os.SEEK_SET)
    return segments


def sparse_member(member: tarfile.TarInfo, size: int, segments: list[Segment]) -> bytes:
    """Make `member` a GNU sparse 1.0 member of apparent `size`; returns the map that heads its data."""
    lines = [str(len(segments))] + [str(number) for segment in segments for number in segment]
    head = ("\n".join(lines) + "\n").encode()
    head += b"\0" * (-len(head) % BLOCK)
    member.pax_headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": member.name,
        "GNU.sparse.realsize": str(size),
    }
    member.size = len(head) + sum(length for _, length in segments)
    return head


class SegmentReader:
    """A sparse member's data as tarfile reads it (every read exactly as long as asked): the map, then each
    segment of the file, read as exactly its length (zeros after an end that came early, so a file changed
    while it is packed cannot break the archive). `tick` runs before each read, to stop a pack that takes
    too long."""

    def __init__(self, head: bytes, file: BinaryIO, segments: list[Segment], tick: Callable[[], None]) -> None:
        self._head, self._file, self._tick = head, file, tick
        self._segments = iter(segments)
        self._left = 0

    def read(self, count: int) -> bytes:
        self._tick()
        parts = [self._head[:count]]
        self._head = self._head[count:]
        wanted = count - len(parts[0])
        while wanted > 0:
            if self._left == 0:
                segment = next(self._segments, None)
                if segment is None:
                    break
                self._file.seek(segment[0])
                self._left = segment[1]
            take = min(wanted, self._left)
            data = self._file.read(take)
            parts.append(data + b"\0" * (take - len(data)))
            self._left -= take
            wanted -= take
        return b"".join(parts)


def stored_bytes(member: tarfile.TarInfo) -> int:
    """What restoring `member` writes to disk: its data segments, not its apparent size."""
    if member.sparse is None:
        return max(member.size, 0)
    return sum(length for _, length in member.sparse)


def check_map(member: tarfile.TarInfo) -> str | None:
    """Why a sparse member's map cannot be restored as it says (segments out of order or past its end), or None."""
    end = 0
    for offset, length in member.sparse or ():
        if offset < end or length < 0 or offset + length > member.size:
            return f"archive entry {member.name!r} has a broken sparse map"
        end = offset + length
    return None


def restore(source: BinaryIO, file: BinaryIO, member: tarfile.TarInfo) -> None:
    """Write a sparse member's segments at their offsets into `file`, then set its size (holes stay holes)."""
    for offset, length in member.sparse or ():
        source.seek(offset)
        file.seek(offset)
        while length > 0 and (chunk := source.read(min(COPY_CHUNK, length))):
            file.write(chunk)
            length -= len(chunk)
    file.truncate(member.size)
