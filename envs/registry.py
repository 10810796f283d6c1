"""Env classes by name, so a batch can name its task family as plain data.

Env packages register themselves with `@register_env` when `envs` is imported;
activities turn the name a workflow carries back into an env with `get_env`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from envs.base import Env
from temporal_rollouts.core.errors import UnknownEnv

_ENVS: dict[str, type[Env]] = {}

EnvClass = TypeVar("EnvClass", bound=type[Env])


def register_env(cls: EnvClass) -> EnvClass:
    """Class decorator: make `cls` available under `cls.name`."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__} must set a non-empty class attribute `name`")
    existing = _ENVS.get(name)
    if existing is not None and _qualified(existing) != _qualified(cls):
        raise ValueError(f"env name {name!r} is already taken by {_qualified(existing)}")
    _ENVS[name] = cls
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def env_names() -> list[str]:
    return sorted(_ENVS)


def get_env(name: str, config: dict[str, Any] | None = None) -> Env:
    """A fresh env of the family `name`, built with `config`."""
    try:
        cls = _ENVS[name]
    except KeyError:
        raise UnknownEnv(f"unknown env {name!r}; known envs: {', '.join(env_names()) or '(none)'}") from None
    return cls(config)
