"""The temp folder of a test session: every test, and every process a test starts, writes its temporary
files in a folder of the session's own, and what is left there at the end is reported as a failure.

Without it, a worker's build folders, a server's spools or a library's caches that outlive their
process pile up in the host's temp dir run after run (a swe_smith cache entry left 0.5 MB per
repository per worker, 45 of them after an afternoon), unseen. The session sets `TMPDIR` (and
`tempfile.tempdir`) before any test runs, so the processes tests start inherit it. Not counted:
pytest's own `tmp_path` folders (`pytest-of-<user>`), the caches other libraries keep on purpose
across runs (torch's compile cache, pointed into `library-caches/`), wandb's own temp folders of
processes a test killed (`KILLED_LIBRARY_TEMP`), and folders the test process itself removes at its exit,
after this check (a `tempfile.TemporaryDirectory` a library holds for
the life of the process, as wandb does once imported). The folder is removed at the
end either way (`tmp_path` folders with it: pass `--basetemp DIR` to keep them), so a leftover
costs one failed run, not the disk.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import weakref
from pathlib import Path

KEPT_BY_PYTEST = "pytest-of-"
LIBRARY_CACHES = "library-caches"
KILLED_LIBRARY_TEMP = ("wandb-media", "wandb-artifacts")
"""Endings of the temp folders wandb makes when it is imported and removes when its process exits: a process
a test SIGKILLs on purpose (the Atropos env's kill test, the crash tests) leaves them, and no other process may
remove a folder that may be a live one's. What our own code leaves is still counted."""
LISTED = 20
HOST_TEMP = "ROLLOUTS_TESTS_HOST_TEMP"
"""The host's temp dir as the first test process of a run found it (each session, and each xdist worker, moves
TMPDIR into a folder of its own): where what outlives one session lives, such as tests/support/parallel.py's locks."""


class SessionTemp:
    def __init__(self) -> None:
        self.host_temp = tempfile.gettempdir()
        os.environ.setdefault(HOST_TEMP, self.host_temp)
        self.folder = Path(tempfile.mkdtemp(prefix="rollouts-tests-", dir=self.host_temp))
        os.environ["TMPDIR"] = str(self.folder)
        tempfile.tempdir = str(self.folder)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.folder / LIBRARY_CACHES / "torchinductor"))

    def leftovers(self) -> list[str]:
        """What the session left in its temp folder, pytest's own folders aside."""
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return []
        at_exit = self.removed_at_exit()
        return [
            n
            for n in names
            if not n.startswith(KEPT_BY_PYTEST)
            and n != LIBRARY_CACHES
            and n not in at_exit
            and not n.endswith(KILLED_LIBRARY_TEMP)
        ]

    def removed_at_exit(self) -> set[str]:
        """Entries a pending `weakref.finalize` of this process removes when it exits (what
        `tempfile.TemporaryDirectory` registers), read from the finalizers' registry."""
        inside = str(self.folder) + os.sep
        names = set()
        for info in list(weakref.finalize._registry.values()):  # type: ignore[attr-defined]
            for arg in info.args if info.atexit else ():
                if isinstance(arg, str) and arg.startswith(inside):
                    names.add(arg[len(inside) :].split(os.sep, 1)[0])
        return names

    def remove(self) -> None:
        """`rm -rf`, not shutil.rmtree, which recurses and stops at a tree deeper than ~1,000 levels."""
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.folder)], check=False)

    def restore(self) -> None:
        """The host's temp dir again, for what runs after the session."""
        os.environ["TMPDIR"] = self.host_temp
        tempfile.tempdir = None


def with_workers(own: list[str], workers: dict[str, list[str]]) -> list[str]:
    """An xdist controller's leftovers: its own less its workers' folders (each worker removes its own when it
    ends, after the controller looks), and what each worker left in its folder, by its path in the controller's."""
    return [name for name in own if name not in workers] + [
        f"{folder}/{name}" for folder, theirs in sorted(workers.items()) for name in theirs
    ]


def report(leftovers: list[str], folder: Path) -> str:
    shown = ", ".join(leftovers[:LISTED]) + (f" and {len(leftovers) - LISTED} more" if len(leftovers) > LISTED else "")
    return (
        f"the test session left {len(leftovers)} entries in its temp dir ({folder}): {shown}. "
        "Whatever a test, a worker or a server writes outside its data folder must be removed when no longer "
        "needed and at exit (tests/support/tempdir.py)."
    )
