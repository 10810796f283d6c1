"""Every HTTP server the project ships refuses to start beyond loopback without a key, checks the key in
constant time, and takes it from the environment, never the command line (`sandbox_server/http/keys.py`).
The CPU policy server also loads weights only from its weights folder.

The servers: the sandbox server (which always needs its token: tests/unit/test_sandbox_server*.py),
the demo policy, the CPU policy server and `rollouts view`."""

from __future__ import annotations

import hmac
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient
from temporalio.converter import DataConverter

from temporal_rollouts.policy_servers import cpu_generate, demo
from temporal_rollouts.sandbox_server.http import keys
from temporal_rollouts.sandbox_server.http.keys import KEY_QUERY, KeyRequired, key_from_env, require_key
from temporal_rollouts.view.app import KEY_COOKIE
from temporal_rollouts.view.app import create_app as view_app

KEY = "s3cret-key"
BEYOND_LOOPBACK = ["0.0.0.0", "::", "192.168.1.20", "10.0.0.5", "sandbox-host.example"]
LOOPBACK = ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"]


@pytest.mark.parametrize("host", BEYOND_LOOPBACK)
def test_no_server_starts_beyond_loopback_without_a_key(host: str) -> None:
    with pytest.raises(KeyRequired, match="--api-key-env"):
        require_key(host, None, "a server")
    require_key(host, KEY, "a server")


@pytest.mark.parametrize("host", LOOPBACK)
def test_a_loopback_server_may_run_without_a_key(host: str) -> None:
    require_key(host, None, "a server")


def test_the_key_comes_from_the_environment_and_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THE_KEY", f" {KEY}\n")
    assert key_from_env("THE_KEY") == KEY
    with pytest.raises(KeyRequired, match="THE_KEY"):
        key_from_env("THE_KEY")  # gone: the server's children never inherit it
    monkeypatch.setenv("EMPTY_KEY", "")
    with pytest.raises(KeyRequired, match="EMPTY_KEY"):
        key_from_env("EMPTY_KEY")
    assert key_from_env(None) is None


def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    with TestClient(demo.build_app(api_key=KEY), base_url="http://127.0.0.1") as http:
        assert http.get("/v1/models", headers={"Authorization": "Bearer s3cret-kez"}).status_code == 401
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert compared == [(b"s3cret-kez", KEY.encode()), (KEY.encode(), KEY.encode())]


