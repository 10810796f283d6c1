"""The token-level model client for training: one rollout, one exact token sequence.

Each turn renders the conversation with the model's own chat template, sends token ids
to `/generate`, and rebuilds the reply's tool calls from the raw text with a
tool-call parser. The sequence grows turn by turn: what the model generated is kept
as the very ids it sampled (with their logprobs), and only the text the template adds
between turns (tool results, the next generation prompt) is tokenized, as the
difference between two renders. When that difference does not exist (a template that
rewrites earlier turns) or the context had to be fitted, the sequence starts again
from a fresh render and the trace records the restart.

Kept apart from `llm.chat` (the OpenAI-compatible client for evaluation and SFT
data), as STYLE.md asks: they share only the HTTP helpers.

Why not atroposlib's ManagedServer, which tracks sequences the same way (prefix
extension, -100 masks, 1.0 logprobs where the model wrote nothing): it keeps its
sequence nodes in process memory across turns, while here every turn is its own
activity and may run on another worker after a crash, so the sequence must live in
payload storage between turns; and its tool-call parsing needs vLLM installed.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from temporal_rollouts.core.errors import ConfigError, ContextOverflow
from temporal_rollouts.core.messages import Message, ToolSpec
from temporal_rollouts.core.token_trace import TokenTrace
from temporal_rollouts.llm.context import fit_context
from temporal_rollouts.llm.generate import GenerateClient
from temporal_rollouts.llm.parsers import get_parser
from temporal_rollouts.llm.templates import ChatTemplate


class TokenTurn(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    message: Message
    added: TokenTrace
    """What this turn adds to the sequence: new context, any forced prefill, the reply, the turn's closing."""
    restarted: bool
    """True when `added` is a whole new sequence rather than a continuation."""
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    weight_version: str | None = None
    """The server's label of the weights that generated this turn (None when it reports none)."""


class TokenClient:
    def __init__(self, template: ChatTemplate, generator: GenerateClient, tool_call_parser: str) -> None:
        self.template = template
        self.generator = generator
        self.parser_name = tool_call_parser
        get_parser(tool_call_parser)  # an unknown name fails here, when the policy is first used

    async def aclose(self) -> None:
        await self.generator.aclose()

    async def turn(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        prior: TokenTrace | None,
        prior_messages: int,
        temperature: float,
        max_tokens: int | None,
        context_tokens: int,
        prefill: Message | None = None,
        id_seed: str = "",
        tool_call_parser: str | None = None,
    ) -> TokenTurn:
        """One model turn. `prior` is the sequence so far, rendering the first `prior_messages`
        of `messages`; None starts a sequence."""
        reserve = min(max_tokens, context_tokens // 2) if max_tokens else 0
        added, restarted = self._continuation(messages, tools, prior, prior_messages)
        base = 0 if restarted or prior is None else len(prior)
        if base + len(added) + reserve > context_tokens:
            fitted = fit_context(messages, context_tokens - reserve, lambda m: self.template.count(m, tools))
            added, restarted, base = self._fresh(fitted, tools), True, 0
            messages = fitted
        forced_text = self._prefill_text(messages, tools, prefill) if prefill else ""
        added.add_context(self.template.encode(forced_text))
        room = context_tokens - base - len(added)
        if room <= 0:
            raise ContextOverflow(f"the prompt takes {base + len(added)} of {context_tokens} context tokens")
        prompt = (prior.tokens if base else []) + added.tokens
        generation = await self.generator.generate(
            prompt,
            max_tokens=min(max_tokens or room, room),
            temperature=temperature,
            stop_token_ids=self.template.stop_token_ids,
        )
        added.add_generated(generation.ids, generation.logprobs)
        text = forced_text + self.template.decode(generation.ids)
        parser = get_parser(tool_call_parser or self.parser_name, tools=list(tools))
        parsed = parser.parse(text, id_seed=id_seed)
        added.add_context(self.template.encode(self.template.turn_closing(generation.ids)))
        return TokenTurn(
            message=parsed.to_message(),
            added=added,
            restarted=restarted,
            finish_reason=generation.finish_reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(generation.ids),
            weight_version=generation.weight_version,
        )

    def _continuation(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], prior: TokenTrace | None, prior_messages: int
    ) -> tuple[TokenTrace, bool]:
        """The tokens that take `prior` to the next generation prompt, or a fresh render."""
        if prior is None or prior_messages == 0 or prior_messages > len(messages):
            return self._fresh(messages, tools), prior is not None
        before = self.template.render(messages[:prior_messages], tools, add_generation_prompt=False)
        now = self.template.render(messages, tools, add_generation_prompt=True)
        if not now.startswith(before):
            return self._fresh(messages, tools), True
        added = TokenTrace()
        added.add_context(self.template.encode(now[len(before) :]))
        return added, False

    def _fresh(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> TokenTrace:
        trace = TokenTrace()
        trace.add_context(self.template.encode(self.template.render(messages, tools, add_generation_prompt=True)))
        return trace

    def _prefill_text(self, messages: Sequence[Message], tools: Sequence[ToolSpec], reply: Message) -> str:
        """`reply` written as the model would write it, without its end of turn: forced into
        the sequence (masked) so a model too small to choose tools still makes the calls."""
        prompt = self.template.render(messages, tools, add_generation_prompt=True)
        full = self.template.render([*messages, reply], tools, add_generation_prompt=False)
        if not full.startswith(prompt):
            raise ConfigError(
                "this chat template renders a reply that does not extend its generation prompt; "
                "prefill cannot be used with it"
            )
        return full[len(prompt) :].removesuffix(self.template.end_of_turn)
