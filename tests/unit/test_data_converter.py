"""The data converter: pydantic JSON both ways, with one type-adapter cache for the whole process."""

from __future__ import annotations

from pathlib import Path

from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.storage import converter
from temporal_rollouts.storage.objects import LocalObjectClient


def test_converters_made_per_workflow_share_one_adapter_per_type(tmp_path: Path) -> None:
    """The worker makes a payload converter per workflow; none of them builds an adapter another built."""
    data = converter.data_converter(Settings(), LocalObjectClient(tmp_path))
    ref = TranscriptRef(head="a" * 32, messages=2, tokens=7)
    converter._type_adapters.cache_clear()
    for _ in range(5):
        payloads = data.payload_converter_class().to_payloads([ref])
        (back,) = data.payload_converter_class().from_payloads(payloads, [TranscriptRef])
        assert back == ref and isinstance(back, TranscriptRef)
    assert converter._type_adapters.cache_info().misses == 1
