"""What an error a command expects means, in one line: bad input or settings, Temporal refusing or out of
reach, a model refusing a value. Every program over the control layer (`rollouts`, `rollouts view`) words
its errors the same way (`report_error`); an error not named here is a bug, and its traceback is the report."""

from __future__ import annotations

import sys

from pydantic import ValidationError
from temporalio.service import RPCError, RPCStatusCode

from temporal_rollouts.core.errors import RolloutError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.exit_codes import EXIT_ERROR


def explain_rpc_error(err: RPCError, settings: Settings | None) -> str:
    where = settings.temporal_address if settings else "Temporal"
    if err.status == RPCStatusCode.NOT_FOUND:
        return f"not found on {where}: {err.message}"
    if err.status == RPCStatusCode.UNAVAILABLE:
        hint = (
            " (start it with `python worker.py` or `rollouts server start`)" if settings and settings.embedded else ""
        )
        return f"Temporal at {where} is not reachable{hint}: {err.message}"
    return f"Temporal at {where} answered {err.status.name if err.status else 'an error'}: {err.message}"


def explain_error(err: BaseException, settings: Settings | None) -> str | None:
    """The line to print for `err` (after `error: `), or None for an error no command expects."""
    if isinstance(err, RolloutError):
        return err.message
    if isinstance(err, RPCError):
        return explain_rpc_error(err, settings)
    if isinstance(err, ValidationError):  # an input the models refuse (the commands check most before)
        first = err.errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    return None


def report_error(err: Exception, settings: Settings | None) -> int:
    """`error: <what it means>` on stderr and the exit code of a failed command; an error no command expects
    is raised again."""
    if (line := explain_error(err, settings)) is None:
        raise err
    print(f"error: {line}", file=sys.stderr)
    return EXIT_ERROR
