"""The minimal harness: the openai client and one bash tool, the smallest agent that runs in a slot.

It reads its task from the file `$ROLLOUTS_TASK_FILE`, asks the model at `$OPENAI_BASE_URL` (the
rollout's endpoint; the openai client reads it and `$OPENAI_API_KEY` itself) what to run, runs each
command with bash in the working directory, and sends back the output, until the model answers
without calling the tool. That answer is printed, and the harness exits 0. Its history is the plain
chat-completions one: each request repeats the conversation so far and adds the tool results,
so every call extends one token sequence.

It imports only the standard library and openai, so a slot needs nothing else (the worker builds the
bundle: `HarnessSpec` `minimal`). Run it by hand against any OpenAI-compatible server with
`ROLLOUTS_TASK_FILE=task.md OPENAI_BASE_URL=... OPENAI_API_KEY=... python -m temporal_rollouts.harnesses.minimal`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from openai import OpenAI

SYSTEM_PROMPT = (
    "You are an agent in a Linux sandbox. Your working directory holds the task's files. Use the bash tool "
    "to look around, change files and check your work; each call runs in a fresh shell there. When the task "
    "is done, reply with a short summary and no tool call."
)
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the working directory and see its output (stdout and stderr).",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command to run."}},
            "required": ["command"],
        },
    },
}
COMMAND_TIMEOUT_S = float(os.environ.get("MINIMAL_HARNESS_COMMAND_TIMEOUT_S", "60"))
MAX_OUTPUT_CHARS = 10_000
MAX_STEPS = int(os.environ.get("MINIMAL_HARNESS_MAX_STEPS", "1000"))
"""The rollout's own limits stop it long before this; it only keeps a run by hand bounded."""


def run_bash(command: str) -> str:
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=COMMAND_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return f"[the command timed out after {COMMAND_TIMEOUT_S:g}s]"
    output = done.stdout + done.stderr
    if len(output) > MAX_OUTPUT_CHARS:
        output = output[: MAX_OUTPUT_CHARS // 2] + "\n[... output shortened ...]\n" + output[-MAX_OUTPUT_CHARS // 2 :]
    return f"{output}\n[exit status {done.returncode}]"


def tool_result(call) -> str:
    if call.function.name != "bash":
        return f"unknown tool {call.function.name!r}: the only tool is bash"
    try:
        command = json.loads(call.function.arguments or "{}")["command"]
    except (ValueError, KeyError, TypeError):
        return 'the arguments must be a JSON object with a "command" string'
    return run_bash(command)


def main() -> int:
    with open(os.environ["ROLLOUTS_TASK_FILE"], encoding="utf-8") as task_file:
        task = task_file.read()
    # The endpoint answers when the rollout's step does: a worker that died makes it slower, never an error.
    client = OpenAI(max_retries=int(os.environ.get("MINIMAL_HARNESS_MAX_RETRIES", "2")), timeout=3600.0)
    model = os.environ.get("ROLLOUTS_MODEL", "policy")
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]
    for _ in range(MAX_STEPS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=[BASH_TOOL])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if not message.tool_calls:
            print(message.content or "")
            return 0
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result(call)})
    print(f"stopped after {MAX_STEPS} steps", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
