"""Bad workflow, activity and settings input is refused in plain words that name each field.

Pure checks of temporal_rollouts.core.inputs and the settings loader; the same inputs go
through the `temporal` CLI and a real worker in tests/integration/test_bad_input.py."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from temporalio.common import _type_hints_from_func
from temporalio.exceptions import ApplicationError

from activities.envs import EnvActivities, LoadItemsInput
from activities.sinks import results_path
from temporal_rollouts.core.errors import ConfigError, InvalidInput
from temporal_rollouts.core.inputs import parse_input
from temporal_rollouts.core.records import BatchInput, TrajectoryInput
from temporal_rollouts.core.settings import Settings

CASES = [
    ({"env": "terminal_tasks", "group_size": -3}, ["group_size: must be at least 1 (got -3)"]),
    ({"env": "terminal_tasks", "colour": "red"}, ["colour: unknown field (known fields: env, num_items"]),
    ({"env": "terminal_tasks", "num_items": "many"}, ["num_items: must be a whole number (got 'many')"]),
    ({"env": 7}, ["env: must be a string (got 7)"]),
    ({}, ["env: required but missing"]),
    ({"env": "echo_chain", "item_offset": 10**13}, ["item_offset: must be at most 1000000000000"]),
    (
        {"env": "echo_chain", "limits": {"max_turns": 0, "turbo": True}},
        ["limits.max_turns: must be at least 1 (got 0)", "limits.turbo: unknown field"],
    ),
    ({"env": "echo_chain", "sink": "s3"}, ["sink: must be one of 'jsonl' or 'atropos' (got 's3')"]),
    ([1, 2], ["expected a JSON object, got [1, 2]", "env required"]),
    (None, ["expected a JSON object, got None"]),
]


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_a_bad_batch_input_names_each_field(raw: Any, expected: list[str]) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_input(BatchInput, raw, "BatchWorkflow")
    message = caught.value.message
    assert message.startswith("invalid BatchWorkflow input")
    for part in expected:
        assert part in message, message
    assert "errors.pydantic.dev" not in message and "[type=" not in message


def test_a_good_input_parses_and_a_model_passes_through() -> None:
    assert parse_input(BatchInput, {"env": "echo_chain", "num_items": 3}, "x").num_items == 3
    model = TrajectoryInput(env="echo_chain", item={"id": "echo-1"})
    assert parse_input(TrajectoryInput, model, "x") is model


def test_invalid_input_is_a_non_retryable_config_error() -> None:
    err = InvalidInput("x")
    assert not err.retryable and err.stop_reason == "config_error"


def test_an_activity_sees_plain_json_and_refuses_a_bad_input_non_retryably() -> None:
    args, result = _type_hints_from_func(EnvActivities.load_items)
    assert result.__name__ == "LoadedItems"
    assert not args or args == [Any]  # the SDK decodes plain JSON, never the model
    activities = EnvActivities(Settings(data_dir="/tmp/unused"))
    with pytest.raises(ApplicationError) as caught:
        asyncio.run(activities.load_items({"env": "echo_chain", "count": "ten"}))
    assert caught.value.non_retryable and caught.value.type == "InvalidInput"
    assert "count: must be a whole number (got 'ten')" in caught.value.message
    loaded = asyncio.run(activities.load_items(LoadItemsInput(env="echo_chain", count=2, offset=5).model_dump()))
    assert [item.id for item in loaded.items] == ["echo-5", "echo-6"]


@pytest.mark.parametrize("name", ["/etc/passwd.jsonl", "../outside.jsonl", "sub/../../x.jsonl", ".", ""])
def test_an_output_outside_the_results_folder_is_refused(tmp_path, name: str) -> None:
    with pytest.raises(ConfigError, match="outside the results folder"):
        results_path(tmp_path / "results", name, "output")


def test_an_output_inside_the_results_folder_is_resolved_there(tmp_path) -> None:
    root = (tmp_path / "results").resolve()
    assert results_path(tmp_path / "results", "mine.jsonl", "output") == root / "mine.jsonl"
    assert results_path(tmp_path / "results", str(root / "a" / "b.jsonl"), "output") == root / "a" / "b.jsonl"


def test_a_symlink_out_of_the_results_folder_is_refused(tmp_path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "escape").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="outside the results folder"):
        results_path(tmp_path / "results", "escape/x.jsonl", "output")


def test_an_unknown_key_in_the_settings_file_names_the_key_and_the_file(tmp_path, monkeypatch) -> None:
    config = tmp_path / "rollouts.toml"
    config.write_text('data_dir = "x"\nmax_batch_rolouts = 5\n[sandbox]\nslots_per_containr = 3\n')
    monkeypatch.setenv("ROLLOUTS_CONFIG", str(config))
    for name in [k for k in os.environ if k.startswith("ROLLOUTS_") and k != "ROLLOUTS_CONFIG"]:
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError) as caught:
        Settings()
    message = str(caught.value)
    assert f"settings file {config}: max_batch_rolouts: unknown field" in message
    assert f"settings file {config}: sandbox.slots_per_containr: unknown field" in message
    assert "Traceback" not in message and "errors.pydantic.dev" not in message


def test_the_batch_limit_is_a_setting_with_a_default() -> None:
    assert Settings(data_dir="/tmp/unused").max_batch_rollouts == 1_000_000
    with pytest.raises(ConfigError, match="max_batch_rollouts: must be at least 1"):
        Settings(max_batch_rollouts=0)
    assert Settings(data_dir="/tmp/unused").max_batch_concurrency == 2_000
    with pytest.raises(ConfigError, match="max_batch_concurrency: must be at most 100000"):
        Settings(max_batch_concurrency=200_000)


def test_the_cli_refuses_a_bad_batch_with_the_workflows_words_before_connecting(capsys, monkeypatch, tmp_path) -> None:
    from temporal_rollouts.cli import main as cli

    async def no_server(*args, **kwargs):
        raise AssertionError("a bad batch must be refused before connecting")

    monkeypatch.setattr("temporal_rollouts.runtime.temporal.connect", no_server)
    monkeypatch.delenv("ROLLOUTS_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["batch", "--env", "terminal_tasks", "--offset", "10000000000000"]) == 1
    err = capsys.readouterr().err
    assert "error: invalid BatchWorkflow input:\nitem_offset: must be at most" in err and "10000000000000" in err


def test_every_activity_with_an_input_takes_plain_json_and_keeps_its_name() -> None:
    import importlib
    import inspect as inspect_module

    names = set()
    for module_name in ("envs", "llm", "resume", "sinks", "slots", "snapshots", "tools", "verify", "workspace"):
        module = importlib.import_module(f"activities.{module_name}")
        for _, cls in inspect_module.getmembers(module, inspect_module.isclass):
            if cls.__module__ != module.__name__:
                continue
            for _, method in inspect_module.getmembers(cls, inspect_module.isfunction):
                definition = getattr(method, "__temporal_activity_definition", None)
                if definition is None:
                    continue
                names.add(definition.name)
                args, _ = _type_hints_from_func(method)
                assert not args or args == [Any], f"{definition.name} would be decoded as {args} by the SDK"
    assert {
        "load_items",
        "acquire_slot",
        "release_slot",
        "setup_workspace",
        "llm_turn",
        "tool_call",
        "verify",
        "snapshot_workspace",
        "restore_workspace",
        "load_resume_point",
        "rollout_outcome",
        "await_rollout",
        "open_sink",
        "write_group",
    } <= names
