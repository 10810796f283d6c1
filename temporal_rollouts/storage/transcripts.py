"""Transcripts stored once per message, so a model turn's input is a reference, not the conversation.

Each message is stored under the hash of its JSON; a transcript is a chain of nodes,
each naming its parent and the messages it appends, stored under its own hash. A
turn's activity input is the head node's key and its result a new head: history grows
by a fixed number of bytes per turn whatever the context length, and nothing is ever
stored twice. A worker keeps what it read in memory, so walking the chain costs one
read per new node.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, Field
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from temporal_rollouts.core.messages import Message, ToolSpec, estimate_tokens
from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.storage.content import ContentStore

PREFIX = "transcripts"



class _Node(BaseModel):
    parent: str | None
    messages: list[str]
    tools: str | None = Field(default=None, description="On the first node: the tools offered to the model.")


class TranscriptStore:
    def __init__(self, objects: S3StorageDriverClient, bucket: str, cache_entries: int = 20_000) -> None:
        self._store = ContentStore(objects, bucket, PREFIX, cache_entries)

    async def put_tools(self, tools: list[ToolSpec]) -> str:
        return await self._store.put("tools", json.dumps([t.model_dump() for t in tools], sort_keys=True).encode(), tools)

    async def tools(self, key: str) -> list[ToolSpec]:
        return await self._store.get("tools", key, lambda data: [ToolSpec.model_validate(t) for t in json.loads(data)])

    async def put_message(self, message: Message) -> str:
        return await self._store.put("messages", message.model_dump_json(exclude_none=True).encode(), message)

    async def message(self, key: str) -> Message:
        return await self._store.get("messages", key, Message.model_validate_json)

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
        return await self._store.put("nodes", node.model_dump_json().encode(), node)

    async def _chain(self, transcript: TranscriptRef) -> list[_Node]:
        """The nodes from the first to the head."""
        return await self._store.chain("nodes", transcript.head, _Node.model_validate_json)

    async def load(self, transcript: TranscriptRef) -> list[Message]:
        """Every message, oldest first."""
        return [await self.message(key) for node in await self._chain(transcript) for key in node.messages]

    async def offered_tools(self, transcript: TranscriptRef) -> list[ToolSpec]:
        """The tools the transcript was started with."""
        first = (await self._chain(transcript))[0]
        return await self.tools(first.tools) if first.tools else []
