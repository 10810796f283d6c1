"""The exit codes of `rollouts` (and of `python worker.py` and `rollouts view`), and how such a
command ends, apart from the commands so that the parser and `rollouts --help` need nothing else."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PARTIAL, EXIT_FAILED = 0, 1, 2, 3, 4
"""Exit codes: 0 every rollout scored; 1 the command failed (bad input, unknown id, no server);
2 a usage error (argparse); 3 a partial batch (some rollouts failed); 4 a failed batch
(no rollout scored, or the batch workflow itself failed, was cancelled or terminated)."""
EXIT_PIPE_CLOSED = 141
"""The reader of our output went away (`rollouts list | head`): the shell's code for a SIGPIPE death."""


def batch_exit_code(completed: int, failed: int) -> int:
    if failed == 0:
        return EXIT_OK
    return EXIT_PARTIAL if completed else EXIT_FAILED


def status_exit_code(data: dict[str, Any]) -> int:
    """The exit code of `rollouts status` for its data: 0 while running, else as the batch ended
    (its `status` is the batch's outcome: completed, partial, failed, canceled, ...)."""
    if data["status"] == "running":
        return EXIT_OK
    if data["status"] in ("completed", "partial"):
        return batch_exit_code(data.get("completed") or 0, data.get("failed") or 0)
    return EXIT_FAILED


def exit_flushed(main: Callable[[], int]) -> NoReturn:
    """Run a command's `main` and leave with os._exit once its output is flushed: the Temporal client's
    native threads can abort the interpreter while it finalizes, which would turn a finished command into
    a crash and a wrong exit code. A reader that went away (`rollouts list | head`) ends it quietly, as it
    ends `ls` or `git log`."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        code = EXIT_PIPE_CLOSED
    try:
        sys.stderr.flush()
    except BrokenPipeError:
        pass
    os._exit(code)
