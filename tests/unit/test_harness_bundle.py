"""A harness's bundle: what the worker packs for a slot, and how it is named."""

from __future__ import annotations

import asyncio
import tarfile
from pathlib import Path

from temporal_rollouts.core.harness import MINIMAL, HarnessSpec
from temporal_rollouts.sandbox.harness_bundle import HarnessBundles, bundle_name


def test_a_module_travels_alone_under_empty_package_files(tmp_path: Path) -> None:
    spec = HarnessSpec(command="python3 -m temporal_rollouts.harnesses.minimal", modules=MINIMAL.modules)
    name, archive = asyncio.run(HarnessBundles(tmp_path).archive(spec))
    assert name == bundle_name(spec) and name.startswith("harness-")
    with tarfile.open(archive) as tar:
        files = {member.name.removeprefix("./"): member for member in tar.getmembers() if member.isfile()}
        assert set(files) == {
            "temporal_rollouts/__init__.py",
            "temporal_rollouts/harnesses/__init__.py",
            "temporal_rollouts/harnesses/minimal.py",
        }
        assert files["temporal_rollouts/__init__.py"].size == 0, "never the package's own code"
        source = tar.extractfile(files["temporal_rollouts/harnesses/minimal.py"]).read()
    assert b"from openai import OpenAI" in source


def test_the_name_changes_with_what_goes_in() -> None:
    base = HarnessSpec(command="x", requirements=["openai==1.0"])
    assert bundle_name(base) == bundle_name(HarnessSpec(command="other command", requirements=["openai==1.0"]))
    assert bundle_name(base) != bundle_name(HarnessSpec(command="x", requirements=["openai==1.1"]))
    assert bundle_name(base) != bundle_name(HarnessSpec(command="x", requirements=["openai==1.0"], exclude=["jiter"]))
