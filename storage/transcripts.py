"""Transcripts stored once per message, so a model turn's input is a reference, not the conversation.

Each message is stored under the hash of its JSON; a transcript is a chain of nodes,
each naming its parent and the messages it appends, stored under its own hash. A
turn's activity input is the head node's key and its result a new head: history grows
by a fixed number of bytes per turn whatever the context length, and nothing is ever
stored twice. A worker keeps what it read in memory, so walking the chain costs one
read per new node.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, Field
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from llm.context import estimate_tokens
from rollouts.messages import Message, ToolSpec

PREFIX = "transcripts"
T = TypeVar("T")


class TranscriptRef(BaseModel):
    """A transcript as workflows carry it: the head node plus counts, about a hundred bytes."""

    head: str
    messages: int = Field(description="How many messages the transcript holds.")
    tokens: int = Field(description="Estimated context tokens (llm.context.estimate_tokens).")


class _Node(BaseModel):
    parent: str | None
    messages: list[str]
    tools: str | None = Field(default=None, description="On the first node: the tools offered to the model.")


# 128 bits of SHA-256: collision-free for any transcript store, and half the bytes in history.
DIGEST_HEX = 32


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


class _Lru(OrderedDict):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: str, value: object) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


class TranscriptStore:
    def __init__(self, objects: S3StorageDriverClient, bucket: str, cache_entries: int = 20_000) -> None:
        self._objects = objects
        self._bucket = bucket
        self._cache = _Lru(cache_entries)

    async def _put(self, kind: str, data: bytes, value: object) -> str:
        """Store `data` once; returns its digest, the key that references carry. The worker
        keeps `value` (the parsed form) so a later read costs neither I/O nor parsing."""
        digest = _digest(data)
        path = f"{PREFIX}/{kind}/{digest}"
        if path not in self._cache and not await self._objects.object_exists(bucket=self._bucket, key=path):
            await self._objects.put_object(bucket=self._bucket, key=path, data=data)
        self._cache.put(path, value)
        return digest

    async def _get(self, kind: str, digest: str, parse: Callable[[bytes], T]) -> T:
        path = f"{PREFIX}/{kind}/{digest}"
        if (cached := self._cache.get(path)) is not None:
            self._cache.move_to_end(path)
            return cached
        value = parse(await self._objects.get_object(bucket=self._bucket, key=path))
        self._cache.put(path, value)
        return value

    async def put_tools(self, tools: list[ToolSpec]) -> str:
        return await self._put("tools", json.dumps([t.model_dump() for t in tools], sort_keys=True).encode(), tools)

    async def tools(self, key: str) -> list[ToolSpec]:
        return await self._get("tools", key, lambda data: [ToolSpec.model_validate(t) for t in json.loads(data)])

    async def put_message(self, message: Message) -> str:
        return await self._put("messages", message.model_dump_json(exclude_none=True).encode(), message)

    async def message(self, key: str) -> Message:
        return await self._get("messages", key, Message.model_validate_json)

    async def start(self, messages: list[Message], tools: list[ToolSpec]) -> TranscriptRef:
        """A new transcript holding `messages`, offering `tools`."""
        head = await self._append_node(None, messages, tools=await self.put_tools(tools))
        return TranscriptRef(head=head, messages=len(messages), tokens=estimate_tokens(messages))

    async def append(self, transcript: TranscriptRef, messages: list[Message]) -> TranscriptRef:
        head = await self._append_node(transcript.head, messages)
        return transcript.model_copy(update={
            "head": head, "messages": transcript.messages + len(messages),
            "tokens": transcript.tokens + estimate_tokens(messages),
        })

    async def _append_node(self, parent: str | None, messages: list[Message], tools: str | None = None) -> str:
        keys = [await self.put_message(m) for m in messages]
        node = _Node(parent=parent, messages=keys, tools=tools)
        return await self._put("nodes", node.model_dump_json().encode(), node)

    async def _chain(self, transcript: TranscriptRef) -> list[_Node]:
        """The nodes from the first to the head."""
        nodes: list[_Node] = []
        head: str | None = transcript.head
        while head is not None:
            node = await self._get("nodes", head, _Node.model_validate_json)
            nodes.append(node)
            head = node.parent
        return nodes[::-1]

    async def load(self, transcript: TranscriptRef) -> list[Message]:
        """Every message, oldest first."""
        return [await self.message(key) for node in await self._chain(transcript) for key in node.messages]

    async def offered_tools(self, transcript: TranscriptRef) -> list[ToolSpec]:
        """The tools the transcript was started with."""
        first = (await self._chain(transcript))[0]
        return await self.tools(first.tools) if first.tools else []
