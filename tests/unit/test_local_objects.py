"""The local object store keeps every key inside its folder."""

from __future__ import annotations

import shutil

import pytest

from temporal_rollouts.storage.objects import LocalObjectClient


async def test_objects_round_trip_and_keys_cannot_leave_the_store(tmp_path) -> None:
    store = LocalObjectClient(tmp_path / "objects")
    await store.put_object(bucket="rollouts", key="transcripts/ab/cd", data=b"hello")
    assert await store.get_object(bucket="rollouts", key="transcripts/ab/cd") == b"hello"
    assert await store.object_exists(bucket="rollouts", key="transcripts/ab/cd")
    for bucket, key in (("rollouts", "../../outside"), ("..", "outside"), ("rollouts", "/etc/passwd")):
        with pytest.raises(ValueError, match="escapes the store"):
            await store.put_object(bucket=bucket, key=key, data=b"x")
    assert not (tmp_path / "outside").exists()


async def test_a_write_remakes_a_folder_removed_since_the_store_made_it(tmp_path) -> None:
    """The store remembers the folders it made; one emptied by hand meanwhile is made again, not an error."""
    store = LocalObjectClient(tmp_path / "objects")
    await store.put_object(bucket="rollouts", key="transcripts/messages/a", data=b"one")
    shutil.rmtree(tmp_path / "objects" / "rollouts")
    await store.put_object(bucket="rollouts", key="transcripts/messages/b", data=b"two")
    assert await store.get_object(bucket="rollouts", key="transcripts/messages/b") == b"two"
    big = b"x" * (3 * 1024 * 1024)  # past the inline size: written from a thread, same path
    shutil.rmtree(tmp_path / "objects" / "rollouts")
    await store.put_object(bucket="rollouts", key="transcripts/messages/c", data=big)
    assert await store.get_object(bucket="rollouts", key="transcripts/messages/c") == big
    assert not [p for p in (tmp_path / "objects").rglob(".tmp-*")]
