"""The data converter every client and worker uses: pydantic JSON, with large payloads
offloaded to the object store through Temporal's own ExternalStorage and S3 driver.

Pydantic's type adapters are cached once per process: the SDK's converter caches them per
converter instance, and the worker makes a converter per workflow, so each rollout built its
adapters anew (a few hundred microseconds of CPU per rollout step).

Its failure converter leaves the Python stack trace out of a failure that is the user's to
fix (a refused input, setting, env or item): `temporal workflow describe` and the UI show
such a failure's message, which says everything, instead of a trace of our code under it."""

from __future__ import annotations

import dataclasses
import functools

from pydantic import TypeAdapter
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverter,
    DefaultPayloadConverter,
    ExternalStorage,
    JSONPlainPayloadConverter,
    PayloadConverter,
)

from temporal_rollouts.core.errors import ConfigError, TaskError, error_class
from temporal_rollouts.core.settings import Settings

PAYLOAD_PREFIX = "payloads"

PAYLOAD_DRIVER_NAME = "rollouts.payloads"


_type_adapters = functools.lru_cache(maxsize=4096)(TypeAdapter)
"""Every converter's adapters, by type hint: the types a worker decodes are a fixed, small set."""


class _SharedAdaptersJSONConverter(PydanticJSONPlainPayloadConverter):
    def __init__(self) -> None:
        super().__init__()
        self._type_adapter = _type_adapters


class RolloutsPayloadConverter(CompositePayloadConverter):
    """The SDK's pydantic payload converter, with the process-wide adapter cache."""

    def __init__(self) -> None:
        json_converter = _SharedAdaptersJSONConverter()
        super().__init__(
            *(
                json_converter if isinstance(converter, JSONPlainPayloadConverter) else converter
                for converter in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


def is_user_error(type_name: str) -> bool:
    cls = error_class(type_name)
    return cls is not None and issubclass(cls, (ConfigError, TaskError))


class UserErrorsWithoutTraces(DefaultFailureConverter):
    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        node: Failure | None = failure
        while node is not None:
            if node.HasField("application_failure_info") and is_user_error(node.application_failure_info.type):
                node.stack_trace = ""
            node = node.cause if node.HasField("cause") else None


def data_converter(settings: Settings, objects: S3StorageDriverClient) -> DataConverter:
    # The driver name is written into every stored payload reference: renaming it would
    # orphan the payloads of histories that already exist.
    driver = S3StorageDriver(objects, bucket=settings.storage.bucket, driver_name=PAYLOAD_DRIVER_NAME)
    storage = ExternalStorage(drivers=[driver], payload_size_threshold=settings.storage.payload_size_threshold)
    return dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=RolloutsPayloadConverter,
        external_storage=storage,
        failure_converter_class=UserErrorsWithoutTraces,
    )
