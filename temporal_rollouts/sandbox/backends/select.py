"""Build the backend that `sandbox.backend` names.

Each backend lives in its own module and is imported only when chosen, so a
local-only install needs neither python-nomad nor modal.
"""

from __future__ import annotations

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.base import SandboxBackend


def build_backend(settings: Settings) -> SandboxBackend:
    kind = settings.sandbox.backend.type
    if kind == "local":
        from temporal_rollouts.sandbox.backends.local import LocalBackend

        return LocalBackend.from_settings(settings)
    if kind == "static":
        from temporal_rollouts.sandbox.backends.static import StaticBackend

        return StaticBackend.from_settings(settings)
    if kind == "nomad":
        from temporal_rollouts.sandbox.backends.nomad import NomadBackend

        return NomadBackend.from_settings(settings)
    from temporal_rollouts.sandbox.backends.modal import ModalBackend

    return ModalBackend.from_settings(settings)
