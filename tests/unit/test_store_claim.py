"""What the workers of one task queue must share, as each worker and command compares it: the
object store, and for the local sandbox backend the data folder that holds its pool's registry."""

from __future__ import annotations

from pathlib import Path

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.store_claim import store_claim


def local(data_dir: Path, host: str = "laptop") -> Settings:
    return Settings(data_dir=data_dir, worker={"host_name": host})


def cluster(data_dir: Path, host: str) -> Settings:
    return Settings(
        data_dir=data_dir,
        temporal={"address": "temporal.internal:7233"},
        worker={"host_name": host},
        storage={"type": "s3", "endpoint_url": "http://minio:9000", "bucket": "rollouts"},
        sandbox={"backend": {"type": "nomad", "address": "http://nomad:4646", "secret_env": "POOL_SECRET"}},
    )


def test_two_checkouts_on_one_host_differ_in_store_and_pool(tmp_path: Path) -> None:
    a, b = store_claim(local(tmp_path / "a")), store_claim(local(tmp_path / "b"))
    assert a.object_store == f"file://laptop{tmp_path / 'a' / 'storage'}/rollouts"
    assert [line.split()[0] for line in a.differences(b)] == ["object_store", "pool"]
    assert store_claim(local(tmp_path / "a")).differences(a) == []


def test_hosts_of_a_cluster_agree_although_their_data_folders_differ(tmp_path: Path) -> None:
    one, two = store_claim(cluster(tmp_path / "one", "host-1")), store_claim(cluster(tmp_path / "two", "host-2"))
    assert one.object_store == "s3://minio:9000/rollouts" and one.pool is None
    assert one.differences(two) == []


def test_a_local_store_is_named_with_its_host(tmp_path: Path) -> None:
    """The same folder on two hosts is two stores: a worker on one cannot read what the other wrote."""
    shared = tmp_path / "same"
    assert store_claim(local(shared, "host-1")).differences(store_claim(local(shared, "host-2")))
