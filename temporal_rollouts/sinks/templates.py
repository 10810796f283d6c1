"""The chat templates that render a chat policy's rollouts into token ids and masks (SFT data).

A chat policy configured with a `tokenizer` (and optionally a `chat_template`) gives groups with
template-rendered tokens; loading a template costs a tokenizer load, so each is loaded once."""

from __future__ import annotations

import asyncio

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import ChatPolicy, Settings
from temporal_rollouts.llm.templates import ChatTemplate


class SftTemplates:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._loaded: dict[tuple[str, str | None], ChatTemplate] = {}

    async def for_policy(self, policy: str | None, tokenizer: str | None = None) -> ChatTemplate | None:
        """The template for a chat policy with a tokenizer (its own, else `tokenizer`); None for any other policy."""
        try:
            endpoint = self._settings.policy_endpoint(policy)
        except ConfigError:
            return None
        if not isinstance(endpoint, ChatPolicy) or not (endpoint.tokenizer or tokenizer):
            return None
        key = (endpoint.tokenizer or tokenizer, endpoint.chat_template)
        if key not in self._loaded:
            self._loaded[key] = await asyncio.to_thread(ChatTemplate.load, *key)
        return self._loaded[key]
