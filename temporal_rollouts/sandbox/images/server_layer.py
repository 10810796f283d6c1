"""What the sandbox server adds to an item's image where the server runs inside it (Nomad, Modal).

A remote backend runs one sandbox server per container, and the container is the item's image,
so the server and what it needs go on top of that image. They are declared once here and
rendered two ways, so every backend adds the same things: as Dockerfile lines (`dockerfile`,
built with buildah and pushed for Nomad's docker driver) and as Modal image steps
(`modal_image`). The server needs Python 3.11 or newer (`python3` of the image, else a Python
a platform adds, as Modal's `add_python`), bubblewrap and libseccomp from the image's package
manager (Debian or Ubuntu: apt), its four requirements, and its own package alone: it imports
nothing else of the project. Everything goes under `/opt/rollouts`, which slots never see.

For a layer built here the requirements come as wheels the worker downloads once with its own
pip (`wheels`, for the Pythons an image may have), so the build needs only the Debian mirror:
no index, no TLS to PyPI from inside the build.
"""

from __future__ import annotations

import asyncio
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from temporal_rollouts.core.errors import SandboxUnreachable

SERVER_PACKAGE = Path(__file__).resolve().parents[2] / "sandbox_server"
SERVER_ROOT = "/opt/rollouts"
"""Where the server's package (`lib/`) and virtual environment (`venv/`) live in the image."""
SERVER_LIB = f"{SERVER_ROOT}/lib"
"""The folder holding the `temporal_rollouts` package (the server's alone): the server's import path."""
SERVER_PYTHON = f"{SERVER_ROOT}/venv/bin/python"
APT_PACKAGES = ("bubblewrap", "libseccomp2")
PYTHON_APT_PACKAGES = ("python3", "python3-venv")
REQUIREMENTS = ("uvicorn>=0.30", "starlette>=0.37", "pydantic>=2.7", "pyseccomp>=0.1.2")
MODAL_PYTHON = "3.11"
WHEEL_PYTHONS = ("3.11", "3.12", "3.13")
"""The Pythons an image's `python3` may be that the server runs on (3.11 or newer)."""


def server_command() -> list[str]:
    """The argv (before the server's own options) that starts the server in an image with this layer."""
    return [SERVER_PYTHON, "-m", "temporal_rollouts.sandbox_server"]


def dockerfile(base: str) -> str:
    """A Dockerfile that adds the server to image `base`; its context is `stage_context`'s folder."""
    apt = " ".join((*PYTHON_APT_PACKAGES, *APT_PACKAGES))
    requirements = " ".join(f'"{requirement}"' for requirement in REQUIREMENTS)
    return (
        f"FROM {base}\n"
        "USER root\n"
        f"RUN if command -v apt-get >/dev/null; then apt-get update && apt-get install -y --no-install-recommends {apt} "
        "&& rm -rf /var/lib/apt/lists/*; "
        'else echo "the sandbox server needs bubblewrap and Python 3.11+ and this image has no apt-get" >&2; exit 1; fi\n'
        f"COPY wheels {SERVER_ROOT}/wheels\n"
        f"RUN python3 -m venv {SERVER_ROOT}/venv && {SERVER_ROOT}/venv/bin/pip install --no-cache-dir --no-index "
        f"--disable-pip-version-check --find-links {SERVER_ROOT}/wheels {requirements} "
        # the package is found by the server's Python alone (a .pth in its venv), not by the image's
        f"&& echo {SERVER_LIB} > $({SERVER_ROOT}/venv/bin/python -c 'import site; print(site.getsitepackages()[0])')"
        "/temporal_rollouts.pth\n"
        f"COPY temporal_rollouts {SERVER_LIB}/temporal_rollouts\n"
        f'ENTRYPOINT ["{SERVER_PYTHON}", "-m", "temporal_rollouts.sandbox_server"]\n'
        "CMD []\n"
    )


def stage_context(folder: Path, base: str, wheels: Path) -> Path:
    """Write the build context of `dockerfile(base)` into `folder`: the server's package alone and the
    requirements' wheels (`wheels`)."""
    package = folder / "temporal_rollouts"
    for old in (package, folder / "wheels"):
        if old.exists():
            shutil.rmtree(old)
    shutil.copytree(wheels, folder / "wheels")
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copytree(SERVER_PACKAGE, package / "sandbox_server", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "Dockerfile").write_text(dockerfile(base))
    return folder


def modal_image(image: Any) -> Any:
    """The same layer as Modal image steps, on a Modal image that has a Python (`add_python`, or its own)."""
    return (
        image.apt_install(*APT_PACKAGES)
        .pip_install(*REQUIREMENTS)
        .add_local_dir(SERVER_PACKAGE, f"{SERVER_LIB}/temporal_rollouts/sandbox_server")
    )


async def wheels(cache: Path) -> Path:
    """A folder of the requirements' wheels for every `WHEEL_PYTHONS` on this machine's architecture,
    downloaded once by the worker's own pip (which reaches the index the worker is set up for)."""
    folder = cache / f"server-wheels-{platform.machine()}"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for version in WHEEL_PYTHONS:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(folder), "--only-binary=:all:"]
        argv += ["--python-version", version, "--implementation", "cp"]
        argv += ["--platform", f"manylinux2014_{platform.machine()}", *REQUIREMENTS]
        ran = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, check=False)
        if ran.returncode != 0:
            raise SandboxUnreachable(
                f"downloading the sandbox server's requirements for Python {version} failed: {ran.stderr.strip()[-500:]}"
            )
    done.write_text("")
    return folder
