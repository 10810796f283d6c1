"""docker-compose.yml checked without a Docker engine: against the Compose specification's JSON
schema, and for what the stack relies on to come up the first time (jobs that wait and fail
loudly, workers that can be scaled and restart, sandbox servers unprivileged with limits and
listed for the static backend, the embedded server's tuning, pinned images)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml

from temporal_rollouts.core import search_attributes
from temporal_rollouts.core.sandbox_backends import StaticBackendConfig
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import DYNAMIC_CONFIG
from temporal_rollouts.sandbox_server.config import ServerConfig
from tests.support import REPO
from tests.support.compose import compose_spec_schema, load_compose

COMPOSE = load_compose()
SERVICES = COMPOSE["services"]


def interpolated(value: str) -> str:
    """Compose's `${NAME:-default}` with no such variable set: the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def environment(service: str) -> dict[str, str]:
    return {name: interpolated(str(value)) for name, value in SERVICES[service]["environment"].items()}


def sandbox_services() -> list[str]:
    return sorted(
        name for name, service in SERVICES.items() if "SANDBOX_CONTAINER_ID" in service.get("environment", {})
    )


def test_the_file_follows_the_compose_specification() -> None:
    schema = compose_spec_schema()
    if schema is None:
        pytest.skip("the Compose JSON schema is neither installed nor downloadable (docker-compose 1.29.2 wheel)")
    jsonschema.Draft201909Validator(schema).validate(COMPOSE)


def test_the_schema_check_catches_a_mistake() -> None:
    schema = compose_spec_schema()
    if schema is None:
        pytest.skip("the Compose JSON schema is neither installed nor downloadable")
    broken = json.loads(json.dumps(COMPOSE))
    broken["services"]["worker"]["restart_policy"] = "on-failure"
    with pytest.raises(jsonschema.ValidationError, match="restart_policy"):
        jsonschema.Draft201909Validator(schema).validate(broken)


def test_workers_scale_wait_for_the_jobs_and_restart() -> None:
    worker = SERVICES["worker"]
    assert "container_name" not in worker and "ports" not in worker, "docker compose up --scale worker=3 needs neither"
    assert worker["restart"] == "on-failure"
    waits = {name: dep["condition"] for name, dep in worker["depends_on"].items()}
    assert waits["search-attributes"] == waits["bucket"] == "service_completed_successfully"
    data_dir = environment("worker")["ROLLOUTS_DATA_DIR"]
    named = [v.split(":") for v in worker["volumes"]]
    assert any(source in COMPOSE["volumes"] and target == data_dir for source, target, *_ in named)


