"""Envs from outside the project: entry points of the `temporal_rollouts.envs` group and plain
modules (names or .py files) register beside the bundled envs, each with where it came from; a
source that fails is one line naming it and its error, and the other envs stay usable.

Entry points are listed by `importlib.metadata`; here that listing is replaced by EntryPoint
objects (the seam), and tests/e2e/test_write_an_env.py installs a real package instead."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import envs
from envs import registry, sources
from temporal_rollouts.core.errors import ConfigError, UnknownEnv
from temporal_rollouts.core.settings import Settings

ENV_CODE = """
from envs.base import Env, Item, Verdict
from envs.registry import register_env


{decorator}
class {cls}(Env):
    name = "{name}"

    def load_items(self, count, offset=0):
        return [Item(id=f"{name}-{{i}}") for i in range(offset, offset + count)]

    def format_prompt(self, item):
        return "do " + item.id

    async def verify(self, item, slot, transcript):
        return Verdict(score=1.0)
"""


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Each test registers into a copy of the registry, with its own loaded sources and import path."""
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
    monkeypatch.setattr(registry, "_ORIGINS", dict(registry._ORIGINS))
    monkeypatch.setattr(sources, "_loaded", {})
    monkeypatch.setattr(sources, "entry_points", lambda group: [])
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("plugin_"):
            del sys.modules[name]


def write_env(folder: Path, module: str, name: str, *, decorated: bool = True, cls: str = "PluginEnv") -> Path:
    path = folder / f"{module}.py"
    path.write_text(ENV_CODE.format(decorator="@register_env" if decorated else "", cls=cls, name=name))
    return path


def entry_points_of(monkeypatch: pytest.MonkeyPatch, *points: tuple[str, str]) -> None:
    listed = [EntryPoint(name, value, sources.ENTRY_POINT_GROUP) for name, value in points]
    monkeypatch.setattr(sources, "entry_points", lambda group: listed if group == sources.ENTRY_POINT_GROUP else [])


