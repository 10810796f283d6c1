"""The default build id (runtime/versioning.py): a digest of what workflow code does, not of its words."""

from __future__ import annotations

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.versioning import _code_only, deployment_config, worker_version, workflow_code_digest

CODE = '''
"""A module."""


def decide(turns: int) -> bool:
    """Stop after three turns."""
    return turns >= 3  # the limit
'''


def test_docstrings_comments_and_layout_do_not_make_a_new_build() -> None:
    reworded = CODE.replace("A module.", "What the module is for.").replace("# the limit", "# three")
    reflowed = reworded.replace("def decide(turns: int) -> bool:", "def decide(\n    turns: int,\n) -> bool:")
    assert _code_only(reworded) == _code_only(CODE) == _code_only(reflowed)


def test_a_change_to_what_the_code_does_makes_a_new_build() -> None:
    assert _code_only(CODE.replace(">= 3", ">= 4")) != _code_only(CODE)
    assert _code_only(CODE.replace('"""Stop after three turns."""', '"""Stop."""\n    turns += 1')) != _code_only(CODE)


def test_the_build_is_the_digest_unless_one_is_set() -> None:
    assert worker_version(Settings()).build_id == workflow_code_digest()
    assert len(workflow_code_digest()) == 16
    named = Settings(worker={"build_id": "git-3f2a1c"}, temporal={"task_queue": "rl"})
    assert (worker_version(named).deployment_name, worker_version(named).build_id) == ("rl", "git-3f2a1c")
    assert deployment_config(Settings(worker={"versioning": False})) is None
    assert deployment_config(named).use_worker_versioning
