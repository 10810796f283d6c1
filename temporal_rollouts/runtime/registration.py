"""Registering the project's search attributes on a server that lacks some.

The embedded dev server registers them when it starts; one started by an older version
of this project (its database outlives upgrades) lacks those added since, such as
RolloutPolicy, and refuses a workflow that sets them. The CLI adds the missing ones and
tries again.
"""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client

from temporal_rollouts.core import search_attributes as sa


async def add_missing_search_attributes(client: Client, namespace: str) -> list[str]:
    """Add the project's search attributes the namespace lacks; returns their names."""
    listed = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    missing = {
        key.name: IndexedValueType.ValueType(key.indexed_value_type.value)
        for key in sa.ALL
        if key.name not in listed.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )
    return sorted(missing)
