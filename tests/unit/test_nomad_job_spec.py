"""The Nomad job spec the backend registers: what keeps a crashed server's data, and the docker variant."""

from temporal_rollouts.core.sandbox_backends import NomadBackendConfig
from temporal_rollouts.sandbox.backends.nomad import job_spec


def test_raw_exec_runs_the_server_package_with_its_data_in_the_alloc_dir() -> None:
    spec = job_spec(NomadBackendConfig(datacenter="dc9", namespace="rl", cpu=700, memory=900), "rollouts-sandbox-3", 4, 1000, True)
    group = spec["TaskGroups"][0]
    task = group["Tasks"][0]
    assert spec["Datacenters"] == ["dc9"] and spec["Namespace"] == "rl"
    assert task["Driver"] == "raw_exec"
    args = task["Config"]["args"]
    assert args[:2] == ["-m", "temporal_rollouts.sandbox_server"]
    assert args[args.index("--root") + 1] == "${NOMAD_ALLOC_DIR}/data"
    assert args[args.index("--token-file") + 1] == "${NOMAD_SECRETS_DIR}/token"
    assert "--require-isolation" in args
    assert group["RestartPolicy"]["Attempts"] >= 1 and group["EphemeralDisk"]["Sticky"]
    assert task["Resources"] == {"CPU": 700, "MemoryMB": 900}
    assert 'nomadVar "nomad/jobs/rollouts-sandbox-3"' in task["Templates"][0]["EmbeddedTmpl"]


def test_docker_variant_maps_the_dynamic_port_to_the_image_port() -> None:
    spec = job_spec(NomadBackendConfig(driver="docker", image="reg/sbx:1", privileged=True), "rollouts-sandbox-0", 8, 1000, False)
    task = spec["TaskGroups"][0]["Tasks"][0]
    assert task["Config"]["image"] == "reg/sbx:1" and task["Config"]["privileged"] is True
    assert spec["TaskGroups"][0]["Networks"][0]["DynamicPorts"] == [{"Label": "http", "To": 8080}]
    assert task["Config"]["args"][:4] == ["--host", "0.0.0.0", "--port", "8080"]
