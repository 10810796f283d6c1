"""Token ids and masks of a chat rollout, rendered with the model's chat template, for SFT.

A chat policy returns text, not token ids. For SFT data a trainer still wants the
conversation as the model reads it: the whole transcript rendered with the tokenizer's
chat template (tools included), with the assistant's turns trainable and everything else
masked (-100, Atropos' convention). An assistant turn's span is where the rendering of the
conversation up to and including it extends the rendering up to it (with the generation
prompt); a template that rewrites earlier turns breaks that prefix property, and such a
turn is left masked rather than guessed.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporal_rollouts.core.messages import Message, ToolSpec
from temporal_rollouts.core.token_trace import IGNORE_INDEX
from temporal_rollouts.llm.templates import ChatTemplate


def sft_tokens(
    template: ChatTemplate, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> tuple[list[int], list[int]]:
    """(token ids, masks) of the whole conversation; masks hold the id where it is trained on, else -100."""
    if not messages:
        return [], []
    tokens = template.encode(template.render(messages, tools, add_generation_prompt=False))
    masks = [IGNORE_INDEX] * len(tokens)
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        before = template.encode(template.render(messages[:index], tools, add_generation_prompt=True))
        after = template.encode(template.render(messages[: index + 1], tools, add_generation_prompt=False))
        if tokens[: len(before)] != before or tokens[: len(after)] != after:
            continue  # the template rewrote earlier turns: leave this one masked
        for position in range(len(before), len(after)):
            masks[position] = tokens[position]
    return tokens, masks
