"""What this machine must have before a worker starts local sandboxes, checked before anything starts.

A worker whose local backend starts sandbox servers that require isolation needs bubblewrap,
and bubblewrap that can build a sandbox here. Without it every rollout would start and stop
with `sandbox_error`; instead `rollouts demo` and `python worker.py` stop before starting
anything, with one line naming the command that fixes it. What only weakens a defence
(libseccomp missing: setuid bits are stripped after each command instead of refused) is a
warning, not a stop.
"""

from __future__ import annotations

import ctypes.util
import logging
import shutil
from pathlib import Path

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox_server.isolation.bubblewrap import bubblewrap_strategy
from temporal_rollouts.sandbox_server.limits.confinement import running_as_root

log = logging.getLogger(__name__)

USER_NAMESPACE_SWITCHES = {
    "kernel.unprivileged_userns_clone": ("0", "1"),
    "kernel.apparmor_restrict_unprivileged_userns": ("1", "0"),
    "user.max_user_namespaces": ("0", "15000"),
}
"""Kernel switches that keep an unprivileged bubblewrap from making its user namespace: (the value that does, a
value that does not)."""


def check_local_sandboxes(settings: Settings) -> None:
    """A ConfigError with one line naming the fix, when this worker would start local sandbox servers that
    require isolation and this machine cannot give it; a warning for what only weakens a defence."""
    sandbox = settings.sandbox
    if sandbox.backend.type != "local" or not sandbox.start_containers or not sandbox.require_isolation:
        return
    missing = isolation_problem()
    if missing is not None:
        raise ConfigError(missing)
    if not has_libseccomp():
        log.warning(
            "libseccomp2 is missing: sandboxes strip setuid bits after each command instead of refusing them (%s)",
            install_command("libseccomp2"),
        )


def isolation_problem() -> str | None:
    """Why sandboxes that require isolation cannot run here, as one line naming the fix; None when they can."""
    if shutil.which("bwrap") is None:
        packages = ["bubblewrap"] + ([] if has_libseccomp() else ["libseccomp2"])
        return (
            f"the sandbox needs bubblewrap, which is not installed: {install_command(*packages)} "
            "(or set sandbox.require_isolation = false to run commands UNISOLATED, for development only)"
        )
    if running_as_root() and shutil.which("setpriv") is None:
        return f"a root sandbox runs each slot as its own uid with setpriv, which is missing: {install_command('util-linux')}"
    if bubblewrap_strategy() is None:
        switch = next(
            (
                f"sysctl -w {name}={allowing}"
                for name, (refusing, allowing) in USER_NAMESPACE_SWITCHES.items()
                if _sysctl(name) == refusing
            ),
            None,
        )
        fix = f"allow unprivileged user namespaces (`{switch}`) or run as root" if switch else "run as root"
        return f"bubblewrap is installed but cannot build a sandbox here: {fix}"
    return None


def install_command(*packages: str) -> str:
    """The command that installs Debian `packages` on this machine (with sudo unless root)."""
    apt = shutil.which("apt-get")
    if apt is None:
        return f"install {', '.join(packages)} with your system's package manager"
    sudo = "" if running_as_root() else "sudo "
    return f"`{sudo}apt-get update && {sudo}apt-get install -y {' '.join(packages)}`"


def has_libseccomp() -> bool:
    return ctypes.util.find_library("seccomp") is not None


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None
