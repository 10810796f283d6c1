"""The demo policy over real HTTP: it replays reference solutions and injects the faults it is told to."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

import envs
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.policy_servers.demo import MODEL_ID, BackgroundServer, conversation_key, start_in_thread
from tests.support import REPO
from tests.support.servers.process import free_port

CALL_ID = re.compile(r"^call_[0-9a-f]{8}$")
EXTRAS = {
    "tools": [{"type": "function", "function": {"name": "terminal", "parameters": {}}}],
    "temperature": 0.7,
    "max_tokens": 512,
}


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with start_in_thread(enable_control=True) as running:
        yield running


def test_the_control_endpoint_is_off_unless_asked_for_and_loopback_only() -> None:
    with start_in_thread() as plain, httpx.Client(base_url=plain.url, timeout=10.0) as http:
        assert http.post("/control", json={"fail_next": 5}).status_code == 404
        assert http.get("/control").status_code == 404
        assert http.post("/stats/reset").status_code in (404, 405)
        assert http.get("/health").status_code == 200
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "temporal_rollouts.policy_servers.demo",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--enable-control",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode != 0 and "loopback" in refused.stderr


@pytest.fixture
def client(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        assert http.post("/control", json={"reset": True}).status_code == 200
        assert http.post("/stats/reset").json()["total"] == 0
        yield http


def opening(env_name: str, item: Item, config: dict | None = None) -> list[dict]:
    env = envs.get_env(env_name, config)
    return [m.to_openai() for m in env.prompt_messages(item)]


def chat(client: httpx.Client, messages: list[dict]) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "whatever", "messages": messages, **EXTRAS})


def answer_tools(messages: list[dict], message: dict) -> None:
    """Append the assistant reply and a tool result for each of its calls."""
    messages.append(message)
    for call in message.get("tool_calls") or []:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})


def as_scripted(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


def test_models_and_health_say_it_is_a_test_policy(client):
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL_ID]
    assert "not a model" in models["data"][0]["description"]
    assert client.get("/health").json()["status"] == "ok"


def test_plays_a_terminal_task_turn_by_turn_then_stops(client):
    item = Item(id="fix-stats-script")
    env = envs.get_env("terminal_tasks")
    expected = [[(c.name, c.arguments) for c in turn] for turn in env.reference_solution(item)]
    assert len(expected) == 3
    messages = opening("terminal_tasks", item)
    for turn in expected:
        reply = chat(client, messages)
        assert reply.status_code == 200
        body = reply.json()
        assert body["object"] == "chat.completion" and body["model"] == MODEL_ID and body["id"]
        assert isinstance(body["created"], int)
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert as_scripted(choice["message"]) == turn
        assert all(CALL_ID.match(c["id"]) and c["type"] == "function" for c in choice["message"]["tool_calls"])
        usage = body["usage"]
        assert (
            usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        )
        answer_tools(messages, choice["message"])
    final = chat(client, messages).json()["choices"][0]
    assert final["finish_reason"] == "stop"
    assert final["message"]["content"] == "Done." and "tool_calls" not in final["message"]

    stats = client.get("/stats").json()
    assert stats["total"] == 4
    assert stats["by_outcome"] == {"tool_calls": 3, "final": 1}
    assert stats["conversations"] == {conversation_key(env.format_prompt(item)): [0, 1, 2, 3]}


def test_recognises_the_first_turn_of_every_task(client):
    cases = [("terminal_tasks", item, None) for item in envs.get_env("terminal_tasks").load_items(50)[:16]]
    cases += [
        ("echo_chain", Item(id="echo-98765", data={"steps": 9}), None),
        ("echo_chain", Item(id="echo-2"), {"steps": 2}),
    ]
    for env_name, item, config in cases:
        env = envs.get_env(env_name, config)
        first = [(c.name, c.arguments) for c in env.reference_solution(item)[0]]
        message = chat(client, opening(env_name, item, config)).json()["choices"][0]["message"]
        assert as_scripted(message) == first, item.id
    assert client.get("/stats").json()["by_outcome"] == {"tool_calls": len(cases)}


def test_echo_chain_of_any_length_is_played_to_the_end(client):
    item = Item(id="echo-424242", data={"steps": 6})
    messages = opening("echo_chain", item)
    commands = []
    while (message := chat(client, messages).json()["choices"][0]["message"]).get("tool_calls"):
        commands += [args["command"] for _, args in as_scripted(message)]
        answer_tools(messages, message)
    assert commands == [f"echo step-{k} | tee -a chain.log" for k in range(1, 7)]
    assert message["content"] == "Done."


def test_unknown_prompt_gets_a_plain_refusal(client):
    body = chat(client, [{"role": "user", "content": "Write me a sonnet about Temporal."}]).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert "do not know" in choice["message"]["content"]
    assert client.get("/stats").json()["by_outcome"] == {"unknown_task": 1}


def test_fail_next_answers_with_the_status_and_retry_after(client):
    assert client.post("/control", json={"fail_next": 2, "retry_after": 1.5}).json()["fail_next"] == 2
    messages = opening("terminal_tasks", Item(id="csv-to-json"))
    for _ in range(2):
        failed = chat(client, messages)
        assert failed.status_code == 503
        assert failed.headers["retry-after"] == "1.5"
        assert failed.json()["error"]["type"] == "server_error"
    assert chat(client, messages).status_code == 200
    assert client.get("/control").json()["fail_next"] == 0
    stats = client.get("/stats").json()
    assert stats["by_outcome"] == {"failed": 2, "tool_calls": 1}
    assert list(stats["conversations"].values()) == [[0, 0, 0]]


def test_fail_status_is_configurable_and_retry_after_optional(client):
    client.post("/control", json={"fail_next": 1, "fail_status": 429})
    failed = chat(client, opening("terminal_tasks", Item(id="csv-to-json")))
    assert failed.status_code == 429 and "retry-after" not in failed.headers


def test_fail_rate_is_random_but_reproducible_with_a_seed(client):
    messages = opening("echo_chain", Item(id="echo-1"))

    def pattern() -> list[int]:
        client.post("/control", json={"fail_rate": 0.5, "seed": 1234})
        return [chat(client, messages).status_code for _ in range(30)]

    first = pattern()
    assert set(first) == {200, 503}
    assert pattern() == first


def test_malformed_arguments_then_the_same_turn_again(client):
    client.post("/control", json={"malformed_next": 1})
    messages = opening("terminal_tasks", Item(id="fix-import-error"))
    broken = chat(client, messages).json()["choices"][0]["message"]
    arguments = broken["tool_calls"][0]["function"]["arguments"]
    assert arguments.startswith('{"command": ') and not arguments.endswith("}")
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    answer_tools(messages, broken)
    retried = chat(client, messages).json()["choices"][0]["message"]
    assert as_scripted(retried) == [("terminal", {"command": "python3 main.py 6 7"})]
    assert client.get("/stats").json()["by_outcome"] == {"malformed": 1, "tool_calls": 1}


def test_garbage_body_is_not_a_chat_completion(client):
    client.post("/control", json={"garbage_next": 1})
    messages = opening("terminal_tasks", Item(id="csv-to-json"))
    garbage = chat(client, messages)
    assert garbage.status_code == 200 and garbage.json() == {"oops": True}
    assert "choices" in chat(client, messages).json()


def test_unknown_tool_then_the_solution_resumes(client):
    client.post("/control", json={"unknown_tool_next": 1})
    messages = opening("terminal_tasks", Item(id="run-greet-script"))
    teleport = chat(client, messages).json()["choices"][0]
    assert teleport["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in teleport["message"]["tool_calls"]] == ["teleport"]
    answer_tools(messages, teleport["message"])
    resumed = chat(client, messages).json()["choices"][0]["message"]
    assert as_scripted(resumed)[0][0] == "terminal" and "chmod +x" in as_scripted(resumed)[0][1]["command"]
    assert list(client.get("/stats").json()["conversations"].values()) == [[0, 0]]


def test_delay_holds_each_reply(client):
    client.post("/control", json={"delay_s": 0.3})
    started = time.monotonic()
    assert chat(client, opening("echo_chain", Item(id="echo-3"))).status_code == 200
    assert time.monotonic() - started >= 0.3


def test_control_rejects_bad_settings_and_keeps_the_old_ones(client):
    client.post("/control", json={"fail_next": 3})
    assert client.post("/control", json={"fail_rate": 2.0}).status_code == 400
    assert client.post("/control", json={"explode": True}).status_code == 400
    assert client.post("/control", content=b"[1, 2]").status_code == 400
    assert client.get("/control").json()["fail_next"] == 3
    assert client.post("/control", json={"reset": True}).json()["fail_next"] == 0


def test_bad_request_is_a_400_and_counted(client):
    assert client.post("/v1/chat/completions", content=b"not json").status_code == 400
    assert client.post("/v1/chat/completions", json={"messages": "hi"}).status_code == 400
    stats = client.get("/stats").json()
    assert stats["by_outcome"] == {"bad_request": 2} and stats["total"] == 2
    client.post("/stats/reset")
    assert client.get("/stats").json() == {"total": 0, "by_outcome": {}, "conversations": {}}


async def raw_post(server: BackgroundServer, path: str, body: dict) -> tuple[int, dict]:
    """One HTTP/1.1 request on its own connection, without a client library's pool in the way."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    writer.write(head.encode() + data)
    response = await reader.read()
    writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


