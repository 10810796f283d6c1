"""The local object store keeps every key inside its folder."""

from __future__ import annotations

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
