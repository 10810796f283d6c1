"""The demo policy answers a harness: the task found inside the harness's prompt, our tools' calls
written for its shell, and the end as its prompt says."""

from __future__ import annotations

import json
import shlex
import subprocess

from starlette.testclient import TestClient

from temporal_rollouts.core.tasks import ScriptedCall
from temporal_rollouts.policy_servers.demo import SolutionIndex, build_app
from temporal_rollouts.policy_servers.shell_calls import as_shell, shell_tool, submit_command

TASK = "Write the word `blue` into colour.txt."
SOLUTION = [
    [ScriptedCall(name="write_file", arguments={"path": "out/colour.txt", "content": "blue\n'quoted' $HOME"})],
    [ScriptedCall(name="terminal", arguments={"command": "cat out/colour.txt"})],
]
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
MINI_PROMPT = f"Please solve this issue: {TASK}\n\nFinish with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."


class KnownTask(SolutionIndex):
    def _build(self):
        return {TASK: SOLUTION}


def client() -> TestClient:
    app = build_app()
    app.state.policy.index = KnownTask()
    return TestClient(app, base_url="http://127.0.0.1")


def ask(http: TestClient, messages: list[dict], tools: list[dict]) -> dict:
    answer = http.post("/v1/chat/completions", json={"model": "policy", "messages": messages, "tools": tools})
    assert answer.status_code == 200
    return answer.json()["choices"][0]["message"]


def test_a_wrapped_task_is_solved_through_the_harness_shell_and_submitted() -> None:
    http = client()
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": MINI_PROMPT}]
    commands = []
    for _ in range(3):
        message = ask(http, messages, [BASH])
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == "bash"
        commands.append(json.loads(call["function"]["arguments"])["command"])
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
    assert commands[1] == "cat out/colour.txt"
    assert commands[2] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_without_a_submit_command_the_end_is_a_reply_without_tool_calls() -> None:
    http = client()
    messages = [{"role": "user", "content": TASK}]
    for _ in range(2):
        message = ask(http, messages, [BASH])
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "ok"}]
    final = ask(http, messages, [BASH])
    assert final["content"] == "Done." and "tool_calls" not in final


def test_our_own_tools_are_called_as_they_are() -> None:
    ours = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("write_file", "terminal")]
    message = ask(client(), [{"role": "user", "content": TASK}], ours)
    assert message["tool_calls"][0]["function"]["name"] == "write_file"


def test_a_written_file_command_writes_the_exact_bytes(tmp_path) -> None:
    content = "blue\n'quoted' $HOME `x` \\n"
    command = as_shell("write_file", {"path": "deep/er/f.txt", "content": content})
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    assert (tmp_path / "deep/er/f.txt").read_text() == content
    assert as_shell("read_file", {"path": "a b"}) == f"cat {shlex.quote('a b')}"
    assert as_shell("teleport", {"to": "moon"}) is None


def test_a_shell_tool_is_one_that_takes_one_required_string() -> None:
    other = {"type": "function", "function": {"name": "think", "parameters": {"type": "object", "properties": {}}}}
    assert shell_tool([other, BASH]) == ("bash", "command")
    assert shell_tool([other]) is None
    assert submit_command(["nothing here", MINI_PROMPT]) == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    assert submit_command(["run `echo hi` first"]) is None
