"""The object store behind everything in `storage/`: a local folder, or S3 (MinIO).

Both speak the Temporal SDK's `S3StorageDriverClient` interface, so the SDK's own S3
driver stores payloads in either, and transcripts and snapshots use the same store.
Workspace snapshots can be large, so both also move whole files (`put_file`,
`get_file`) without holding them in memory: `object_from_file` and `object_to_file`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings


INLINE_WRITE_BYTES = 256 * 1024
"""Objects up to this size are written on the event loop: a rollout step writes a few small ones, and
handing each to a thread and waking the loop for its result cost more CPU than the write itself."""


class LocalObjectClient(S3StorageDriverClient):
    """Objects as files `<root>/<bucket>/<key>`, written atomically (temp file + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._resolved_root = os.path.realpath(self.root)
        self._folders: set[str] = set()  # folders this process has made (or found) already

    def _path(self, bucket: str, key: str) -> Path:
        # A lexical check (no realpath per object: every step writes several). The store's own
        # folders hold no symlinks; only `..` in a key or bucket could lead out of it.
        path = os.path.normpath(os.path.join(self._resolved_root, bucket, key))
        if not path.startswith(self._resolved_root + os.sep):
            raise ValueError(f"object key escapes the store: {key!r}")
        return Path(path)

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        path = self._path(bucket, key)
        if len(data) <= INLINE_WRITE_BYTES:
            self._write(path, data)
        else:
            await asyncio.to_thread(self._write, path, data)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        return self._path(bucket, key).exists()

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        path = self._path(bucket, key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError as err:
            raise KeyError(f"no object {bucket}/{key} in {self.root}") from err

    def describe(self) -> Mapping[str, str]:
        return {"store": "local", "root": str(self.root)}

    async def put_file(self, *, bucket: str, key: str, path: Path) -> None:
        await asyncio.to_thread(self._copy_in, Path(path), self._path(bucket, key))

    async def get_file(self, *, bucket: str, key: str, path: Path) -> None:
        source = self._path(bucket, key)
        if not source.exists():
            raise KeyError(f"no object {bucket}/{key} in {self.root}")
        await asyncio.to_thread(shutil.copyfile, source, path)

    def _copy_in(self, source: Path, path: Path) -> None:
        with open(source, "rb") as data:
            self._atomically(path, lambda out: shutil.copyfileobj(data, out, 1024 * 1024))

    def _write(self, path: Path, data: bytes) -> None:
        self._atomically(path, lambda out: out.write(data))

    def _atomically(self, path: Path, fill: Callable[[BinaryIO], object]) -> None:
        """Write `path` through a temp file beside it and a rename: readers see the whole object or none."""
        folder = str(path.parent)
        if folder not in self._folders:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._folders.add(folder)
        # A random name: O_EXCL says if another writer, on any host sharing the folder, had it.
        tmp = os.path.join(folder, f".tmp-{os.urandom(8).hex()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileNotFoundError:  # the folder was removed since this process made it
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, flags, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                fill(out)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def s3_addressing_style(endpoint_url: str | None, configured: str | None) -> str:
    """The addressing style boto gets. A custom endpoint (MinIO at `http://minio:9000`) defaults to
    path style: boto's "auto" would put the bucket in the host name there (`rollouts.minio`),
    which does not resolve."""
    if configured is not None:
        return configured
    return "path" if endpoint_url else "auto"


class S3ObjectClient(S3StorageDriverClient):
    """S3 through aioboto3 (the `s3` extra), opened on first use and kept for the process."""

    def __init__(self, endpoint_url: str | None, region: str | None, addressing_style: str | None = None) -> None:
        self._endpoint_url = endpoint_url
        self._region = region
        self.addressing_style = s3_addressing_style(endpoint_url, addressing_style)
        self._stack = contextlib.AsyncExitStack()
        self._client: S3StorageDriverClient | None = None
        self._s3: Any = None
        self._lock = asyncio.Lock()

    async def _open(self) -> S3StorageDriverClient:
        async with self._lock:
            if self._client is None:
                try:
                    import aioboto3
                    from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client
                except ImportError as err:
                    raise ConfigError("storage.type = 's3' needs the s3 extra: pip install -e '.[s3]'") from err
                from botocore.config import Config

                config = Config(s3={"addressing_style": self.addressing_style})
                s3 = await self._stack.enter_async_context(
                    aioboto3.Session().client(
                        "s3", endpoint_url=self._endpoint_url, region_name=self._region, config=config
                    )
                )
                self._client, self._s3 = new_aioboto3_client(s3), s3
            return self._client

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        await (await self._open()).put_object(bucket=bucket, key=key, data=data)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        return await (await self._open()).object_exists(bucket=bucket, key=key)

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        return await (await self._open()).get_object(bucket=bucket, key=key)

    def describe(self) -> Mapping[str, str]:
        return {"store": "s3", "endpoint": self._endpoint_url or "aws"}

    async def put_file(self, *, bucket: str, key: str, path: Path) -> None:
        """A multipart upload through boto's managed transfer, a part at a time."""
        await self._open()
        await self._s3.upload_file(str(path), bucket, key)

    async def get_file(self, *, bucket: str, key: str, path: Path) -> None:
        await self._open()
        await self._s3.download_file(bucket, key, str(path))

    async def aclose(self) -> None:
        await self._stack.aclose()
        self._client = None


async def object_from_file(objects: S3StorageDriverClient, *, bucket: str, key: str, path: Path) -> None:
    """Store a local file as an object, streamed where the store can (both of ours can)."""
    if isinstance(objects, LocalObjectClient | S3ObjectClient):
        await objects.put_file(bucket=bucket, key=key, path=path)
    else:  # another S3StorageDriverClient knows only whole payloads
        await objects.put_object(bucket=bucket, key=key, data=await asyncio.to_thread(Path(path).read_bytes))


async def object_to_file(objects: S3StorageDriverClient, *, bucket: str, key: str, path: Path) -> None:
    """Write an object into a local file, streamed where the store can."""
    if isinstance(objects, LocalObjectClient | S3ObjectClient):
        await objects.get_file(bucket=bucket, key=key, path=path)
    else:
        data = await objects.get_object(bucket=bucket, key=key)
        await asyncio.to_thread(Path(path).write_bytes, data)


def object_client(settings: Settings) -> S3StorageDriverClient:
    """The configured object store."""
    if settings.storage.type == "local":
        return LocalObjectClient(settings.storage_path)
    storage = settings.storage
    return S3ObjectClient(storage.endpoint_url, storage.region, storage.s3_addressing_style)
