"""The cluster deployment files beside the compose stack, checked without a cluster: the Nomad
job's worker environment must be valid settings for the nomad backend (its sandbox jobs running
the image built from docker/sandbox.Dockerfile), and it must carry no secret values."""

from __future__ import annotations

import re

from temporal_rollouts.core.sandbox_backends import NomadBackendConfig
from temporal_rollouts.core.settings import Settings
from tests.support import REPO

NOMAD_JOB = REPO / "deploy" / "nomad" / "rollouts.nomad.hcl"

# What Nomad would put in place of its interpolations, for the check.
INTERPOLATED = {
    "var.temporal_address": "temporal.internal:7233",
    "var.s3_endpoint": "http://minio.internal:9000",
    "var.sandbox_image": "rollouts-sandbox:local",
    "var.datacenter": "dc1",
    "NOMAD_ALLOC_ID": "0b6f1c2e",
    "attr.unique.network.ip-address": "10.0.0.5",
}


def worker_env() -> dict[str, str]:
    text = NOMAD_JOB.read_text()
    block = re.search(r"\n      env \{\n(.*?)\n      \}", text, re.S)
    assert block, "the worker task has no env block"
    env = {}
    for name, raw in re.findall(r'^\s*(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*$', block.group(1), re.M):
        value = raw.replace('\\"', '"')
        env[name] = re.sub(r"\$\{([^}]+)\}", lambda m: INTERPOLATED[m.group(1)], value)
    return env


def test_the_nomad_workers_environment_is_valid_settings(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    env = worker_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    backend = settings.sandbox.backend
    assert isinstance(backend, NomadBackendConfig)
    assert backend.driver == "docker" and backend.image == "rollouts-sandbox:local"
    assert backend.address == "http://10.0.0.5:4646" and backend.token_env == "NOMAD_TOKEN"
    assert settings.temporal.address == "temporal.internal:7233"
    assert settings.storage.type == "s3" and settings.storage.endpoint_url == "http://minio.internal:9000"


def test_the_nomad_job_renders_every_secret_the_workers_read() -> None:
    text = NOMAD_JOB.read_text()
    env = worker_env()
    backend = NomadBackendConfig.model_validate_json(env["ROLLOUTS_SANDBOX__BACKEND"])
    for secret in (backend.secret_env, backend.token_env, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert secret not in env, f"{secret} must come from a Nomad Variable, not the job file"
        assert re.search(rf"^\s*{secret}=\{{\{{ \.\w+ \}}\}}$", text, re.M), f"{secret} is not rendered"
