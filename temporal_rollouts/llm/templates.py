"""A model's own chat template, from its tokenizer: conversation -> text -> token ids.

Used by the token-level client: it renders what the model will read exactly as the
model was trained to read it (tools included) and tokenizes it itself. transformers
is imported only here and only when a token-level policy is used (`pip install
'temporal-rollouts[rl]'`). The tokenizer is loaded from a name or a local folder; on a
machine without internet give a folder.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import Message, ToolSpec

log = logging.getLogger(__name__)

PACKAGED_TEMPLATES = Path(__file__).with_name("chat_templates")
TOOL_TEMPLATES = {"You are a helpful AI assistant named SmolLM": "smollm2_tools.jinja"}
"""Text that marks a tokenizer's own template as one that renders no tools -> the packaged template used
instead when the policy names no `chat_template` (SmolLM2's own drops the tools and every tool call)."""
_MARK = "\u2063MARK\u2063"  # invisible separators: text no template adds on its own
_LOADING = threading.Lock()
"""transformers' lazy import is not thread-safe: two activity threads loading a tokenizer at once
made the second fail with "cannot import name 'AutoTokenizer'" (a group's first turns run together)."""


class ChatTemplate:
    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self._template = template
        if template is None and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the tokenizer has no chat template; set the policy's chat_template to a Jinja file")

    @classmethod
    def load(cls, tokenizer: str, chat_template: str | None = None) -> ChatTemplate:
        with _LOADING:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise ConfigError(
                    "token-level policies need transformers: pip install 'temporal-rollouts[rl]'"
                ) from exc
            try:
                loaded = AutoTokenizer.from_pretrained(tokenizer)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot load tokenizer {tokenizer!r}: {exc}") from exc
        template = None
        if chat_template:
            path = Path(chat_template)
            if not path.is_file():
                raise ConfigError(f"chat_template {chat_template!r} is not a file")
            template = path.read_text()
        elif (packaged := tool_template_for(loaded)) is not None:
            log.info("%s's own chat template renders no tools: using %s", tokenizer, packaged.name)
            template = packaged.read_text()
        return cls(loaded, template)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [template_message(m) for m in messages],
            tools=[tool.to_openai() for tool in tools] or None,
            chat_template=self._template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text; special-token text (e.g. <|im_start|>) becomes its id."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def count(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
        return len(self.encode(self.render(messages, tools, add_generation_prompt=True)))

    @cached_property
    def end_of_turn(self) -> str:
        """What the template writes after an assistant reply, e.g. '<|im_end|>\\n'."""
        text = self.render(
            [Message(role="user", content="hi"), Message(role="assistant", content=_MARK)],
            [],
            add_generation_prompt=False,
        )
        if _MARK not in text:
            raise ConfigError("the chat template does not render an assistant reply's content")
        return text.rsplit(_MARK, 1)[1]

    @cached_property
    def stop_token_ids(self) -> list[int]:
        """Tokens that end the model's turn: the template's end-of-turn token and EOS."""
        ids: list[int] = []
        end = self.encode(self.end_of_turn)
        special = set(self.tokenizer.all_special_ids)
        if end and end[0] in special:
            ids.append(end[0])
        eos = self.tokenizer.eos_token_id
        if isinstance(eos, int) and eos not in ids:
            ids.append(eos)
        return ids

    def turn_closing(self, generated: Sequence[int]) -> str:
        """Text to add after a reply so the sequence reads as the template renders a finished
        turn: the rest of the end-of-turn text after the stop token the model sampled, or
        all of it when the model was cut off by the token limit."""
        if generated and generated[-1] in self.stop_token_ids:
            stop_text = self.decode([generated[-1]])
            end = self.end_of_turn
            return end[len(stop_text) :] if end.startswith(stop_text) else ""
        return self.end_of_turn


def tool_template_for(tokenizer: Any) -> Path | None:
    """The packaged template for a tokenizer whose own one renders no tools (`TOOL_TEMPLATES`), else None."""
    own = getattr(tokenizer, "chat_template", None)
    if not isinstance(own, str) or "tools" in own:
        return None
    return next((PACKAGED_TEMPLATES / name for marker, name in TOOL_TEMPLATES.items() if marker in own), None)


def template_message(message: Message) -> dict[str, Any]:
    """The dict chat templates expect: tool-call arguments as a mapping, not JSON text
    (templates apply `tojson` to them, which would encode a string twice)."""
    data = message.to_openai()
    if message.tool_calls:
        data["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    return data


def _arguments(raw: str) -> Any:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw
