"""The data converter every client and worker uses: pydantic JSON, with large payloads
offloaded to the object store through Temporal's own ExternalStorage and S3 driver."""

from __future__ import annotations

import dataclasses

from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, ExternalStorage

from temporal_rollouts.core.settings import Settings

PAYLOAD_PREFIX = "payloads"

PAYLOAD_DRIVER_NAME = "rollouts.payloads"


def data_converter(settings: Settings, objects: S3StorageDriverClient) -> DataConverter:
    # The driver name is written into every stored payload reference: renaming it would
    # orphan the payloads of histories that already exist.
    driver = S3StorageDriver(objects, bucket=settings.storage.bucket, driver_name=PAYLOAD_DRIVER_NAME)
    storage = ExternalStorage(drivers=[driver], payload_size_threshold=settings.storage.payload_size_threshold)
    return dataclasses.replace(pydantic_data_converter, external_storage=storage)
