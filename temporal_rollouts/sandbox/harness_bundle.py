"""A harness's Python packages as one folder a slot can use read-only: built by the worker with pip, once.

A slot has no network and sees only the system's folders and its workspace, so a harness that
needs packages (the openai client, mini-swe-agent) gets them as a bundle: `pip install --target`
of its requirements (resolved by pip, less the distributions the spec excludes), plus any modules
of installed packages it names, packed as a tar.gz named by a digest of what went into it. The
worker puts that into the slot's container's read-only cache (`Lease.share`: a no-op once there),
so each container receives it once and every slot of it shares it. Scripts in its `bin/` start
with `#!/usr/bin/env python3`, the slot's own Python.

The bundle is built for this worker's Python minor version, so the slot's `python3` must be the
same one (the local backend's slots run the host's). pip is the well-kept tool for this and reads
its own configuration: for an offline cluster set `PIP_NO_INDEX=1` and `PIP_FIND_LINKS=<wheelhouse>`
in the worker's environment. Built bundles are kept in `<data_dir>/harness-bundles`, one build at
a time per worker process (a lock per digest), so a batch's rollouts wait for the first one.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.harness import HarnessSpec

PIP_TIMEOUT_S = 900.0
SHEBANG = b"#!/usr/bin/env python3\n"
_CANONICAL = re.compile(r"[-_.]+")


def bundle_name(spec: HarnessSpec) -> str:
    """The cache entry's name: a digest of the requirements, the exclusions, the modules' code and the Python."""
    digest = hashlib.sha256()
    facts = {
        "requirements": spec.requirements,
        "exclude": sorted(canonical(name) for name in spec.exclude),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": os.uname().machine,
    }
    digest.update(json.dumps(facts, sort_keys=True).encode())
    for module in spec.modules:
        digest.update(module.encode() + b"\0" + module_file(module).read_bytes())
    return f"harness-{digest.hexdigest()[:24]}"


def canonical(name: str) -> str:
    return _CANONICAL.sub("-", name).lower()


def module_file(module: str) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None or not found.origin.endswith(".py"):
        raise ConfigError(f"harness module {module!r} is not a Python source file this worker has")
    return Path(found.origin)


class HarnessBundles:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._locks: dict[str, asyncio.Lock] = {}

    async def archive(self, spec: HarnessSpec) -> tuple[str, Path]:
        """(the cache entry's name, the tar.gz on this worker), built on first use."""
        name = bundle_name(spec)
        archive = self.folder / f"{name}.tar.gz"
        async with self._locks.setdefault(name, asyncio.Lock()):
            if not archive.exists():
                await asyncio.to_thread(self._build, spec, archive)
        return name, archive

    def _build(self, spec: HarnessSpec, archive: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.folder, prefix=".build-") as scratch:
            target = Path(scratch) / "bundle"
            target.mkdir()
            if spec.requirements:
                _pip_install(spec, target, Path(scratch))
            for module in spec.modules:
                _copy_module(module, target)
            _portable_scripts(target / "bin")
            packed = Path(scratch) / "bundle.tar.gz"
            with tarfile.open(packed, "w:gz", compresslevel=1) as tar:
                tar.add(target, arcname=".")
            os.replace(packed, archive)


def _pip_install(spec: HarnessSpec, target: Path, scratch: Path) -> None:
    """Resolve the requirements with pip, drop the excluded distributions, install the rest without
    resolving again (so an excluded one is not pulled back in as a dependency)."""
    report = scratch / "report.json"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    _run([*pip, "install", "--dry-run", "--ignore-installed", "--report", str(report), *spec.requirements])
    excluded = {canonical(name) for name in spec.exclude}
    pinned = []
    for entry in json.loads(report.read_text())["install"]:
        metadata = entry["metadata"]
        if canonical(metadata["name"]) not in excluded:
            pinned.append(f"{metadata['name']}=={metadata['version']}")
    _run([*pip, "install", "--no-deps", "--no-compile", "--target", str(target), *pinned])


def _run(argv: list[str]) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, timeout=PIP_TIMEOUT_S)
    except subprocess.CalledProcessError as err:
        said = (err.stderr or err.stdout or b"").decode(errors="replace").strip()[-2000:]
        raise ConfigError(f"building the harness bundle failed: {' '.join(argv[3:6])} ...: {said}") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"building the harness bundle took over {PIP_TIMEOUT_S:.0f}s") from None


def _copy_module(module: str, target: Path) -> None:
    """The module's file at its dotted path, each package above it an empty __init__.py (only the module
    travels, never the rest of its package)."""
    parts = module.split(".")
    folder = target
    for package in parts[:-1]:
        folder = folder / package
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").touch()
    shutil.copyfile(module_file(module), folder / f"{parts[-1]}.py")


def _portable_scripts(bin_folder: Path) -> None:
    """pip writes this worker's interpreter into each script's first line; the slot has its own."""
    if not bin_folder.is_dir():
        return
    for script in bin_folder.iterdir():
        if not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            script.write_bytes(SHEBANG + data.split(b"\n", 1)[1])
