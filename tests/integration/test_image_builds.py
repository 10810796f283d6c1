"""Building item images for real: buildah on a store of the test's own, Debian's base bootstrapped.

Builds are cached by content and happen once however many ask at once; a failing Dockerfile, an
unknown base image and a build past its timeout each fail the way a rollout can record; and a
build's RUN steps reach the package mirror and nothing else (the same probe reaches this host
with `build_network = "host"`, which shows the probe can see a way out when there is one).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import pytest

from temporal_rollouts.core.errors import ImageBuildFailed, ImageBuildTimedOut, UnknownBaseImage
from temporal_rollouts.core.images import ImageSpec
from tests.support.images import builder_on, needs_image_tools, unmount_under, write_context
from tests.support.sandbox import processes_running, unique_sleep

# slow: each test builds an image (5-25 s)
pytestmark = [pytest.mark.slow, needs_image_tools, pytest.mark.timeout(600)]

APT_JQ = (
    "FROM debian:bookworm-slim\n"
    "RUN apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*\n"
    "WORKDIR /task\n"
    "ENV TASK=jq\n"
)


async def test_one_content_builds_once_however_many_ask_and_then_never_again(tmp_path: Path, store_dir: Path) -> None:
    context = write_context(tmp_path / "jq-task", APT_JQ)
    spec = ImageSpec(context=str(context), name="jq-task")
    builder = builder_on(store_dir)
    first = await asyncio.gather(*(builder.ready(spec) for _ in range(4)))
    assert sum(image.built for image in first) == 1, "concurrent rollouts of one task build it once"
    assert len({(image.key, image.image_id) for image in first}) == 1
    built = next(image for image in first if image.built)
    assert built.build_s > 0 and built.name == f"localhost/rollouts/jq-task:{built.key}"
    assert built.config.workdir == "/task" and "TASK=jq" in built.config.env
    assert any(line.startswith("PATH=") for line in built.config.env)

    again = await builder_on(store_dir).ready(spec)  # a second batch, another worker process
    assert (again.built, again.build_s, again.image_id) == (False, 0.0, built.image_id)
    other_host = builder_on(tmp_path / "other-store")
    try:
        base = "docker.io/library/debian:bookworm-slim"
        assert await other_host.bases.ensure(base, "test") == await builder.bases.ensure(base, "test")
    finally:
        unmount_under(tmp_path / "other-store")

    (context / "notes.txt").write_text("a file more is another image\n")
    changed = await builder.ready(spec)
    assert changed.built and changed.key != built.key


async def test_a_failing_dockerfile_fails_for_good_with_the_build_logs_tail(tmp_path: Path, store_dir: Path) -> None:
    context = write_context(tmp_path / "broken", "FROM debian:bookworm-slim\nRUN echo the-step-said-why && exit 3\n")
    with pytest.raises(ImageBuildFailed) as failed:
        await builder_on(store_dir).ready(ImageSpec(context=str(context)))
    assert not failed.value.retryable
    assert failed.value.stop_reason == "image_build_failed"
    assert "the-step-said-why" in failed.value.message and "status" in failed.value.message


async def test_an_unknown_base_image_is_refused_in_one_line_that_says_how_to_provide_it(
    tmp_path: Path, store_dir: Path
) -> None:
    context = write_context(tmp_path / "py", "FROM python:3.11-slim\nRUN true\n")
    with pytest.raises(UnknownBaseImage) as refused:
        await builder_on(store_dir).ready(ImageSpec(context=str(context)))
    message = refused.value.message
    assert "\n" not in message
    assert "docker.io/library/python:3.11-slim" in message and str(context / "Dockerfile") in message
    assert "rollouts images load" in message and "debian:bookworm-slim" in message
    with pytest.raises(UnknownBaseImage, match="named by item 'x'"):
        await builder_on(store_dir).ready(ImageSpec(reference="localhost/nowhere:1"), "item 'x'")


async def test_a_build_past_its_timeout_is_stopped_whole(tmp_path: Path, store_dir: Path) -> None:
    marker = unique_sleep()
    context = write_context(tmp_path / "slow", f"FROM debian:bookworm-slim\nRUN sleep {marker}\n")
    with pytest.raises(ImageBuildTimedOut) as timed_out:
        await builder_on(store_dir).ready(ImageSpec(context=str(context), build_timeout_s=3))
    assert timed_out.value.retryable, "a slow mirror may be to blame: tried once more"
    await asyncio.sleep(1)
    assert processes_running(f"sleep {marker}") == []


def _host_address() -> str:
    """This host's own address on its way out (not loopback)."""
    route = subprocess.run(["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True, check=False)
    words = route.stdout.split()
    return words[words.index("src") + 1] if "src" in words else "127.0.0.1"


PROBE = (
    "FROM debian:bookworm-slim\n"
    # the mirror answers (apt over the relay), by name
    "RUN apt-get update >/dev/null && echo PROBE-MIRROR-OK || echo PROBE-MIRROR-FAILED\n"
    # this host's services: its loopback (the build's own is empty) and its address
    "RUN (exec 3<>/dev/tcp/{address}/{port}) 2>/dev/null && echo PROBE-HOST-REACHED || echo PROBE-HOST-BLOCKED\n"
    "RUN (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo PROBE-LOOPBACK-REACHED || echo PROBE-LOOPBACK-BLOCKED\n"
    # any other name
    "RUN getent hosts example.com >/dev/null && echo PROBE-NAME-RESOLVED || echo PROBE-NAME-UNRESOLVED\n"
)


@pytest.mark.parametrize("mode", ["mirror", "host"])
async def test_a_builds_run_steps_reach_the_mirror_and_nothing_else(tmp_path: Path, store_dir: Path, mode: str) -> None:
    with socket.create_server(("0.0.0.0", 0), backlog=16) as listener:
        port = listener.getsockname()[1]
        dockerfile = PROBE.format(address=_host_address(), port=port) + f"LABEL mode={mode}\n"
        context = write_context(tmp_path / "probe", dockerfile)
        builder = builder_on(store_dir, build_network=mode)
        built = await builder.ready(ImageSpec(context=str(context), name="probe"))
    log = next((store_dir / "logs").glob(f"probe-{built.key[:12]}*.log")).read_text()
    assert "PROBE-MIRROR-OK" in log
    if mode == "mirror":
        assert "PROBE-HOST-BLOCKED" in log and "PROBE-LOOPBACK-BLOCKED" in log and "PROBE-NAME-UNRESOLVED" in log
    else:  # the same probe sees the way out when there is one
        assert "PROBE-HOST-REACHED" in log and "PROBE-LOOPBACK-REACHED" in log


async def test_a_link_in_the_context_that_points_out_copies_nothing_from_outside(
    tmp_path: Path, store_dir: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-do-not-copy\n")
    context = write_context(tmp_path / "links", "FROM debian:bookworm-slim\nCOPY leak /leak\nRUN cat /leak || true\n")
    (context / "leak").symlink_to(secret)
    try:
        built = await builder_on(store_dir).ready(ImageSpec(context=str(context), name="links"))
    except ImageBuildFailed as failed:  # buildah resolves the link inside the context, where it leads nowhere
        assert "host-secret-do-not-copy" not in failed.message
        return
    log = next((store_dir / "logs").glob(f"links-{built.key[:12]}*.log")).read_text()
    assert "host-secret-do-not-copy" not in log


async def test_a_base_image_provided_as_the_refusal_says_is_then_built_on(tmp_path: Path, store_dir: Path) -> None:
    """The refusal's advice works: a `podman save` archive of the base, loaded into the store."""
    context = write_context(tmp_path / "on-python", "FROM python:3.11-slim\nRUN echo built-on-the-loaded-base\n")
    spec = ImageSpec(context=str(context), name="on-python")
    other = tmp_path / "other-store"
    try:
        donor = builder_on(other)
        base = await donor.ready(ImageSpec(reference="debian:bookworm-slim"))
        await donor.store.checked("podman", "tag", base.name, "docker.io/library/python:3.11-slim")
        archive = tmp_path / "python.tar"
        await donor.store.checked("podman", "save", "--output", str(archive), "docker.io/library/python:3.11-slim")
    finally:
        unmount_under(other)
    builder = builder_on(store_dir)
    with pytest.raises(UnknownBaseImage):
        await builder.ready(spec)
    assert "docker.io/library/python:3.11-slim" in await builder.store.load(archive)
    built = await builder.ready(spec)
    assert built.built
    listed = {name for image in await builder.store.listing() for name in image.get("Names") or []}
    assert {"docker.io/library/python:3.11-slim", built.name} <= listed
