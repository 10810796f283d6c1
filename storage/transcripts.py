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

from pydantic import BaseModel, Field
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from llm.context import estimate_tokens
from rollouts.messages import Message, ToolSpec

PREFIX = "transcripts"


class TranscriptRef(BaseModel):
    """A transcript as workflows carry it: the head node plus counts, a few hundred bytes."""

    head: str
    messages: int = Field(description="How many messages the transcript holds.")
    tokens: int = Field(description="Estimated context tokens (llm.context.estimate_tokens).")
    tools: str | None = Field(default=None, description="Key of the tool specs offered to the model.")


class _Node(BaseModel):
    parent: str | None
    messages: list[str]


def _key(kind: str, data: bytes) -> str:
    return f"{PREFIX}/{kind}/{hashlib.sha256(data).hexdigest()}"


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

    async def _put(self, kind: str, data: bytes) -> str:
        key = _key(kind, data)
        if key not in self._cache and not await self._objects.object_exists(bucket=self._bucket, key=key):
            await self._objects.put_object(bucket=self._bucket, key=key, data=data)
        self._cache.put(key, data)
        return key

    async def _get(self, key: str) -> bytes:
        if (cached := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            return cached
        data = await self._objects.get_object(bucket=self._bucket, key=key)
        self._cache.put(key, data)
        return data

    async def put_tools(self, tools: list[ToolSpec]) -> str:
        return await self._put("tools", json.dumps([t.model_dump() for t in tools], sort_keys=True).encode())

    async def tools(self, key: str) -> list[ToolSpec]:
        return [ToolSpec.model_validate(t) for t in json.loads(await self._get(key))]

    async def put_message(self, message: Message) -> str:
        return await self._put("messages", message.model_dump_json(exclude_none=True).encode())

    async def message(self, key: str) -> Message:
        return Message.model_validate_json(await self._get(key))

    async def start(self, messages: list[Message], tools: list[ToolSpec]) -> TranscriptRef:
        """A new transcript holding `messages`, offering `tools`."""
        head = await self._append_node(None, messages)
        return TranscriptRef(head=head, messages=len(messages), tokens=estimate_tokens(messages),
                             tools=await self.put_tools(tools))

    async def append(self, transcript: TranscriptRef, messages: list[Message]) -> TranscriptRef:
        head = await self._append_node(transcript.head, messages)
        return transcript.model_copy(update={
            "head": head, "messages": transcript.messages + len(messages),
            "tokens": transcript.tokens + estimate_tokens(messages),
        })

    async def _append_node(self, parent: str | None, messages: list[Message]) -> str:
        keys = [await self.put_message(m) for m in messages]
        return await self._put("nodes", _Node(parent=parent, messages=keys).model_dump_json().encode())

    async def load(self, transcript: TranscriptRef | str) -> list[Message]:
        """Every message, oldest first."""
        head: str | None = transcript.head if isinstance(transcript, TranscriptRef) else transcript
        chunks: list[list[str]] = []
        while head is not None:
            node = _Node.model_validate_json(await self._get(head))
            chunks.append(node.messages)
            head = node.parent
        return [await self.message(key) for chunk in reversed(chunks) for key in chunk]
