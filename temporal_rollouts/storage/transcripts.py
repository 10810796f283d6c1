"""Transcripts stored once per message, so a model turn's input is a reference, not the conversation.

Each message is stored under the hash of its JSON; a transcript is a chain of nodes,
each naming its parent and the messages it appends, stored under its own hash. A
turn's activity input is the head node's key and its result a new head: history grows
by a fixed number of bytes per turn whatever the context length, and nothing is ever
stored twice. A worker keeps what it read in memory, so walking the chain costs one
read per new node. A rollout's state after turn K is an earlier head of its own chain,
so a fork takes over its first K turns by reference (`cut`).
"""

from __future__ import annotations

import json

from pydantic import BaseModel, Field
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from temporal_rollouts.core.messages import Message, ToolSpec, estimate_tokens
from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.storage.content import DEFAULT_CACHE_BYTES, ContentStore

PREFIX = "transcripts"


class _Node(BaseModel):
    parent: str | None
    messages: list[str]
    tools: str | None = Field(default=None, description="On the first node: the tools offered to the model.")


class RecordedTurn(BaseModel):
    """One model turn as the transcript holds it: the reply and the tool results that followed it."""

    number: int
    reply: Message
    results: list[Message] = Field(default_factory=list)


class TranscriptStore:
    def __init__(self, objects: S3StorageDriverClient, bucket: str, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._store = ContentStore(objects, bucket, PREFIX, cache_bytes)

    async def put_tools(self, tools: list[ToolSpec]) -> str:
        return await self._store.put(
            "tools", json.dumps([t.model_dump() for t in tools], sort_keys=True).encode(), tools
        )

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
        return transcript.model_copy(
            update={
                "head": head,
                "messages": transcript.messages + len(messages),
                "tokens": transcript.tokens + estimate_tokens(messages),
            }
        )

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

    async def recorded_turns(self, transcript: TranscriptRef) -> tuple[list[Message], list[RecordedTurn]]:
        """(the prompt, every model turn in order). A turn is a node holding one assistant message, as
        llm_turn appends; the first node is the env's prompt, whatever it holds."""
        prompt: list[Message] = []
        turns: list[RecordedTurn] = []
        for index, node in enumerate(await self._chain(transcript)):
            messages = [await self.message(key) for key in node.messages]
            if index > 0 and len(messages) == 1 and messages[0].role == "assistant":
                turns.append(RecordedTurn(number=len(turns) + 1, reply=messages[0]))
            elif turns:
                turns[-1].results.extend(messages)
            else:
                prompt.extend(messages)
        return prompt, turns

    async def cut(self, transcript: TranscriptRef, turns: int) -> TranscriptRef:
        """The transcript as it stood after `turns` model turns and their tool results: the node just
        before turn `turns`+1's reply, an earlier head of the same chain (nothing is written)."""
        nodes = await self._chain(transcript)
        keys = [later.parent for later in nodes[1:]] + [transcript.head]
        seen, kept = 0, 0
        messages: list[Message] = []
        for index, node in enumerate(nodes):
            loaded = [await self.message(key) for key in node.messages]
            if index > 0 and len(loaded) == 1 and loaded[0].role == "assistant":
                if seen == turns:
                    break
                seen += 1
            kept = index
            messages.extend(loaded)
        if seen < turns:
            raise ValueError(f"the transcript holds {seen} model turns, not {turns}")
        head = keys[kept]
        assert head is not None
        return TranscriptRef(head=head, messages=len(messages), tokens=estimate_tokens(messages))
