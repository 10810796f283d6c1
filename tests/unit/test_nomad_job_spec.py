"""The Nomad job spec the backend registers: what keeps a crashed server's data, and the docker variant."""

from temporal_rollouts.core.sandbox_backends import NomadBackendConfig
from temporal_rollouts.sandbox.backends.nomad import job_spec
from temporal_rollouts.sandbox_server.config import ServerConfig, ServerOptions, SlotLimits

OPTIONS = ServerOptions(max_output_chars=1000, slot_uid_base=70000, limits=SlotLimits(memory_limit_mb=300, cpus=0.5))


def read_back(args: list[str], **filled: str) -> ServerConfig:
    """What the server makes of its job's args, once Nomad has filled in the placeholders."""
    for placeholder, value in filled.items():
        args = [arg.replace("${" + placeholder + "}", value) for arg in args]
    return ServerConfig.from_argv(args)


def test_raw_exec_runs_the_server_package_with_its_data_in_the_alloc_dir() -> None:
    four_slots = OPTIONS.model_copy(update={"slots_per_container": 4})
    spec = job_spec(
        NomadBackendConfig(datacenter="dc9", namespace="rl", cpu=700, memory=900), four_slots, "rollouts-sandbox-3"
    )
    group = spec["TaskGroups"][0]
    task = group["Tasks"][0]
    assert spec["Datacenters"] == ["dc9"] and spec["Namespace"] == "rl"
    assert task["Driver"] == "raw_exec"
    args = task["Config"]["args"]
    assert args[:2] == ["-m", "temporal_rollouts.sandbox_server"]
    assert args[args.index("--root") + 1] == "${NOMAD_ALLOC_DIR}/data"
    assert args[args.index("--token-file") + 1] == "${NOMAD_SECRETS_DIR}/token"
    assert "--require-isolation" in args
    served = read_back(
        args[2:], NOMAD_IP_http="10.0.0.7", NOMAD_PORT_http="23456", NOMAD_ALLOC_DIR="/a", NOMAD_SECRETS_DIR="/s"
    )
    assert served.options() == four_slots, "every server option reaches the job, slots, limits and uid range included"
    assert (served.host, served.port, served.slots_per_container) == ("10.0.0.7", 23456, 4)
    assert group["RestartPolicy"]["Attempts"] >= 1 and group["EphemeralDisk"]["Sticky"]
    assert task["Resources"] == {"CPU": 700, "MemoryMB": 900}
    assert 'nomadVar "nomad/jobs/rollouts-sandbox-3"' in task["Templates"][0]["EmbeddedTmpl"]


def test_docker_variant_maps_the_dynamic_port_to_the_image_port() -> None:
    options = OPTIONS.model_copy(update={"require_isolation": False})
    spec = job_spec(
        NomadBackendConfig(driver="docker", image="reg/sbx:1", privileged=True), options, "rollouts-sandbox-0"
    )
    task = spec["TaskGroups"][0]["Tasks"][0]
    assert task["Config"]["image"] == "reg/sbx:1" and task["Config"]["privileged"] is True
    assert spec["TaskGroups"][0]["Networks"][0]["DynamicPorts"] == [{"Label": "http", "To": 8080}]
    served = read_back(task["Config"]["args"], NOMAD_IP_http="10.0.0.7", NOMAD_ALLOC_DIR="/a", NOMAD_SECRETS_DIR="/s")
    assert (served.host, served.port) == ("0.0.0.0", 8080)
    assert served.options() == options and served.allowed_hosts == ["10.0.0.7"]


def test_docker_containers_of_one_host_claim_slot_uids_from_the_hosts_folder() -> None:
    spec = job_spec(NomadBackendConfig(driver="docker"), OPTIONS, "rollouts-sandbox-0")
    task = spec["TaskGroups"][0]["Tasks"][0]
    claims = str(read_back(task["Config"]["args"], NOMAD_IP_http="10.0.0.7").uid_claims_dir)
    # the same path on both sides: raw_exec servers on that host and other containers claim from it too
    assert task["Config"]["volumes"] == [f"{claims}:{claims}"]
    alone = job_spec(NomadBackendConfig(driver="docker", share_uid_claims=False), OPTIONS, "rollouts-sandbox-0")
    assert "volumes" not in alone["TaskGroups"][0]["Tasks"][0]["Config"]


def test_an_item_image_runs_under_docker_from_the_pushed_image_and_its_job_names_it() -> None:
    import pytest

    from temporal_rollouts.core.errors import ConfigError
    from temporal_rollouts.core.images import BuiltImage
    from temporal_rollouts.sandbox.backends.nomad import _image_of, _index_of, _key_of_id

    image = BuiltImage(key="c0ffee" * 10 + "abcd", name="localhost/rollouts/task:x", remote="reg.example:5000/r/task:y")
    docker = NomadBackendConfig(driver="docker", image="reg/sbx:1", job_prefix="sbx")
    spec = job_spec(docker, OPTIONS, f"sbx-{image.short}-0", image)
    task = spec["TaskGroups"][0]["Tasks"][0]
    assert task["Config"]["image"] == image.remote, "the task's image with the server's layer, as pushed"
    assert _image_of(spec) == BuiltImage(key=image.key, name=image.name, remote=image.remote)
    assert (_index_of(f"sbx-{image.short}-3", "sbx-"), _key_of_id(f"sbx-{image.short}-3", "sbx-")) == (3, image.short)
    assert (_index_of("sbx-3", "sbx-"), _key_of_id("sbx-3", "sbx-")) == (3, None)
    assert _index_of("sbx-other-3", "sbx-") is None, "another pool's job is not ours"
    with pytest.raises(ConfigError, match="docker driver"):
        job_spec(NomadBackendConfig(), OPTIONS, "rollouts-sandbox-0", image)
    with pytest.raises(ConfigError, match="pushed image"):
        job_spec(docker, OPTIONS, "sbx-0", image.model_copy(update={"remote": None}))
