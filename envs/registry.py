"""Env classes by name, so a batch can name its task family as plain data.

Env packages register themselves with `@register_env` when they are imported: the bundled
ones when `envs` is imported, others when `envs.sources` loads them (an entry point of the
`temporal_rollouts.envs` group, or a module the settings name). Activities turn the name a
workflow carries back into an env with `get_env`. Each name remembers where it came from,
for `rollouts envs` and for the error that names the known envs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from envs.base import Env
from temporal_rollouts.core.errors import UnknownEnv

EnvClass = TypeVar("EnvClass", bound=type[Env])


class EnvOrigin(BaseModel):
    """Where a registered env came from."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["bundled", "entry_point", "module"]
    source: str
    """The module (bundled, module), or the entry point as `name = value` (entry_point)."""
    distribution: str | None = None
    """The installed distribution that declares the entry point, with its version."""

    def describe(self) -> str:
        if self.kind == "bundled":
            return "bundled"
        if self.kind == "entry_point":
            return f"entry point {self.source}" + (f" ({self.distribution})" if self.distribution else "")
        return f"module {self.source}"


_ENVS: dict[str, type[Env]] = {}
_ORIGINS: dict[str, EnvOrigin] = {}
_loading: list[EnvOrigin] = []
"""The source being loaded now (innermost last): what a registration during its import came from."""


def register_env(cls: EnvClass) -> EnvClass:
    """Class decorator: make `cls` available under `cls.name`."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__} must set a non-empty class attribute `name`")
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise TypeError(f"{cls!r} is not a subclass of envs.base.Env")
    existing = _ENVS.get(name)
    if existing is not None and _qualified(existing) != _qualified(cls):
        raise ValueError(f"env name {name!r} is already taken by {_qualified(existing)}")
    _ENVS[name] = cls
    if existing is None or name not in _ORIGINS:
        _ORIGINS[name] = _origin_of(cls)
    return cls


def _origin_of(cls: type) -> EnvOrigin:
    if _loading:
        return _loading[-1]
    if cls.__module__.split(".")[0] == "envs":
        return EnvOrigin(kind="bundled", source=cls.__module__)
    return EnvOrigin(kind="module", source=cls.__module__)


@contextlib.contextmanager
def loading(origin: EnvOrigin) -> Iterator[None]:
    """Envs registered inside this block came from `origin` (`envs.sources` wraps each import in it)."""
    _loading.append(origin)
    try:
        yield
    finally:
        _loading.pop()


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def env_names() -> list[str]:
    return sorted(_ENVS)


def env_origin(name: str) -> EnvOrigin:
    """Where the registered env `name` came from (UnknownEnv when there is none)."""
    env_class(name)
    return _ORIGINS[name]


def env_class(name: str) -> type[Env]:
    try:
        return _ENVS[name]
    except KeyError:
        raise UnknownEnv(f"unknown env {name!r}; known envs: {', '.join(env_names()) or '(none)'}") from None


def get_env(name: str, config: dict[str, Any] | None = None) -> Env:
    """A fresh env of the family `name`, built with `config`."""
    return env_class(name)(config)
