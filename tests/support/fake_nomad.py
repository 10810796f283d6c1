"""A fake Nomad agent (server + one client node) for tests: the machine has no Nomad binary.

An HTTP server on loopback that answers the endpoints the real `python-nomad`
client calls, with Nomad's JSON shapes and status codes, and that runs `raw_exec`
tasks as real local processes:

* `POST /v1/job/<id>` registers a job; with `EnforceIndex` it registers only if
  `JobModifyIndex` matches (0: only if the job is new), else HTTP 500
  "Enforcing job modify index 0: job already exists", as Nomad answers.
* `GET /v1/jobs?prefix=`, `GET /v1/job/<id>`, `GET /v1/job/<id>/allocations`,
  `GET /v1/allocation/<id>` (with `AllocatedResources.Shared.Ports`),
  `POST /v1/client/allocation/<id>/restart`, `DELETE /v1/job/<id>?purge=`,
  `GET|PUT|DELETE /v1/var/<path>` (with `cas`), `GET /v1/acl/token/self`.
* With an ACL token configured, every request without it gets 403.
* A task gets Nomad's environment (`NOMAD_ALLOC_DIR`, `NOMAD_SECRETS_DIR`,
  `NOMAD_TASK_DIR`, `NOMAD_PORT_<label>`, `NOMAD_IP_<label>`, `NOMAD_ADDR_<label>`,
  `NOMAD_ALLOC_ID`, `NOMAD_JOB_ID`, ...), `${VAR}` interpolation in its args and
  env, and its templates rendered (only the `{{ with nomadVar "path" }}{{ .key }}{{ end }}`
  form; a task whose variable is missing waits, as Nomad's template runner does).
* A task that exits is restarted in its allocation (same alloc dir, same port)
  after the restart policy's delay (scaled by `delay_scale`), up to its attempts;
  then the allocation fails and is rescheduled as a new allocation, up to the
  reschedule attempts; then the job is dead. `lose_allocation` simulates a lost
  node: the allocation becomes `lost` and a replacement starts on a new port with
  a fresh alloc dir (the lost node's disk cannot be migrated).

Not emulated: evaluations, deployments and update stanzas, several nodes and
placement (everything runs on one node, 127.0.0.1), constraints and resources
(cpu/memory are accepted, not enforced), drivers other than raw_exec (docker jobs
are refused with a 500 as on a node without docker), blocking queries, ACL
policies (one token may do everything), namespaces beyond keeping jobs apart,
regions, the `restart` endpoint's task selection, and Consul/service checks.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

NANOS = 1_000_000_000
TEMPLATE = re.compile(r'\{\{\s*with nomadVar "([^"]+)"\s*\}\}\{\{\s*\.(\w+)\s*\}\}\{\{\s*end\s*\}\}')
INTERPOLATION = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


class NomadHTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Task:
    spec: dict[str, Any]
    state: str = "pending"
    restarts: int = 0
    failed: bool = False
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    expected_exit: bool = False


@dataclass
class Allocation:
    id: str
    job_id: str
    namespace: str
    group: dict[str, Any]
    directory: Path
    ports: dict[str, int]
    create_index: int
    client_status: str = "pending"
    desired_status: str = "run"
    tasks: dict[str, Task] = field(default_factory=dict)
    restart_window: list[float] = field(default_factory=list)


@dataclass
class Job:
    spec: dict[str, Any]
    namespace: str
    modify_index: int
    version: int = 0
    stop: bool = False
    reschedules: int = 0
    allocs: list[str] = field(default_factory=list)


class FakeNomad:
    def __init__(self, data_dir: Path, acl_token: str | None = None, delay_scale: float = 0.02) -> None:
        self.data_dir = data_dir
        self.acl_token = acl_token
        self.delay_scale = delay_scale
        self.jobs: dict[tuple[str, str], Job] = {}
        self.allocs: dict[str, Allocation] = {}
        self.variables: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._index = itertools.count(10)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._http.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._http.serve_forever, daemon=True),
            threading.Thread(target=self._supervise, daemon=True),
        ]

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def start(self) -> FakeNomad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._http.shutdown()
        self._http.server_close()
        with self._lock:
            for alloc in self.allocs.values():
                self._stop_alloc(alloc, "complete")

    # Test controls -------------------------------------------------------------------------

    def running_processes(self, job_id: str) -> list[subprocess.Popen[bytes]]:
        with self._lock:
            return [
                task.process
                for alloc in self.allocs.values()
                if alloc.job_id == job_id
                for task in alloc.tasks.values()
                if task.process is not None and task.process.poll() is None
            ]

    def kill_task(self, job_id: str) -> int:
        """SIGKILL the job's running task (a crash); Nomad restarts it in its allocation. Its pid."""
        process = self.running_processes(job_id)[0]
        process.kill()
        return process.pid

    def break_task(self, job_id: str) -> None:
        """From now on the job's task exits at once (a bad image, a missing interpreter)."""
        with self._lock:
            for task in self.jobs[("default", job_id)].spec["TaskGroups"][0]["Tasks"]:
                task["Config"]["command"], task["Config"]["args"] = "/bin/false", []
            for process in self.running_processes(job_id):
                process.kill()

    def lose_allocation(self, job_id: str) -> str:
        """The node of the job's running allocation is gone: kill it, mark it lost, place a replacement."""
        with self._lock:
            alloc = self._live_alloc(job_id)
            self._stop_alloc(alloc, "lost")
            job = self.jobs[(alloc.namespace, job_id)]
            replacement = self._place(job)
            return replacement.id

    def alloc_of(self, job_id: str) -> Allocation:
        with self._lock:
            return self._live_alloc(job_id)

    # HTTP ------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], headers: Any, body: Any) -> Any:
        self.requests.append((method, path))
        if self.acl_token is not None and headers.get("X-Nomad-Token") != self.acl_token:
            raise NomadHTTPError(403, "Permission denied")
        namespace = query.get("namespace", "default")
        parts = [unquote(part) for part in path.strip("/").split("/")]
        if parts[:1] != ["v1"]:
            raise NomadHTTPError(404, "Invalid URL")
        parts = parts[1:]
        with self._lock:
            if parts == ["jobs"] and method == "GET":
                prefix = query.get("prefix", "")
                return [
                    self._job_stub(job)
                    for (ns, jid), job in sorted(self.jobs.items())
                    if ns == namespace and jid.startswith(prefix)
                ]
            if parts[:1] == ["job"] and len(parts) == 2:
                return self._job_endpoint(method, parts[1], namespace, query, body)
            if parts[:1] == ["job"] and len(parts) == 3 and parts[2] == "allocations" and method == "GET":
                job = self._job(namespace, parts[1])
                return [self._alloc_stub(self.allocs[alloc_id]) for alloc_id in job.allocs]
            if parts[:1] == ["allocation"] and len(parts) == 2 and method == "GET":
                return self._alloc_full(self._alloc(parts[1]))
            if parts[:2] == ["client", "allocation"] and parts[3:] == ["restart"] and method in ("POST", "PUT"):
                alloc = self._alloc(parts[2])
                for task in alloc.tasks.values():
                    self._kill(task, expected=True)
                    task.restarts += 1
                    task.restart_at = time.monotonic()
                return {}
            if parts[:1] == ["var"] and len(parts) >= 2:
                return self._variable(method, "/".join(parts[1:]), namespace, query, body)
            if parts == ["acl", "token", "self"] and method == "GET":
                if self.acl_token is None:
                    raise NomadHTTPError(400, "ACL support disabled")
                return {
                    "AccessorID": "fake-accessor",
                    "SecretID": self.acl_token,
                    "Name": "test",
                    "Type": "management",
                    "Policies": None,
                    "Global": False,
                }
        raise NomadHTTPError(404, f"Invalid URL: {method} {path}")

    def _job_endpoint(self, method: str, job_id: str, namespace: str, query: dict[str, str], body: Any) -> Any:
        if method == "GET":
            job = self._job(namespace, job_id)
            return {**job.spec, **self._job_stub(job)}
        if method in ("POST", "PUT"):
            return self._register(job_id, namespace, body)
        if method == "DELETE":
            job = self._job(namespace, job_id)
            for alloc_id in job.allocs:
                self._stop_alloc(self.allocs[alloc_id], "complete")
            job.stop = True
            job.modify_index = next(self._index)
            if query.get("purge", "").lower() in ("1", "t", "true"):  # Go strconv.ParseBool
                del self.jobs[(namespace, job_id)]
                for alloc_id in job.allocs:
                    self.allocs.pop(alloc_id, None)
            return {"EvalID": str(uuid.uuid4()), "JobModifyIndex": job.modify_index}
        raise NomadHTTPError(405, "Invalid method")

    def _register(self, job_id: str, namespace: str, body: Any) -> Any:
        if not isinstance(body, dict) or not isinstance(body.get("Job"), dict):
            raise NomadHTTPError(400, "Job must be specified")
        spec = body["Job"]
        if spec.get("ID") != job_id:
            raise NomadHTTPError(400, "Job ID does not match")
        namespace = spec.get("Namespace") or namespace
        for group in spec.get("TaskGroups") or []:
            for task in group.get("Tasks") or []:
                if task.get("Driver") != "raw_exec":
                    raise NomadHTTPError(500, f"driver {task.get('Driver')!r} is not available on any node")
        existing = self.jobs.get((namespace, job_id))
        if body.get("EnforceIndex"):
            wanted = int(body.get("JobModifyIndex", 0))
            current = existing.modify_index if existing is not None else 0
            if wanted == 0 and existing is not None:
                raise NomadHTTPError(500, "Enforcing job modify index 0: job already exists")
            if wanted != current:
                raise NomadHTTPError(
                    500, f"Enforcing job modify index {wanted}: job exists with conflicting job modify index: {current}"
                )
        if existing is not None:
            for alloc_id in existing.allocs:
                self._stop_alloc(self.allocs[alloc_id], "complete")
            job = existing
            job.spec, job.stop, job.reschedules, job.version = spec, False, 0, job.version + 1
            job.modify_index = next(self._index)
        else:
            job = Job(spec=spec, namespace=namespace, modify_index=next(self._index))
            self.jobs[(namespace, job_id)] = job
        self._place(job)
        return {"EvalID": str(uuid.uuid4()), "JobModifyIndex": job.modify_index, "Warnings": ""}

    def _variable(self, method: str, path: str, namespace: str, query: dict[str, str], body: Any) -> Any:
        key = (namespace, path)
        current = self.variables.get(key)
        if "cas" in query and int(query["cas"]) != (current["ModifyIndex"] if current else 0):
            raise NomadHTTPError(409, "cas error")
        if method == "GET":
            if current is None:
                raise NomadHTTPError(404, "variable not found")
            return current
        if method == "PUT":
            index = next(self._index)
            self.variables[key] = {
                "Namespace": namespace,
                "Path": path,
                "Items": dict(body.get("Items") or {}),
                "CreateIndex": current["CreateIndex"] if current else index,
                "ModifyIndex": index,
            }
            return self.variables[key]
        if method == "DELETE":
            self.variables.pop(key, None)
            return {}
        raise NomadHTTPError(405, "Invalid method")

    # Scheduling and supervision -------------------------------------------------------------

    def _place(self, job: Job) -> Allocation:
        group = job.spec["TaskGroups"][0]
        alloc_id = str(uuid.uuid4())
        labels = [
            port["Label"] for network in group.get("Networks") or [] for port in network.get("DynamicPorts") or []
        ]
        alloc = Allocation(
            id=alloc_id,
            job_id=job.spec["ID"],
            namespace=job.namespace,
            group=group,
            directory=self.data_dir / "allocs" / alloc_id,
            ports={label: _free_port() for label in labels},
            create_index=next(self._index),
        )
        for task_spec in group.get("Tasks") or []:
            alloc.tasks[task_spec["Name"]] = Task(spec=task_spec, restart_at=time.monotonic())
        self.allocs[alloc_id] = alloc
        job.allocs.append(alloc_id)
        return alloc

    def _supervise(self) -> None:
        while not self._stopping.wait(0.05):
            with self._lock:
                for alloc in list(self.allocs.values()):
                    if alloc.desired_status == "run" and alloc.client_status in ("pending", "running"):
                        self._tend(alloc)

    def _tend(self, alloc: Allocation) -> None:
        policy = alloc.group.get("RestartPolicy") or {}
        for task in alloc.tasks.values():
            if task.process is not None and task.process.poll() is not None and not task.expected_exit:
                task.process, task.state = None, "pending"
                window = policy.get("Interval", 300 * NANOS) / NANOS
                now = time.monotonic()
                alloc.restart_window = [at for at in alloc.restart_window if now - at < window]
                if len(alloc.restart_window) >= int(policy.get("Attempts", 2)):
                    self._fail(alloc)
                    return
                alloc.restart_window.append(now)
                task.restarts += 1
                task.restart_at = now + policy.get("Delay", 15 * NANOS) / NANOS * self.delay_scale
            if task.process is None and task.restart_at is not None and time.monotonic() >= task.restart_at:
                if self._launch(alloc, task):
                    task.restart_at, task.expected_exit = None, False
        states = {task.state for task in alloc.tasks.values()}
        alloc.client_status = "running" if states == {"running"} else "pending"

    def _fail(self, alloc: Allocation) -> None:
        self._stop_alloc(alloc, "failed")
        job = self.jobs.get((alloc.namespace, alloc.job_id))
        if job is None:
            return
        policy = alloc.group.get("ReschedulePolicy") or {}
        if policy.get("Unlimited") or job.reschedules < int(policy.get("Attempts", 0)):
            job.reschedules += 1
            self._place(job)

    def _launch(self, alloc: Allocation, task: Task) -> bool:
        name = task.spec["Name"]
        task_dir = alloc.directory / name
        for folder in (
            alloc.directory / "alloc" / "data",
            alloc.directory / "alloc" / "logs",
            task_dir / "local",
            task_dir / "secrets",
        ):
            folder.mkdir(parents=True, exist_ok=True)
        env = self._task_env(alloc, task, task_dir)
        for template in task.spec.get("Templates") or []:
            rendered = self._render(template.get("EmbeddedTmpl", ""), alloc.namespace)
            if rendered is None:
                return False  # Nomad's template runner blocks until the variable exists
            destination = task_dir / template["DestPath"]
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(rendered)
            destination.chmod(int(template.get("Perms", "0644"), 8))
        config = task.spec.get("Config") or {}
        argv = [_interpolate(config["command"], env), *(_interpolate(arg, env) for arg in config.get("args") or [])]
        with open(alloc.directory / "alloc" / "logs" / f"{name}.log", "ab") as log:
            task.process = subprocess.Popen(
                argv,
                cwd=task_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        task.state = "running"
        return True

    def _task_env(self, alloc: Allocation, task: Task, task_dir: Path) -> dict[str, str]:
        job = self.jobs[(alloc.namespace, alloc.job_id)]
        env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
        env.update(
            {
                "NOMAD_ALLOC_DIR": str(alloc.directory / "alloc"),
                "NOMAD_TASK_DIR": str(task_dir / "local"),
                "NOMAD_SECRETS_DIR": str(task_dir / "secrets"),
                "NOMAD_ALLOC_ID": alloc.id,
                "NOMAD_ALLOC_INDEX": "0",
                "NOMAD_JOB_ID": alloc.job_id,
                "NOMAD_JOB_NAME": job.spec.get("Name", alloc.job_id),
                "NOMAD_GROUP_NAME": alloc.group.get("Name", ""),
                "NOMAD_TASK_NAME": task.spec["Name"],
                "NOMAD_NAMESPACE": alloc.namespace,
                "NOMAD_DC": (job.spec.get("Datacenters") or ["dc1"])[0],
                "NOMAD_REGION": job.spec.get("Region") or "global",
            }
        )
        for label, port in alloc.ports.items():
            env.update(
                {
                    f"NOMAD_PORT_{label}": str(port),
                    f"NOMAD_HOST_PORT_{label}": str(port),
                    f"NOMAD_IP_{label}": "127.0.0.1",
                    f"NOMAD_ADDR_{label}": f"127.0.0.1:{port}",
                }
            )
        for key, value in (task.spec.get("Env") or {}).items():
            env[key] = _interpolate(value, env)
        return env

    def _render(self, template: str, namespace: str) -> str | None:
        missing = False

        def value(match: re.Match[str]) -> str:
            nonlocal missing
            variable = self.variables.get((namespace, match.group(1)))
            if variable is None or match.group(2) not in variable["Items"]:
                missing = True
                return ""
            return str(variable["Items"][match.group(2)])

        rendered = TEMPLATE.sub(value, template)
        return None if missing else rendered

    def _kill(self, task: Task, expected: bool) -> None:
        task.expected_exit = expected
        if task.process is not None and task.process.poll() is None:
            try:
                os.killpg(task.process.pid, signal.SIGTERM)
                task.process.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with _suppress():
                    os.killpg(task.process.pid, signal.SIGKILL)
                task.process.wait(5)
        task.process, task.state = None, "pending" if not expected else "dead"

    def _stop_alloc(self, alloc: Allocation, status: str) -> None:
        for task in alloc.tasks.values():
            self._kill(task, expected=True)
            task.state, task.restart_at, task.failed = "dead", None, status == "failed"
        alloc.desired_status = "stop" if status != "failed" else alloc.desired_status
        alloc.client_status = status
        if status == "lost":
            shutil.rmtree(alloc.directory, ignore_errors=True)  # the node and its disk are gone

    # Views -----------------------------------------------------------------------------------

    def _job(self, namespace: str, job_id: str) -> Job:
        job = self.jobs.get((namespace, job_id))
        if job is None:
            raise NomadHTTPError(404, "job not found")
        return job

    def _alloc(self, alloc_id: str) -> Allocation:
        alloc = self.allocs.get(alloc_id)
        if alloc is None:
            raise NomadHTTPError(404, "alloc not found")
        return alloc

    def _live_alloc(self, job_id: str) -> Allocation:
        return next(
            alloc
            for alloc in self.allocs.values()
            if alloc.job_id == job_id
            and alloc.client_status in ("running", "pending")
            and alloc.desired_status == "run"
        )

    def _job_status(self, job: Job) -> str:
        if job.stop:
            return "dead"
        statuses = {self.allocs[alloc_id].client_status for alloc_id in job.allocs if alloc_id in self.allocs}
        if "running" in statuses:
            return "running"
        return "pending" if "pending" in statuses else "dead"

    def _job_stub(self, job: Job) -> dict[str, Any]:
        return {
            "ID": job.spec["ID"],
            "Name": job.spec.get("Name", job.spec["ID"]),
            "Namespace": job.namespace,
            "Type": job.spec.get("Type", "service"),
            "Status": self._job_status(job),
            "Stop": job.stop,
            "JobModifyIndex": job.modify_index,
            "ModifyIndex": job.modify_index,
            "Version": job.version,
        }

    def _alloc_stub(self, alloc: Allocation) -> dict[str, Any]:
        return {
            "ID": alloc.id,
            "JobID": alloc.job_id,
            "Namespace": alloc.namespace,
            "TaskGroup": alloc.group.get("Name"),
            "ClientStatus": alloc.client_status,
            "DesiredStatus": alloc.desired_status,
            "CreateIndex": alloc.create_index,
            "ModifyIndex": alloc.create_index,
            "TaskStates": {
                name: {"State": task.state, "Failed": task.failed, "Restarts": task.restarts}
                for name, task in alloc.tasks.items()
            },
        }

    def _alloc_full(self, alloc: Allocation) -> dict[str, Any]:
        ports = [{"Label": label, "Value": port, "To": 0, "HostIP": "127.0.0.1"} for label, port in alloc.ports.items()]
        return {
            **self._alloc_stub(alloc),
            "AllocatedResources": {
                "Shared": {
                    "Ports": ports,
                    "Networks": [
                        {"IP": "127.0.0.1", "DynamicPorts": [{"Label": p["Label"], "Value": p["Value"]} for p in ports]}
                    ],
                }
            },
        }


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _interpolate(value: str, env: dict[str, str]) -> str:
    return INTERPOLATION.sub(lambda match: env.get(match.group(1), ""), str(value))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _handler_for(fake: FakeNomad) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            url = urlparse(self.path)
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
                status, payload = 200, fake.handle(self.command, url.path, query, self.headers, body)
                data = json.dumps(payload).encode()
                content_type = "application/json"
            except NomadHTTPError as err:
                status, data, content_type = err.status, str(err).encode(), "text/plain"
            except ValueError as err:
                status, data, content_type = 400, f"invalid JSON: {err}".encode(), "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Nomad-Index", str(next(fake._index)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