def test_the_demo_policy_needs_its_key_on_every_route_but_health() -> None:
    with TestClient(demo.build_app(api_key=KEY, enable_control=True), base_url="http://127.0.0.1") as http:
        for path in ("/v1/models", "/stats"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
            assert http.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200, path
        assert http.post("/control", json={"fail_next": 5}).status_code == 401
        assert http.get("/health").status_code == 200
        assert http.get("/v1/models", params={KEY_QUERY: KEY}).status_code == 401, "only a page takes it in its address"
        assert http.get("/v1/models", headers={"Cookie": f"rollouts_view_key={KEY}"}).status_code == 401
        assert http.get("/v1/models", headers={"Authorization": f"bearer  {KEY} "}).status_code == 200


class RecordingSampler:
    """Stands for the model: what the routes under test touch (no route here generates)."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, str | None]] = []
        self.weight_version = "default"

    def update_weights(self, path: str, version: str | None) -> None:
        self.loaded.append((path, version))


def test_the_cpu_policy_server_needs_its_key_on_every_route_but_health() -> None:
    app = cpu_generate.create_app(RecordingSampler(), KEY)  # type: ignore[arg-type]
    with TestClient(app, base_url="http://127.0.0.1") as http:
        for path in ("/requests", "/get_weight_version"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200, path
        refused = http.post("/update_weights_from_disk", json={"model_path": "/tmp/x"})
        assert refused.status_code == 401
        assert http.get("/health").status_code == 200


def test_the_cpu_policy_server_loads_weights_only_from_its_folder(tmp_path: Path) -> None:
    """Without a key any local process could make it load other weights (and label every later token
    with the version it chose) or probe the disk as root; the folder bounds what a caller can name."""
    folder, outside = tmp_path / "checkpoints", tmp_path / "elsewhere"
    (folder / "step-1").mkdir(parents=True)
    outside.mkdir()
    (folder / "escape").symlink_to(outside)
    sampler = RecordingSampler()

    def update(app_folder: Path | None, model_path: str) -> dict:
        app = cpu_generate.create_app(sampler, weights_dir=app_folder)  # type: ignore[arg-type]
        with TestClient(app, base_url="http://127.0.0.1") as http:
            body = {"model_path": model_path, "weight_version": "7"}
            return http.post("/update_weights_from_disk", json=body).json()

    for path in (str(outside), f"{folder}/../elsewhere", str(folder / "escape"), "/etc/shadow", "/nonexistent"):
        answer = update(folder, path)
        assert not answer["success"] and "weights folder" in answer["message"], (path, answer)
    assert "--weights-dir" in update(None, str(folder / "step-1"))["message"]
    assert sampler.loaded == []
    assert update(folder, str(folder / "step-1"))["success"]
    assert update(folder, "step-1")["success"]  # relative: within the folder
    assert sampler.loaded == [(str(folder.resolve() / "step-1"), "7")] * 2


def test_the_view_takes_its_key_once_in_the_address_then_as_a_cookie() -> None:
    client = SimpleNamespace(data_converter=DataConverter.default)
    app = view_app(client, transcripts=None, key=KEY)  # type: ignore[arg-type]
    with TestClient(app, base_url="http://127.0.0.1") as http:
        assert http.get("/").status_code == 401
        assert http.get("/", params={KEY_QUERY: "wrong"}).status_code == 401
        assert http.get("/codec/decode").status_code == 401
        opened = http.get("/", params={KEY_QUERY: KEY})
        assert opened.status_code == 200 and f"{KEY_COOKIE}=" in opened.headers["set-cookie"]
        assert "HttpOnly" in opened.headers["set-cookie"] and "SameSite=Strict" in opened.headers["set-cookie"]
        assert http.get("/").status_code == 200  # the cookie the client kept
    with TestClient(app, base_url="http://127.0.0.1") as http:
        assert http.get("/", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_each_server_refuses_to_start_beyond_loopback_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before it binds anything, and for the CPU policy server before it loads the model."""
    from temporal_rollouts.view.serve import main as view

    monkeypatch.setattr(cpu_generate, "load_sampler", lambda *a: pytest.fail("the model was loaded"))
    before = set(threading.enumerate())  # not a count: a thread of an earlier test (or xdist's) may end meanwhile
    with pytest.raises(KeyRequired, match="the demo policy"):
        demo.main(["--host", "0.0.0.0", "--port", "0"])
    with pytest.raises(KeyRequired, match="the CPU policy server"):
        cpu_generate.main(["--host", "0.0.0.0"])
    with pytest.raises(KeyRequired, match="every local process"):
        cpu_generate.main(["--api-key", KEY])
    with pytest.raises(KeyRequired, match="rollouts view"):
        view(["--host", "0.0.0.0"])
    started = set(threading.enumerate()) - before
    assert not started, f"a server started threads before refusing: {started}"


@pytest.mark.parametrize(("command", "server"), [(["view"], "rollouts view"), (["policy", "serve"], "the demo policy")])
def test_the_rollouts_commands_that_serve_refuse_beyond_loopback_without_a_key(
    command: list[str], server: str, tmp_path: Path
) -> None:
    """`rollouts view` and `rollouts policy serve` run the server's own program in their place, which
    refuses before it loads or binds anything: one line, exit code 1."""
    env = {**os.environ, "ROLLOUTS_DATA_DIR": str(tmp_path)}
    env.pop("ROLLOUTS_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "temporal_rollouts.cli", *command, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert server in done.stderr and "--api-key-env" in done.stderr and "Traceback" not in done.stderr
