"""The `swe_smith` env: fix a bug in a real Python repository until its failing tests pass.

Items carry only the instance id; every hook looks the instance up in the dataset file, so
Temporal histories stay small however many tests an instance names. Setup and grading run
in the slot (`envs.swe_smith.grading`); the worker only packs the repository and reads the
pytest summaries back.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from envs.base import Env, SlotHandle
from envs.registry import register_env
from envs.swe_smith import grading
from envs.swe_smith.config import SweSmithConfig
from envs.swe_smith.grader.report import read_grading
from envs.swe_smith.loader import read_instances, selected_ids
from envs.swe_smith.model import SweInstance
from envs.swe_smith.transfer import fetch_commands, local_bundle, share_entries
from temporal_rollouts.core.errors import BadItem, ConfigError, TaskError
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.tasks import Item, ScriptedCall, Verdict

SYSTEM_PROMPT = """\
You are a software engineer working in a Linux sandbox on a Python repository. Your working \
directory is /workspace; the repository is checked out in a folder inside it.

Tools:
- terminal(command, timeout?): run a bash command in /workspace and see its output.
- read_file(path): read a text file.
- write_file(path, content): create or overwrite a text file.
- search(pattern, path?): find lines matching a regular expression under a path.

There is no network. pytest is not installed system-wide; to run tests, make a venv once and \
install it from the local wheels: `python3 -m venv --system-site-packages .venv && \
.venv/bin/pip install -q --no-index --find-links .swe/wheels pytest`, then run \
`../.venv/bin/python -m pytest -q <test ids>` inside the repository. Find the cause of the \
failures, fix the library code (not the tests), check your fix, and when you are done reply \
with a short summary without calling any tool."""

OUTPUT_TAIL_CHARS = 2000
GRADER_OVERHEAD_S = 120.0
"""Time the grading command may take besides the install and the test runs (checkout, copying)."""
LISTED_FAILURES = 50


@register_env
class SweSmithEnv(Env):
    name = "swe_smith"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        try:
            self.settings = SweSmithConfig.model_validate(self.config)
        except ValidationError as exc:
            raise ConfigError(f"swe_smith config: {exc}") from None
        self.allow_network = self.settings.repos_are_remote

    def instance(self, item: Item) -> SweInstance:
        try:
            return read_instances(self.settings.dataset)[item.id]
        except KeyError:
            raise BadItem(f"{self.name} has no instance {item.id!r} in {self.settings.dataset}") from None

    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        ids = selected_ids(self.settings)
        if not ids:
            return []
        return [Item(id=ids[(offset + i) % len(ids)]) for i in range(count)]

    def system_prompt(self) -> str | None:
        return SYSTEM_PROMPT

    def format_prompt(self, item: Item) -> str:
        instance = self.instance(item)
        parts = [
            f"The repository is checked out in /workspace/{instance.checkout_name}.",
            "",
            instance.problem_statement.strip(),
        ]
        if self.settings.prompt_mode == "problem_statement+text" and instance.text:
            parts += ["", instance.text.strip()]
        return "\n".join(parts)

    async def setup_workspace(self, item: Item, slot: SlotHandle) -> dict[str, Any]:
        instance = self.instance(item)
        repository, wheels = await self._share(instance, slot)
        script = grading.setup_script(
            instance.checkout_name, instance.base_commit, repository, wheels, self._fetch(instance)
        )
        entries = [name for name in (repository, wheels) if name]
        result = await slot.exec("checkout", script, timeout_s=self.settings.install_timeout_s, cache=entries)
        if not result.ok:
            raise TaskError(f"checking out {instance.instance_id} failed: {result.output[-OUTPUT_TAIL_CHARS:]}")
        return {"instance_id": instance.instance_id, "checkout": instance.checkout_name}

    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        instance = self.instance(item)
        settings = self.settings
        name = instance.checkout_name
        targets = [
            *(instance.FAIL_TO_PASS if settings.score_include_fail_to_pass else ()),
            *instance.PASS_TO_PASS,
        ]
        test_files = sorted(
            {grading.test_file_of(nodeid) for nodeid in (*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS)}
        )
        tool_calls = sum(len(m.tool_calls or ()) for m in transcript if m.role == "assistant")

        # No process of the agent may run while it is graded (the grader's /tmp is out of its reach anyway).
        await slot.stop_processes(key="grader-stop-processes")
        repository, wheels = await self._share(instance, slot)
        script = grading.grade_script(
            name,
            instance.base_commit,
            repository,
            wheels,
            targets=targets,
            test_files=test_files,
            offline=not self.allow_network,
            install_timeout_s=settings.install_timeout_s,
            test_timeout_s=settings.test_timeout_s,
            chunk_size=settings.test_chunk_size,
            fetch=self._fetch(instance),
        )
        chunk_count = max(1, -(-len(targets) // settings.test_chunk_size))
        timeout_s = settings.install_timeout_s + chunk_count * settings.test_timeout_s + GRADER_OVERHEAD_S
        entries = [entry for entry in (repository, wheels) if entry]
        # Read-only: the grader reads the agent's repository and works in its own /tmp; nothing the tests
        # start can then touch the workspace either (the snapshot after verify is what the agent left).
        run = await slot.exec("grader-run", script, timeout_s=timeout_s, cache=entries, read_only=True)
        report = read_grading(run.output, targets, run.exit_code, run.timed_out)
        if report is None:
            raise TaskError(
                f"grading {instance.instance_id} failed before it could report "
                f"({'timed out' if run.timed_out else f'exit {run.exit_code}'}): {run.output[-OUTPUT_TAIL_CHARS:]}"
            )
        installed, tampered = report.installed, report.tampered
        outcomes, messages = report.outcomes, report.messages
        tests_passed = (
            installed and not tampered and bool(targets) and all(outcomes.get(n) == "PASSED" for n in targets)
        )
        if tampered:
            score = 0.0  # a grade the code under test rewrote or stopped: not even the shaped install step
        elif settings.reward == "shaped":
            score = grading.shaped_reward(tool_calls, installed, tests_passed)
        else:
            score = 1.0 if tests_passed else 0.0
        details = _details(instance, settings, outcomes, messages, tool_calls, installed, tests_passed)
        details["changes"] = report.changes
        if not installed:
            details["install_output"] = run.output[-OUTPUT_TAIL_CHARS:]
        else:
            details["canary"], details["grader_tampered"] = report.canary, tampered
            details["canary_templates"] = report.canary_templates
            if report.machinery:
                details["machinery"] = report.machinery
            if report.tests_in_sight is not None:
                details["tests_in_sight"] = report.tests_in_sight
            if report.stopped:
                details["grader_output"] = run.output[-OUTPUT_TAIL_CHARS:]
        return Verdict(score=score, details=details)

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        """Look at the repository, write the reference patch with write_file, apply it with git."""
        instance = self.instance(item)
        if not instance.patch:
            return None
        name = instance.checkout_name
        patch_path = f".swe/{instance.instance_id}.patch"
        return [
            [
                ScriptedCall(
                    name="terminal",
                    arguments={"command": f"cd {name} && git status --short && git log --oneline -1"},
                )
            ],
            [
                ScriptedCall(
                    name="write_file",
                    arguments={"path": patch_path, "content": instance.patch},
                )
            ],
            [
                ScriptedCall(
                    name="terminal",
                    arguments={"command": f"cd {name} && git apply --verbose ../{patch_path} && git diff --stat"},
                )
            ],
        ]

    async def _share(self, instance: SweInstance, slot: SlotHandle) -> tuple[str | None, str]:
        """The repository's and the wheels' entries in the container's read-only cache, put there by
        the first rollout on that container that needs them (see `transfer`)."""
        bundle = None if self.settings.repos_are_remote else local_bundle(self.settings.repo_base_url, instance.repo)
        return await share_entries(slot, bundle, self.settings.wheelhouse)

    def _fetch(self, instance: SweInstance) -> str | None:
        if not self.settings.repos_are_remote:
            return None
        return fetch_commands(instance, self.settings.repo_base_url, '"$src"')


def _details(
    instance: SweInstance,
    settings: SweSmithConfig,
    outcomes: dict[str, str],
    messages: dict[str, str],
    tool_calls: int,
    installed: bool,
    tests_passed: bool,
) -> dict[str, Any]:
    """Per-test results: every FAIL_TO_PASS test's outcome, and the PASS_TO_PASS tests that did not pass."""
    fail_to_pass = {nodeid: outcomes.get(nodeid, "NOT_RUN") for nodeid in instance.FAIL_TO_PASS}
    broken = [nodeid for nodeid in instance.PASS_TO_PASS if outcomes.get(nodeid) != "PASSED"]
    details: dict[str, Any] = {
        "instance_id": instance.instance_id,
        "reward": settings.reward,
        "tool_calls": tool_calls,
        "installed": installed,
        "tests_passed": tests_passed,
        "fail_to_pass": fail_to_pass,
        "pass_to_pass": {
            "total": len(instance.PASS_TO_PASS),
            "passed": len(instance.PASS_TO_PASS) - len(broken),
            "not_passed": broken[:LISTED_FAILURES],
        },
        "messages": {nodeid: messages[nodeid][:300] for nodeid in list(messages)[:10]},
    }
    return details


__all__ = ["SYSTEM_PROMPT", "SweSmithEnv"]