async def test_hundreds_of_concurrent_requests_wait_together(server, client):
    # Raw connections: one httpx pool with hundreds of live connections costs seconds on the client side.
    client.post("/control", json={"delay_s": 0.5})
    bodies = [{"messages": opening("echo_chain", Item(id=f"echo-{n}"))} for n in range(300)]
    started = time.monotonic()
    replies = await asyncio.gather(*(raw_post(server, "/v1/chat/completions", body) for body in bodies))
    elapsed = time.monotonic() - started
    assert all(status == 200 and reply["choices"][0]["finish_reason"] == "tool_calls" for status, reply in replies)
    assert elapsed < 3.0, f"300 requests delayed 0.5 s each took {elapsed:.1f} s: they are not served concurrently"
    assert len(client.get("/stats").json()["conversations"]) == 300


def test_command_line_entry_point_with_fault_flags():
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "temporal_rollouts.policy_servers.demo",
        "--port",
        str(port),
        "--fail-next",
        "1",
        "--retry-after",
        "2",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "the demo policy did not start"
                time.sleep(0.05)
        messages = opening("echo_chain", Item(id="echo-7"))
        failed = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages})
        assert failed.status_code == 503 and failed.headers["retry-after"] == "2"
        ok = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages}).json()
        assert as_scripted(ok["choices"][0]["message"]) == [("terminal", {"command": "echo step-1 | tee -a chain.log"})]
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()
