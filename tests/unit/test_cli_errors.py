"""The CLI's errors are one or two lines naming the cause, with distinct exit codes. Every case
here fails before any connection is made, so no server runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from temporal_rollouts.cli import main as cli
from temporal_rollouts.core.settings import Settings


@pytest.fixture(autouse=True)
def clean_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("ROLLOUTS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ROLLOUTS_TEMPORAL__EMBEDDED_PORT", "1")  # nothing must be reached
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip()
    return code, err


def test_items_zero_is_a_usage_error_naming_the_flag(capsys) -> None:
    code, err = run(capsys, "batch", "--env", "terminal_tasks", "--items", "0")
    assert code == cli.EXIT_USAGE
    assert err.splitlines()[-1] == "rollouts batch: error: argument --items: must be at least 1, not 0"


def test_an_env_unknown_here_is_left_to_the_worker_with_one_notice(capsys) -> None:
    """A worker may know an env this command does not (another --env-module, another host's packages):
    the CLI says so and starts the batch, whose first step checks the name on the worker."""
    args = cli.build_parser().parse_args(["batch", "--env", "terminal_taks", "--items", "500"])
    batch = cli._batch_input(args, Settings())  # the items are not checked against an env it does not know
    assert (batch.env, batch.num_items) == ("terminal_taks", 500)
    assert capsys.readouterr().err.strip() == (
        "note: env 'terminal_taks' is not known to this command (did you mean 'terminal_tasks'?); "
        "the batch's first step checks it on the worker"
    )


def test_unknown_policy_names_the_known_ones(capsys) -> None:
    code, err = run(capsys, "batch", "--env", "echo_chain", "--policy", "gpt-nine")
    assert code == cli.EXIT_ERROR
    assert err == "error: unknown policy 'gpt-nine': use a base URL or one of ['demo']"


def test_a_typo_in_rollouts_toml_names_the_file_and_the_key(capsys, clean_shell: Path) -> None:
    (clean_shell / "rollouts.toml").write_text("[sandbox]\nslots_per_containr = 2\n")
    code, err = run(capsys, "list")
    assert code == cli.EXIT_ERROR
    assert err == f"error: settings file {clean_shell / 'rollouts.toml'}: sandbox.slots_per_containr: unknown field"


def test_a_wrong_value_in_rollouts_toml_names_the_key_and_value(capsys, clean_shell: Path) -> None:
    (clean_shell / "rollouts.toml").write_text('[sandbox]\nslots_per_container = "many"\n')
    code, err = run(capsys, "list")
    assert code == cli.EXIT_ERROR and "sandbox.slots_per_container" in err and "'many'" in err
    assert len(err.splitlines()) == 1


def test_broken_toml_is_named(capsys, clean_shell: Path) -> None:
    (clean_shell / "rollouts.toml").write_text("[sandbox\n")
    code, err = run(capsys, "list")
    assert code == cli.EXIT_ERROR and err.startswith(f"error: {clean_shell / 'rollouts.toml'}: not valid TOML")


def test_a_missing_config_file_named_explicitly_is_an_error(capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_CONFIG", "/nowhere/rollouts.toml")
    code, err = run(capsys, "list")
    assert (code, err) == (cli.EXIT_ERROR, "error: ROLLOUTS_CONFIG names '/nowhere/rollouts.toml', which is not a file")


def test_data_dir_is_taken_from_the_config_files_folder(clean_shell: Path, monkeypatch) -> None:
    project = clean_shell / "project"
    project.mkdir()
    (project / "rollouts.toml").write_text('data_dir = "state"\n')
    elsewhere = clean_shell / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("ROLLOUTS_CONFIG", str(project / "rollouts.toml"))
    assert Settings().data_dir == project / "state"
    monkeypatch.delenv("ROLLOUTS_CONFIG")
    monkeypatch.setenv("ROLLOUTS_DATA_DIR", "mine")
    assert Settings().data_dir == elsewhere / "mine"  # a relative folder named in the shell: the shell's


def test_the_default_data_dir_does_not_move_with_the_working_directory(clean_shell: Path, monkeypatch) -> None:
    """Unset, with no config file: the checkout's own `.rollouts`, from wherever a command runs."""
    checkout = Path(__file__).resolve().parents[2]
    seen = set()
    for folder in (clean_shell, clean_shell / "a" / "b", checkout / "docs"):
        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(folder)
        seen.add(Settings().data_dir)
    assert seen == {checkout / ".rollouts"}


def test_the_cli_decides_the_policy_when_the_batch_starts(clean_shell: Path) -> None:
    (clean_shell / "rollouts.toml").write_text(
        'default_policy = "mine"\n[policies.mine]\nbase_url = "http://model:8000/v1"\n'
    )
    args = cli.build_parser().parse_args(["batch", "--env", "echo_chain"])
    assert cli._batch_input(args, Settings()).policy == "mine"


def test_the_demo_batch_names_its_policy(clean_shell: Path) -> None:
    args = cli.build_parser().parse_args(["demo"])
    assert cli.demo_batch(args, Settings()).policy == "demo"


@pytest.mark.parametrize(("completed", "failed", "code"), [(4, 0, 0), (3, 1, 3), (0, 4, 4)])
def test_exit_codes_tell_succeeded_partial_and_failed_batches(completed: int, failed: int, code: int) -> None:
    assert cli.batch_exit_code(completed, failed) == code
    assert cli.status_exit_code({"status": "completed", "completed": completed, "failed": failed}) == code
    assert cli.status_exit_code({"status": "failed"}) == cli.EXIT_FAILED
    assert cli.status_exit_code({"status": "running"}) == cli.EXIT_OK


def test_policy_serve_passes_the_demo_policys_fault_flags(monkeypatch) -> None:
    seen = {}
    monkeypatch.setattr(cli, "cmd_policy_serve", lambda args, settings: seen.setdefault("rest", args.rest) and 0)
    assert cli.main(["policy", "serve", "--port", "9999", "--fail-rate", "0.5", "--delay-s", "1"]) == 0
    assert seen["rest"] == ["--fail-rate", "0.5", "--delay-s", "1"]


def test_unknown_flags_of_other_commands_are_usage_errors(capsys) -> None:
    code, err = run(capsys, "slots", "--fail-rate", "0.5")
    assert code == cli.EXIT_USAGE and err.endswith("error: unrecognized arguments: --fail-rate 0.5")


def test_a_typo_in_an_environment_variable_names_the_variable(capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_SANDBOX__SLOTS_PER_CONTANER", "3")
    code, err = run(capsys, "list")
    assert (code, err) == (
        cli.EXIT_ERROR,
        "error: environment variable ROLLOUTS_SANDBOX__SLOTS_PER_CONTANER: sandbox.slots_per_contaner: unknown field",
    )


def test_the_worker_reports_bad_settings_with_the_clis_exit_code(monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_SANDBOX__SLOTS_PER_CONTANER", "3")
    worker = Path(__file__).resolve().parents[2] / "worker.py"
    env = {**os.environ, "PYTHONPATH": str(worker.parent)}
    done = subprocess.run([sys.executable, str(worker)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == cli.EXIT_ERROR, done.stderr
    assert done.stderr.strip().endswith(
        "error: environment variable ROLLOUTS_SANDBOX__SLOTS_PER_CONTANER: sandbox.slots_per_contaner: unknown field"
    )


def test_items_past_the_task_set_are_refused_unless_asked_to_cycle(capsys) -> None:
    from envs.terminal_tasks import bundled_tasks

    count = len(bundled_tasks())
    code, err = run(capsys, "batch", "--env", "terminal_tasks", "--items", "500")
    assert (code, err) == (
        cli.EXIT_ERROR,
        f"error: num_items: 500 items from offset 0 run past the end of env "
        f"'terminal_tasks', which has {count} items: ask for at most {count}, or go "
        f"round the task set again with cycle_items (`rollouts batch --cycle`), "
        f"which repeats tasks",
    )
    code, err = run(capsys, "batch", "--env", "terminal_tasks", "--items", "3", "--offset", str(count - 2))
    assert code == cli.EXIT_ERROR and "ask for at most 2" in err
    args = cli.build_parser().parse_args(["batch", "--env", "terminal_tasks", "--items", "500", "--cycle"])
    assert cli._batch_input(args, Settings()).cycle_items is True
    code, err = run(capsys, "demo", "--items", "500")
    assert code == cli.EXIT_ERROR and "num_items: 500 items from offset 0 run past the end" in err


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`rollouts list | head`: once `head` has its lines, the command ends without a traceback."""
    probe = (
        "from temporal_rollouts.cli import main as cli\n"
        "def many_lines(argv=None):\n"
        "    for i in range(200_000):\n"
        "        print(f'batch-{i}')\n"
        "    return 0\n"
        "cli.main = many_lines\n"
        "cli.run()\n"
    )
    reader = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout.readline() == "batch-0\n"
    reader.stdout.close()  # as `head -1` does
    assert reader.wait(timeout=60) == cli.EXIT_PIPE_CLOSED
    assert reader.stderr.read() == ""
