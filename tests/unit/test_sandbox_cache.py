"""The sandbox server's shared cache on its own (no server, no slots): what a crash leaves is
swept, names are checked, a bad archive leaves nothing, concurrent puts of one name store it once."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from temporal_rollouts.sandbox_server.files.cache import SharedCache
from temporal_rollouts.sandbox_server.errors import BadToolRequest, TransferTooLarge


def archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def body(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 7):
        await asyncio.sleep(0)
        yield data[start : start + 7]


def entries(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name != ".lock")


def test_a_crashed_put_leaves_nothing_a_restart_keeps(tmp_path: Path) -> None:
    cache = SharedCache(tmp_path)
    (cache.folder / ".tmp-half-written").mkdir()
    (cache.folder / ".tmp-spool").write_bytes(b"partial")
    (cache.folder / "kept").mkdir()
    again = SharedCache(tmp_path)
    assert entries(again.folder) == ["kept"]
    assert again.get("kept").present and not again.get("other").present


async def test_names_and_archives_are_checked(tmp_path: Path) -> None:
    cache = SharedCache(tmp_path)
    for name in (".tmp-x", "../escape", "a/b", ""):
        with pytest.raises(BadToolRequest):
            await cache.put(name, body(archive({"f": b"x"})), 1 << 20)
    with pytest.raises(BadToolRequest):
        await cache.put("evil", body(archive({"../outside": b"x"})), 1 << 20)
    with pytest.raises(BadToolRequest):
        await cache.put("garbage", body(b"not a tar.gz"), 1 << 20)
    with pytest.raises(TransferTooLarge):
        await cache.put("big", body(archive({"f": b"x" * 5000})), 100)
    with pytest.raises(BadToolRequest):
        cache.path("evil")
    assert entries(cache.folder) == []
    assert not (tmp_path / "outside").exists()


async def test_concurrent_puts_of_one_name_store_it_once(tmp_path: Path) -> None:
    cache = SharedCache(tmp_path)
    data = archive({"repo.git/HEAD": b"ref: refs/heads/main\n", "wheels/a.whl": b"wheel"})
    answers = await asyncio.gather(*(cache.put("entry", body(data), 1 << 20) for _ in range(5)))
    assert sorted(answer.created for answer in answers) == [False] * 4 + [True]
    assert entries(cache.folder) == ["entry"]
    head = cache.path("entry") / "repo.git" / "HEAD"
    assert head.read_bytes() == b"ref: refs/heads/main\n"
    assert head.stat().st_mode & 0o777 == 0o644 and head.parent.stat().st_mode & 0o777 == 0o755
    later = await cache.put("entry", body(archive({"other": b"y"})), 1 << 20)
    assert not later.created and not (cache.path("entry") / "other").exists()  # the first put of a name wins