def test_a_py_file_registers_its_envs_as_a_module_source(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    path = write_env(tmp_path / "elsewhere", "plugin_file_env", "file_env")
    assert sources.load_env_sources([str(path)]) == []
    assert envs.get_env("file_env").load_items(1)[0].id == "file_env-0"
    origin = registry.env_origin("file_env")
    assert (origin.kind, origin.source, origin.describe()) == ("module", str(path), f"module {path}")
    assert registry.env_origin("terminal_tasks").describe() == "bundled"


def test_a_module_name_on_the_import_path_registers_its_envs(tmp_path: Path) -> None:
    write_env(tmp_path, "plugin_named", "named_env")
    assert sources.load_env_sources(["plugin_named"]) == []
    assert registry.env_origin("named_env").describe() == "module plugin_named"


def test_an_entry_point_to_a_class_registers_it_without_a_decorator(tmp_path, monkeypatch) -> None:
    write_env(tmp_path, "plugin_pkg", "packaged", decorated=False, cls="PackagedEnv")
    entry_points_of(monkeypatch, ("packaged", "plugin_pkg:PackagedEnv"))
    assert sources.load_env_sources() == []
    assert envs.get_env("packaged").load_items(1, offset=3)[0].id == "packaged-3"
    origin = registry.env_origin("packaged")
    assert (origin.kind, origin.source) == ("entry_point", "packaged = plugin_pkg:PackagedEnv")


def test_an_entry_point_to_a_module_registers_what_its_import_registers(tmp_path, monkeypatch) -> None:
    write_env(tmp_path, "plugin_mod", "from_module")
    entry_points_of(monkeypatch, ("anything", "plugin_mod"))
    assert sources.load_env_sources() == []
    assert registry.env_origin("from_module").describe() == "entry point anything = plugin_mod"


def test_a_source_that_fails_is_one_line_and_the_others_still_load(tmp_path, monkeypatch) -> None:
    (tmp_path / "plugin_broken.py").write_text("import no_such_dependency_of_a_plugin\n")
    write_env(tmp_path, "plugin_fine", "fine_env")
    (tmp_path / "plugin_syntax.py").write_text("def oops(:\n")
    entry_points_of(monkeypatch, ("broken", "plugin_broken:Env"), ("not_an_env", "os.path:join"))
    problems = sources.load_env_sources(["plugin_fine", "plugin_syntax", str(tmp_path / "missing.py")])
    lines = [problem.line() for problem in problems]
    assert lines[0] == (
        "env entry point broken = plugin_broken:Env failed to load: "
        "ModuleNotFoundError: No module named 'no_such_dependency_of_a_plugin'"
    )
    assert lines[1] == (
        "env entry point not_an_env = os.path:join failed to load: "
        "TypeError: os.path:join is neither a module nor an Env subclass (function)"
    )
    assert lines[2].startswith("env module plugin_syntax failed to load: SyntaxError: ")
    assert (
        lines[3]
        == f"env module {tmp_path / 'missing.py'} failed to load: FileNotFoundError: no such file: {tmp_path / 'missing.py'}"
    )
    assert all("\n" not in line for line in lines) and len(lines) == 4
    assert envs.get_env("fine_env") is not None and envs.get_env("terminal_tasks") is not None
    # asked again (a second command in the same process), the same problems, without importing again
    assert sources.load_env_sources(["plugin_fine", "plugin_syntax", str(tmp_path / "missing.py")]) == problems


def test_a_plugin_cannot_take_a_bundled_envs_name(tmp_path, monkeypatch) -> None:
    write_env(tmp_path, "plugin_clash", "terminal_tasks", decorated=False, cls="Impostor")
    entry_points_of(monkeypatch, ("terminal_tasks", "plugin_clash:Impostor"))
    [problem] = sources.load_env_sources()
    assert "env name 'terminal_tasks' is already taken by envs.terminal_tasks.env.TerminalTasksEnv" in problem.line()
    assert type(envs.get_env("terminal_tasks")).__name__ == "TerminalTasksEnv"
    assert registry.env_origin("terminal_tasks").describe() == "bundled"


def test_an_unknown_env_names_the_known_ones_with_plugins(tmp_path) -> None:
    write_env(tmp_path, "plugin_known", "known_plugin")
    sources.load_env_sources(["plugin_known"])
    with pytest.raises(UnknownEnv, match="known envs: .*known_plugin"):
        envs.get_env("nope")


def test_env_modules_come_from_a_comma_separated_variable_and_files_become_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROLLOUTS_ENV_MODULES", "my_pkg.envs, mine/add.py,")
    assert Settings().env_modules == ["my_pkg.envs", str(tmp_path / "mine" / "add.py")]


def test_env_modules_also_come_as_a_json_list_and_an_empty_one_names_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROLLOUTS_ENV_MODULES", '["my_pkg.envs", "mine/add.py"]')
    assert Settings().env_modules == ["my_pkg.envs", str(tmp_path / "mine" / "add.py")]
    monkeypatch.setenv("ROLLOUTS_ENV_MODULES", "[]")
    assert Settings().env_modules == []
    monkeypatch.setenv("ROLLOUTS_ENV_MODULES", '["unclosed"')
    with pytest.raises(ConfigError, match="ROLLOUTS_ENV_MODULES: .*neither a JSON list nor names separated by commas"):
        Settings()


def test_a_config_files_env_module_is_relative_to_the_file(tmp_path, monkeypatch) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "rollouts.toml").write_text('env_modules = ["add.py", "pkg.mod"]\n')
    monkeypatch.setenv("ROLLOUTS_CONFIG", str(tmp_path / "conf" / "rollouts.toml"))
    monkeypatch.delenv("ROLLOUTS_ENV_MODULES", raising=False)
    assert Settings().env_modules == [str(tmp_path / "conf" / "add.py"), "pkg.mod"]


def test_the_demo_policy_knows_the_tasks_of_the_modules_it_is_given(tmp_path: Path) -> None:
    from temporal_rollouts.policy_servers.demo import SolutionIndex

    path = tmp_path / "plugin_solved.py"
    path.write_text(
        ENV_CODE.format(decorator="@register_env", cls="SolvedEnv", name="solved")
        + "\n    def reference_solution(self, item):\n"
        + "        from envs.base import ScriptedCall\n"
        + "        return [[ScriptedCall(name='terminal', arguments={'command': 'echo ' + item.id})]]\n"
    )
    [[call]] = SolutionIndex([str(path)]).lookup("do solved-2")
    assert (call.name, call.arguments) == ("terminal", {"command": "echo solved-2"})


def test_a_worker_logs_one_line_for_a_source_that_fails_and_runs_on(tmp_path, caplog) -> None:
    from temporal_rollouts.runtime.worker import load_envs

    write_env(tmp_path, "plugin_ok", "ok_env")
    settings = Settings(env_modules=["plugin_missing_xyz", "plugin_ok"])
    with caplog.at_level("WARNING", logger="temporal_rollouts.worker"):
        load_envs(settings)
    assert [record.getMessage() for record in caplog.records] == [
        "env module plugin_missing_xyz failed to load: ModuleNotFoundError: No module named 'plugin_missing_xyz'; "
        "the worker runs without it"
    ]
    assert envs.get_env("ok_env") is not None
