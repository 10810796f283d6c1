"""Item images as data: what an item may name, what a Dockerfile builds on, what the cache key covers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envs.base import Env, as_loaded
from temporal_rollouts.core.errors import BadItem, ConfigError, ImageBuildFailed
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.tasks import Item, Verdict
from temporal_rollouts.sandbox.images.build_network import build_network, parse_mirrors
from temporal_rollouts.sandbox.images.builder import slug
from temporal_rollouts.sandbox.images.context import context_key
from temporal_rollouts.sandbox.images.dockerfile import base_images, normalize


def test_an_image_names_a_context_or_a_reference_never_both_nor_neither() -> None:
    assert ImageSpec(context="/tasks/a").describe() == "build context /tasks/a"
    assert ImageSpec(reference="localhost/x:1").describe() == "image localhost/x:1"
    for bad in ({}, {"context": "/a", "reference": "b"}, {"context": "relative/a"}):
        with pytest.raises(ValueError):
            ImageSpec(**bad)
    with pytest.raises(ValueError, match="inside the build context"):
        ImageSpec(context="/a", dockerfile="../Dockerfile")
    with pytest.raises(ValueError):
        ImageSpec(context="/a", name="Not A Name")


def test_a_built_images_key_is_what_containers_are_matched_by() -> None:
    built = BuiltImage(key="ab" * 32, name="localhost/rollouts/x:" + "ab" * 32)
    assert built.short == "ab" * 6
    with pytest.raises(ValueError):
        BuiltImage(key="../etc", name="x")


def test_from_lines_are_read_as_the_dockerfile_reference_defines_them() -> None:
    text = "\n".join(
        [
            "# syntax=docker/dockerfile:1",
            "ARG BASE=debian",
            "ARG TAG",
            "FROM --platform=linux/amd64 ${BASE}:${TAG:-bookworm-slim} AS build",
            "RUN echo one \\",
            "    two",
            "FROM build AS again",
            "from python:3.11",
            "FROM scratch",
            "FROM localhost/mine",
            "FROM quay.io/org/tool@sha256:abc",
            "FROM $BASE:bookworm-slim",
        ]
    )
    assert base_images(text) == [
        "docker.io/library/debian:bookworm-slim",
        "docker.io/library/python:3.11",
        "localhost/mine:latest",
        "quay.io/org/tool@sha256:abc",
    ]
    assert base_images("ARG V=1\nFROM img:${V}", {"V": "2"}) == ["docker.io/library/img:2"]
    with pytest.raises(ValueError, match="no FROM"):
        base_images("RUN true")


def test_references_are_named_as_the_store_names_them() -> None:
    assert normalize("debian:bookworm-slim") == "docker.io/library/debian:bookworm-slim"
    assert normalize("debian") == "docker.io/library/debian:latest"
    assert normalize("user/image") == "docker.io/user/image:latest"
    assert normalize("localhost/x") == "localhost/x:latest"
    assert normalize("registry:5000/a/b") == "registry:5000/a/b:latest"
    assert normalize("ghcr.io/a/b:1") == "ghcr.io/a/b:1"


def _context(folder: Path) -> Path:
    (folder / "src").mkdir(parents=True)
    (folder / "Dockerfile").write_text("FROM debian:bookworm-slim\nCOPY src /src\n")
    (folder / "src" / "run.sh").write_text("echo hi\n")
    (folder / "src" / "link").symlink_to("run.sh")
    return folder


def test_the_cache_key_covers_content_modes_links_the_dockerfile_and_the_bases(tmp_path: Path) -> None:
    one, two = _context(tmp_path / "one"), _context(tmp_path / "two")
    key = context_key(one, "Dockerfile", ["base-1"])
    assert key == context_key(two, "Dockerfile", ["base-1"]), "the same content is the same image, wherever it is"
    assert key != context_key(one, "Dockerfile", ["base-2"]), "a re-bootstrapped base is a new image"
    assert key != context_key(one, "other/Dockerfile", ["base-1"])
    os.chmod(two / "src" / "run.sh", 0o755)
    assert context_key(two, "Dockerfile", ["base-1"]) != key, "COPY keeps modes"
    os.chmod(two / "src" / "run.sh", 0o644)
    (two / "src" / "link").unlink()
    (two / "src" / "link").symlink_to("/etc/passwd")
    assert context_key(two, "Dockerfile", ["base-1"]) != key, "a link's target is part of the content"
    (two / "src" / "link").unlink()
    (two / "src" / "link").symlink_to("run.sh")
    (two / "src" / "run.sh").write_text("echo bye\n")
    assert context_key(two, "Dockerfile", ["base-1"]) != key
    (two / "src" / "run.sh").write_text("echo hi\n")
    (two / "src" / "new").mkdir()
    assert context_key(two, "Dockerfile", ["base-1"]) != key, "an empty folder is content too"


def test_a_key_never_follows_a_link_out_of_the_context(tmp_path: Path) -> None:
    context = _context(tmp_path / "ctx")
    outside = tmp_path / "outside.txt"
    outside.write_text("one")
    (context / "out").symlink_to(outside)
    key = context_key(context, "Dockerfile")
    outside.write_text("two")
    assert context_key(context, "Dockerfile") == key


def test_tags_take_any_folder_name() -> None:
    assert slug("Fix Import-Error!") == "fix-import-error"
    assert slug("...") == "image"
    assert len(slug("x" * 200)) == 63


def test_mirror_hosts_are_host_and_port(tmp_path: Path) -> None:
    assert parse_mirrors(["Deb.Debian.org:80", "deb.debian.org:443", "pypi.org:443"]) == {
        "deb.debian.org": [80, 443],
        "pypi.org": [443],
    }
    for bad in ("deb.debian.org", ":80", "host:0", "host:http"):
        with pytest.raises(ConfigError, match="host:port"):
            parse_mirrors([bad])


async def test_the_open_build_networks_need_no_namespace() -> None:
    async with build_network("none", []) as network:
        assert network.buildah_args() == ["--network=none"]
    async with build_network("host", []) as network:
        assert network.buildah_args() == ["--network=host"]
    with pytest.raises(ConfigError, match="unknown mode"):
        async with build_network("bridge", []):
            pass


class ImageEnv(Env):
    name = "image_env_for_tests"

    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        return [
            Item(id="plain"),
            Item(id="data", data={"image": {"context": "/tasks/data", "build_timeout_s": 60}}),
            Item(id="set", image=ImageSpec(reference="localhost/x:1")),
        ][offset : offset + count]

    def format_prompt(self, item: Item) -> str:
        return item.id

    async def verify(self, item, slot, transcript) -> Verdict:
        return Verdict(score=0.0)


def test_an_env_names_an_image_per_item_through_its_data_or_its_hook() -> None:
    env = ImageEnv()
    plain, data, named = as_loaded(env, env.load_items(3))
    assert plain.image is None, "an item that names none runs as before"
    assert data.image == ImageSpec(context="/tasks/data", build_timeout_s=60)
    assert named.image == ImageSpec(reference="localhost/x:1")
    with pytest.raises(BadItem, match="names a bad image"):
        env.image(Item(id="bad", data={"image": {"context": "relative"}}))


def test_a_bad_context_is_the_items_build_failure(tmp_path: Path) -> None:
    from temporal_rollouts.sandbox.images.builder import _checked_context

    with pytest.raises(ImageBuildFailed, match="not a folder"):
        _checked_context(ImageSpec(context=str(tmp_path / "missing")))
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").symlink_to("/etc/hostname")
    with pytest.raises(ImageBuildFailed, match="no Dockerfile"):
        _checked_context(ImageSpec(context=str(tmp_path / "ctx")))


def test_the_image_tasks_each_name_a_build_context_and_the_plain_tasks_none() -> None:
    from envs import get_env

    image_tasks = get_env("image_tasks")
    items = as_loaded(image_tasks, image_tasks.load_items(image_tasks.item_count() or 0))
    assert {item.id for item in items} == {"sum-sales-by-region", "fix-median-with-pytest", "read-ledger-config"}
    for item in items:
        assert item.image is not None and item.image.name == item.id
        assert (Path(item.image.context or "") / "Dockerfile").is_file()
    plain = get_env("terminal_tasks")
    assert all(item.image is None for item in as_loaded(plain, plain.load_items(plain.item_count() or 0)))


async def test_builds_take_turns_on_a_host(tmp_path: Path) -> None:
    import asyncio

    from temporal_rollouts.sandbox.images.store import ImageStore

    store, other = ImageStore(tmp_path / "one"), ImageStore(tmp_path / "two")
    order: list[str] = []

    async def build(store: ImageStore, name: str, turns: int) -> None:
        async with store.build_turn(turns):
            order.append(f"{name} in")
            await asyncio.sleep(0.3)
            order.append(f"{name} out")

    if store.runroot.parent == other.runroot.parent:  # stores of one host share the turns
        await asyncio.gather(build(store, "a", 1), build(other, "b", 1))
        assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])
    order.clear()
    await asyncio.gather(build(store, "a", 2), build(store, "b", 2))
    assert order[:2] == ["a in", "b in"], "two turns: both at once"
