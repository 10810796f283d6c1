"""Regenerate mistral_common_rendered.json: assistant tool-call turns as Mistral's own
reference tokenizer library (mistral-common) encodes them, decoded back to text
with special tokens kept.

Not run by the tests (mistral-common is not a project dependency); run by hand:

    python -m venv /tmp/mc && /tmp/mc/bin/pip install mistral-common==1.13.1
    /tmp/mc/bin/python tests/data/templates/render_mistral_common.py

mistral-common ships the tekken_240911.json vocabulary (a v3 tekken file) but no
v11/v13 tokenizer file, so for those versions the same vocabulary is loaded with
the version set to v11/v13 and the special tokens [ARGS], [CALL_ID], [THINK],
[/THINK] added. Their ids differ from a real Mistral checkpoint's; the text is
what the library's InstructTokenizerV11/V13 produce, which is all the parser sees.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import mistral_common
from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import (
    Function,
    FunctionCall,
    Tool,
    ToolCall,
)
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

DATA = Path(mistral_common.__file__).parent / "data"
OUT = Path(__file__).with_name("mistral_common_rendered.json")
EXTRA_SPECIALS = ("[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]")

TOOLS = [
    Tool(
        function=Function(
            name="get_weather",
            description="Current weather for a city",
            parameters={
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "kelvin"]}},
                "required": ["city"],
            },
        )
    ),
    Tool(
        function=Function(
            name="search",
            description="Search the web",
            parameters={"type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}},
        )
    ),
]

CALLS = [
    {"id": "abc123XYZ", "name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
    {
        "id": "def456UVW",
        "name": "search",
        "arguments": {"query": 'a "quoted" [bracket]', "filters": {"lang": "fr", "max": 3}},
    },
]
CASES = {
    "two_calls": {"content": None, "calls": CALLS},
    "content_and_call": {"content": "Let me check the weather first.", "calls": CALLS[:1]},
}


def tokenizer(version: str, workdir: Path) -> MistralTokenizer:
    model = json.loads((DATA / "tekken_240911.json").read_text())
    if version == "v3":
        return MistralTokenizer.from_file(str(DATA / "tekken_240911.json"))
    model["config"]["version"] = version
    specials = [{**token, "token_str": str(token["token_str"])} for token in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    specials += [{"rank": 32 + i, "token_str": s, "is_control": True} for i, s in enumerate(EXTRA_SPECIALS)]
    used = {token["rank"] for token in specials}
    specials += [
        {"rank": i, "token_str": f"<SPECIAL_{i}>", "is_control": True}
        for i in range(model["config"]["default_num_special_tokens"])
        if i not in used
    ]
    model["special_tokens"] = sorted(specials, key=lambda token: token["rank"])
    path = workdir / f"tekken_{version}.json"
    path.write_text(json.dumps(model))
    return MistralTokenizer.from_file(str(path))


def assistant_text(tok: MistralTokenizer, content: str | None, calls: list[dict]) -> str:
    assistant = AssistantMessage(
        content=content,
        tool_calls=[
            ToolCall(
                id=c["id"],
                function=FunctionCall(name=c["name"], arguments=json.dumps(c["arguments"], ensure_ascii=False)),
            )
            for c in calls
        ],
    )
    messages = [
        UserMessage(content="Weather in Zürich, and search something."),
        assistant,
        UserMessage(content="thanks"),
    ]
    tokens = tok.encode_chat_completion(ChatCompletionRequest(messages=messages, tools=TOOLS)).tokens
    text = tok.instruct_tokenizer.tokenizer.decode(tokens, special_token_policy=SpecialTokenPolicy.KEEP)
    start = text.index("[/INST]") + len("[/INST]")
    return text[start : text.index("</s>", start) + len("</s>")]


def main() -> None:
    rendered: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for version in ("v3", "v7", "v11", "v13"):
            tok = tokenizer(version, Path(tmp))
            rendered[version] = {}
            for case, spec in CASES.items():
                if version == "v3" and spec["content"]:
                    continue  # v3 refuses content and tool calls in one message
                rendered[version][case] = assistant_text(tok, spec["content"], spec["calls"])
    OUT.write_text(
        json.dumps(
            {
                "source": f"mistral-common {mistral_common.__version__} (PyPI), vocabulary data/tekken_240911.json",
                "generator": "tests/data/templates/render_mistral_common.py",
                "cases": CASES,
                "rendered": rendered,
            },
            ensure_ascii=False,
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
