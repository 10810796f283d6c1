"""An item image for Nomad's docker driver, for real: built, the sandbox server's layer added, pushed.

The registry is Debian's `docker-registry` (the distribution project's registry) on loopback, so the
push is a real push; the layered image is then run with podman to show the server starts inside it
from the layer alone (its Python, its requirements, its package), as the Nomad client's docker
driver would start it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from temporal_rollouts.core.images import ImageSpec
from tests.support.images import builder_on, needs_image_tools, write_context
from tests.support.servers.process import free_port

pytestmark = [
    pytest.mark.slow,  # builds an image and pushes it: about a minute
    needs_image_tools,
    pytest.mark.skipif(shutil.which("docker-registry") is None, reason="needs Debian's docker-registry"),
    pytest.mark.timeout(900),
]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'blobs'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: warn\n"
    )
    process = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


async def test_the_server_layer_goes_on_the_items_image_and_is_pushed_once(
    tmp_path: Path, store_dir: Path, registry: str
) -> None:
    context = write_context(
        tmp_path / "task",
        "FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y --no-install-recommends jq "
        "&& rm -rf /var/lib/apt/lists/*\nWORKDIR /task\n",
    )
    builder = builder_on(store_dir, registry_tls_verify=False)
    task = await builder.ready(ImageSpec(context=str(context), name="task"))
    published = await builder.publish(task, f"{registry}/rollouts")
    assert published.key == task.key, "slots are still matched by the task's own image"
    assert published.remote is not None and published.remote.startswith(f"{registry}/rollouts/task:")
    tags = httpx.get(f"http://{registry}/v2/rollouts/task/tags/list", timeout=10).json()["tags"]
    assert tags == [published.remote.rpartition(":")[2]]

    again = await builder.publish(task, f"{registry}/rollouts")
    assert again.remote == published.remote

    layered = f"localhost/rollouts-server/task:{published.remote.rpartition(':')[2]}"
    ran = await builder.store.run("podman", "run", "--rm", "--network=none", layered, "--help", timeout_s=120)
    assert ran.returncode == 0 and "A sandbox server" in ran.output, ran.output
    ran = await builder.store.run(
        "podman", "run", "--rm", "--network=none", "--entrypoint", "sh", layered, "-c", "jq --version; command -v bwrap"
    )
    assert "jq-" in ran.output and "/usr/bin/bwrap" in ran.output, "the task's own image, with bubblewrap added"
