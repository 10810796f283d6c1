"""Envs from outside this project: installed packages' entry points, and plain modules.

A package declares its envs in the entry-point group `temporal_rollouts.envs`; the value is
a module (importing it registers its envs with `@register_env`) or an `Env` subclass
(registered as it is loaded):

    [project.entry-points."temporal_rollouts.envs"]
    countdown = "countdown_env:CountdownEnv"

Code that is not packaged is named in the settings' `env_modules` (or `--env-module`): a
module name on the import path, or a `.py` file. The worker, the CLI and the demo policy
all call `load_env_sources` with the same settings, so they know the same envs.

A source that fails to import or register is one line naming it and the error; the envs
of every other source stay usable. Each source is loaded once per process, however often
this is called.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from pydantic import BaseModel, ConfigDict

import envs  # noqa: F401  (the bundled envs register first, so a plugin cannot take their names)
from envs.base import Env
from envs.registry import EnvOrigin, loading, register_env
from temporal_rollouts.core.settings import is_file_module

ENTRY_POINT_GROUP = "temporal_rollouts.envs"


class SourceProblem(BaseModel):
    """A source whose envs could not be loaded, and why."""

    model_config = ConfigDict(frozen=True)

    source: str
    """What failed, as a user names it: `module my_env`, `entry point countdown = countdown_env:CountdownEnv`."""
    error: str

    def line(self) -> str:
        return f"env {self.source} failed to load: {self.error}"


_loaded: dict[str, SourceProblem | None] = {}
"""Every source tried in this process (by its description) -> its problem, None when it loaded."""


def load_env_sources(modules: Sequence[str] = ()) -> list[SourceProblem]:
    """Load every entry point of the group and the named modules (names or .py files) that this
    process has not loaded yet; returns the problems of all sources asked for, this time or before."""
    problems = [_load_entry_point(point) for point in entry_points(group=ENTRY_POINT_GROUP)]
    problems += [_load_module(module) for module in modules]
    return [problem for problem in problems if problem is not None]


def _load_entry_point(point: EntryPoint) -> SourceProblem | None:
    described = f"{point.name} = {point.value}"
    key = f"entry point {described}"
    if key not in _loaded:
        dist = f"{point.dist.name} {point.dist.version}" if point.dist is not None else None
        origin = EnvOrigin(kind="entry_point", source=described, distribution=dist)
        _loaded[key] = _attempt(key, origin, lambda: _register_loaded(point.load(), point.value))
    return _loaded[key]


def _register_loaded(loaded: object, value: str) -> None:
    """An entry point names a module (its import registered its envs) or an Env class (registered here)."""
    if isinstance(loaded, type) and issubclass(loaded, Env):
        register_env(loaded)
    elif not isinstance(loaded, type(sys)):
        raise TypeError(f"{value} is neither a module nor an Env subclass ({type(loaded).__name__})")


def _load_module(module: str) -> SourceProblem | None:
    key = f"module {module}"
    if key not in _loaded:
        origin = EnvOrigin(kind="module", source=module)
        _loaded[key] = _attempt(key, origin, lambda: _import(module))
    return _loaded[key]


def _import(module: str) -> None:
    if not is_file_module(module):
        importlib.import_module(module)
        return
    path = Path(module)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    name = path.stem
    if name in sys.modules:
        raise ImportError(f"a module named {name!r} is already imported; rename {path.name}")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # so its classes' __module__ resolves, as for any imported module
    folder = str(path.parent)
    if folder not in sys.path:  # its own helper modules beside it import as they do when it runs as a script
        sys.path.append(folder)
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[name]
        raise


def _attempt(key: str, origin: EnvOrigin, load) -> SourceProblem | None:
    try:
        with loading(origin):
            load()
    except Exception as err:  # any error of someone else's import: report it, keep the other envs
        return SourceProblem(source=key, error=_one_line(err))
    return None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