def test_the_worker_environment_is_valid_settings(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in environment("worker").items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.temporal.address == "temporal:7233" and not settings.embedded
    assert settings.storage.type == "s3" and settings.storage.s3_addressing_style == "path"
    assert settings.storage.endpoint_url == "http://minio:9000"
    backend = settings.sandbox.backend
    assert isinstance(backend, StaticBackendConfig)
    listed = {server.container_id: server.url for server in backend.servers}
    assert sorted(listed) == sandbox_services()
    for name in sandbox_services():
        assert environment(name)["SANDBOX_CONTAINER_ID"] == name and listed[name].startswith(f"http://{name}:")
        assert environment(name)["ROLLOUTS_SANDBOX_SECRET"] == environment("worker")[backend.secret_env]
        served = ServerConfig.from_argv([*SERVICES[name]["command"], "--token-env", "SANDBOX_TOKEN"], environment(name))
        assert served.slots_per_container == settings.sandbox.slots_per_container
        assert listed[name].endswith(f":{served.port}")
        assert served.options() == settings.sandbox.options(), "a sandbox service runs what the workers' settings say"
    assert settings.sandbox.max_containers == len(listed)
    policy_port = SERVICES["policy"]["command"][SERVICES["policy"]["command"].index("--port") + 1]
    assert settings.default_policy == f"http://policy:{policy_port}/v1"


def test_sandbox_servers_run_unprivileged_with_limits() -> None:
    for name in sandbox_services():
        service = SERVICES[name]
        assert service["build"]["dockerfile"] == "docker/sandbox.Dockerfile"
        assert not service.get("privileged") and service["user"] not in ("root", "0")
        assert service["cap_drop"] == ["ALL"] and not service.get("cap_add")
        served = ServerConfig.from_argv([*service["command"], "--token-env", "SANDBOX_TOKEN"], environment(name))
        limits = served.limits
        assert limits.memory_limit_mb > 0 and limits.max_processes > 0 and limits.cpus > 0 and limits.disk_limit_mb > 0
        assert served.require_isolation, "sandbox commands must not run unisolated"
        assert service["entrypoint"] == ["sandbox-entrypoint"]
    users = [SERVICES[name]["user"].split(":")[0] for name in sandbox_services()]
    assert len(set(users)) == len(users), (
        "each sandbox container runs as a uid of its own (process limits count per uid)"
    )


def test_jobs_fail_loudly() -> None:
    for name in ("search-attributes", "bucket"):
        assert SERVICES[name]["restart"] == "on-failure"
        script = REPO / SERVICES[name]["volumes"][0].split(":")[0]
        text = script.read_text()
        assert "set -eu" in text and "exit 1" in text and "|| true\n" not in text.replace(">&2 || true", "")
    assert "|| true" not in yaml.safe_dump(COMPOSE)


def test_every_search_attribute_is_registered_with_its_type() -> None:
    listed = environment("search-attributes")["ROLLOUT_SEARCH_ATTRIBUTES"].split()
    expected = [flag for flag in search_attributes.dev_server_flags() if flag != "--search-attribute"]
    assert sorted(listed) == sorted(expected)


def test_temporal_gets_the_embedded_servers_tuning() -> None:
    temporal = SERVICES["temporal"]
    source, target, _ = temporal["volumes"][0].split(":")
    assert target.endswith(environment("temporal")["DYNAMIC_CONFIG_FILE_PATH"])
    config = yaml.safe_load((REPO / source).read_text())
    assert DYNAMIC_CONFIG
    for key, value in DYNAMIC_CONFIG.items():
        assert config[key] == [{"value": value}]


def test_images_are_pinned() -> None:
    for name, service in SERVICES.items():
        if "image" in service and "build" not in service:
            image = service["image"]
            assert ":" in image and not image.endswith((":latest", ":main")), f"{name}: {image} is not pinned"
    for dockerfile in (REPO / "Dockerfile", REPO / "docker" / "sandbox.Dockerfile"):
        bases = re.findall(r"^FROM (\S+)", dockerfile.read_text(), re.M)
        assert bases and all(re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base) for base in bases), bases


def test_images_leave_local_state_out() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".rollouts", "**/__pycache__"} <= ignored
    sandbox = (REPO / "docker" / "sandbox.Dockerfile").read_text()
    copied = re.findall(r"^COPY (\S+)", sandbox, re.M)
    assert copied == [
        "temporal_rollouts/__init__.py",
        "temporal_rollouts/sandbox_server",
        "docker/sandbox-entrypoint.sh",
    ]


def test_the_scripts_parse_and_refuse_a_missing_setting() -> None:
    import subprocess

    scripts = [REPO / "docker" / "sandbox-entrypoint.sh", *sorted((REPO / "docker" / "compose").glob("*.sh"))]
    for script in scripts:
        assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0, script
        done = subprocess.run(["sh", str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
        assert done.returncode != 0 and "is not set" in done.stderr, (script, done.stderr)


def test_the_sandbox_entrypoint_refuses_a_short_pool_secret() -> None:
    import subprocess
    import sys

    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "SANDBOX_CONTAINER_ID": "sandbox-0",
        "ROLLOUTS_SANDBOX_SECRET": "short",
    }
    done = subprocess.run(
        ["sh", str(REPO / "docker" / "sandbox-entrypoint.sh")], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "at least 16 characters" in done.stderr
