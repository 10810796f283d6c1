"""The sandbox server: the program that runs inside each container and owns its slots.

Its own package, importing nothing else of the project (standard library, pydantic,
starlette, uvicorn), so a container image needs only this folder. Run it with
`python -m temporal_rollouts.sandbox_server`.

What every room shares sits here: `config` (what a server starts with, and its command line),
`schema` (the requests and responses the worker's pool speaks) and `errors` (the typed errors
that cross HTTP). The rooms, bottom up; a room imports only from rooms below it
(`tests/unit/test_layers.py`):

    7  http        the HTTP app over the slot manager; the Host guard and key every server shares
    6  slots       the slot manager: leases, the waiting line, the slot book, the disk guard
    5  calls       what a call does in a slot: its operations once per call id, the terminal, transfers
    5  harness     an agent harness in a slot: its process, its model endpoint, the in-slot relay
    4  isolation   the sandbox a command runs in: bubblewrap, seccomp, the resident launcher, uids, orphans
    3  volumes     each slot's volume, held to its disk and file limits
    2  limits | state   memory, CPU and processes (cgroups, watchdog) | what is kept on disk for a restart
    1  files       workspace files opened beneath the workspace, bounded output, archives, the cache,
                   a slot's root on an item image
"""
