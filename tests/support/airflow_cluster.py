"""A real Airflow 3.3 deployment for end-to-end tests.

Scheduler (LocalExecutor by default), DAG processor, triggerer and API server run as four separate
processes (each in its own session, its output in ``<home>/component-logs/<name>.log``) against a
SQLite metadata database (or the ``database_url`` given) in a throw-away ``AIRFLOW_HOME``. More
long-running processes (Celery workers: ``tests/support/distributed.py``) join with
``AirflowCluster.start_process``. Everything listens on 127.0.0.1 only: the API
server on a free port, the log servers are not started (``--skip-serve-logs``; the API server reads
task logs from the local files). The public REST API (``/api/v2``) is reached with a JWT from the
SimpleAuthManager's ``/auth/token`` for a user and password this module configures.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

COMPONENTS = {  # start order; stopped in reverse (the scheduler last but one: no new task starts)
    "api-server": ["api-server"],  # host and port come from the environment ([api] host/port)
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
}


# What a component's log says when its server has finished (uvicorn's last line), after a SIGTERM.
FINISHED = {"api-server": b"Finished server process"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 40, skip: str | None = None) -> str:
    """The last ``lines`` lines of a file (without those matching the regular expression ``skip``)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<unreadable: {exc}>"
    if skip:
        text = [line for line in text if not re.search(skip, line)]
    return "\n".join(text[-lines:])


@dataclass
class AirflowCluster:
    home: Path
    base_url: str  # http://127.0.0.1:PORT
    env: dict[str, str]
    username: str
    password: str
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    retired: dict[str, subprocess.Popen] = field(default_factory=dict)  # ended on purpose: not checked, still reaped
    _token: str | None = None
    _below: list[psutil.Process] = field(default_factory=list)  # the components' descendants when stopped
    _client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    # ---- REST API -------------------------------------------------------------------------------

    def token(self, refresh: bool = False) -> str:
        """A JWT from the SimpleAuthManager (``POST /auth/token`` with the configured user)."""
        if self._token is None or refresh:
            response = self._client.post(f"{self.base_url}/auth/token",
                                         json={"username": self.username, "password": self.password})
            if response.status_code != 201:
                raise AssertionError(f"POST /auth/token -> {response.status_code}: {response.text[:2000]}")
            self._token = response.json()["access_token"]
        return self._token

    def request(self, method: str, path: str, *, auth: bool = True, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}) or {})
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        return self._client.request(method, f"{self.base_url}{path}", headers=headers, **kwargs)

    def api(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        """Call the API with the bearer token; the JSON answer, or an AssertionError naming the response."""
        response = self.request(method, path, **kwargs)
        if response.status_code not in expect:
            raise AssertionError(f"{method} {path} -> {response.status_code} (expected {expect}): "
                                 f"{response.text[:3000]}")
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.api("GET", path, params=params or None)

    def health(self) -> dict:
        return self._client.get(f"{self.base_url}/api/v2/monitor/health").json()

    # ---- processes and diagnostics ----------------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        return self.home / "component-logs"

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise AssertionError(f"airflow {name} exited with {process.returncode} (see its log below)")

    def start_process(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start one more long-running process of this deployment (the cluster's environment plus
        ``env``), in a session of its own, its output in ``component-logs/<name>.log``; it is checked
        by ``check_alive`` and stopped with the components."""
        if name in self.processes:
            raise ValueError(f"a process named {name} is already running")
        with open(self.log_dir / f"{name}.log", "ab") as log:
            process = subprocess.Popen(argv, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.home)
        self.processes[name] = process
        return process

    def retire(self, name: str) -> subprocess.Popen:
        """Stop checking a process that a test ends on purpose (it is still reaped by ``stop``)."""
        process = self.retired[name] = self.processes.pop(name)
        return process

    def task_logs(self) -> list[Path]:
        """Task (and trigger) log files, oldest first."""
        return sorted((self.home / "logs").glob("dag_id=*/**/*.log*"), key=lambda p: p.stat().st_mtime)

    def diagnostics(self, lines: int = 40, task_logs: int = 6) -> str:
        """Tails of the component logs and of the newest task logs: printed when a test fails."""
        quiet = r"\[http\.access\].*status_code=[23]\d\d"  # the API server logs every request
        parts = [f"===== {p.name} (tail)\n{tail(p, lines, quiet)}" for p in sorted(self.log_dir.glob("*.log"))]
        parts += [f"===== task log {p.relative_to(self.home)} (tail)\n{tail(p, lines)}"
                  for p in self.task_logs()[-task_logs:]]
        return "\n".join(parts)

    def descendants(self) -> list[psutil.Process]:
        """Every live process below the components (psutil checks a pid was not reused before signalling)."""
        found: list[psutil.Process] = []
        for process in [*self.processes.values(), *self.retired.values()]:
            with contextlib.suppress(psutil.Error):
                found += psutil.Process(process.pid).children(recursive=True)
        return found

    def stop(self, grace: float = 20) -> None:
        """SIGTERM every component's process group, SIGKILL what is left after ``grace`` seconds, or as soon
        as each has exited or its server has logged its end (the groups and the descendants seen before: task
        processes move to groups of their own), and reap the components."""
        below = self._below = self.descendants()
        named = [*self.retired.items(), *self.processes.items()]
        everything = [process for _, process in named]
        logged = {name: self._log_size(name) for name, _ in named}  # what each log held before the SIGTERM
        for process in reversed(everything):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, process in named:
            while (process.poll() is None and time.monotonic() < deadline
                   and not self._served_its_last(name, logged[name])):
                time.sleep(0.1)
        psutil.wait_procs(below, timeout=max(0.1, deadline - time.monotonic()))
        for process in everything:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for proc in below:
            with contextlib.suppress(psutil.Error):
                proc.kill()  # raises NoSuchProcess, never signals a reused pid
        for process in everything:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        psutil.wait_procs(below, timeout=10)
        self._client.close()

    def _log_size(self, name: str) -> int:
        with contextlib.suppress(OSError):
            return (self.log_dir / f"{name}.log").stat().st_size
        return 0

    def _served_its_last(self, name: str, since: int) -> bool:
        """Whether the component's server has shut down (its log says so past byte ``since``): the API
        server's interpreter then spends 5-15 s in its final garbage collection before it exits (seen with
        faulthandler), which nothing waits for: it is killed with what is left."""
        line = FINISHED.get(name)
        if line is None:
            return False
        with contextlib.suppress(OSError), open(self.log_dir / f"{name}.log", "rb") as log:
            log.seek(since)
            return line in log.read()
        return False

    def leftover_processes(self) -> list[str]:
        """Live processes of this deployment: a component, a descendant seen at stop time, or any
        process whose environment names this AIRFLOW_HOME (e.g. a detached Spark job)."""
        left = [f"{name} (pid {p.pid})" for name, p in {**self.retired, **self.processes}.items() if p.poll() is None]
        for proc in [*self._below, *psutil.process_iter()]:
            with contextlib.suppress(psutil.Error):
                if proc.pid == os.getpid() or not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if proc in self._below or proc.environ().get("AIRFLOW_HOME") == str(self.home):
                    left.append(f"{proc.pid}: {' '.join(proc.cmdline())[:200]}")
        return sorted(set(left))


def deployment_env(home: Path, dags_folder: Path, port: int, username: str, passwords_file: Path,
                   paused_at_creation: bool, extra: dict[str, str], executor: str = "LocalExecutor",
                   database_url: str | None = None) -> dict[str, str]:
    from cryptography.fernet import Fernet

    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}  # nothing of the caller's Airflow
    url = f"http://127.0.0.1:{port}"
    return {
        **base,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(paused_at_creation),
        "AIRFLOW__CORE__EXECUTOR": executor,
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{username}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url or f"sqlite:///{home}/airflow.db",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(64),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),  # the same in every component
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),  # unused (--skip-serve-logs), never 8793
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        **extra,
    }


def _wait(predicate, timeout: float, what: str, cluster: AirflowCluster, poll: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        cluster.check_alive()
        try:
            result = predicate()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            result, last = None, exc
        if result:
            return result
        time.sleep(poll)
    raise AssertionError(f"{what} within {timeout:.0f}s (last error: {last!r})")


HEALTH_PARTS = {"api-server": "metadatabase", "scheduler": "scheduler", "triggerer": "triggerer",
                "dag-processor": "dag_processor"}


def all_healthy(cluster: AirflowCluster) -> bool:
    health = cluster.health()
    return all(health.get(HEALTH_PARTS[name], {}).get("status") == "healthy"
               for name in cluster.processes if name in HEALTH_PARTS)


# A freshly migrated SQLite metadata database, copied by every later SQLite deployment of the session instead
# of its own `airflow db migrate` (8-10 s each at load 8-10; the console, plugin and scheduler tests each start one).
_MIGRATED_SQLITE: list[Path] = []


@contextlib.contextmanager
def airflow_cluster(home: Path, dags_folder: Path, env: dict[str, str] | None = None, *,
                    paused_at_creation: bool = False, startup_timeout: float = 240,
                    components: tuple[str, ...] = tuple(COMPONENTS), executor: str = "LocalExecutor",
                    database_url: str | None = None) -> Iterator[AirflowCluster]:
    """Migrate a fresh database (SQLite in ``home`` unless ``database_url`` names an empty one; a SQLite one
    is a copy of the session's first migrated one after the first),
    start the four components, wait until the API answers and reports the scheduler, triggerer and
    DAG processor healthy; stop them all (and the processes added later) at exit.

    ``components=("api-server",)`` starts the API server alone (it is always started)."""
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown components {sorted(unknown)}; known: {list(COMPONENTS)}")
    home.mkdir(parents=True, exist_ok=True)
    username, password = "e2e-admin", secrets.token_urlsafe(16)
    passwords_file = home / "simple_auth_manager_passwords.json"
    passwords_file.write_text(json.dumps({username: password}))
    port = free_port()
    cluster = AirflowCluster(home=home, base_url=f"http://127.0.0.1:{port}",
                             env=deployment_env(home, dags_folder, port, username, passwords_file,
                                                paused_at_creation, env or {}, executor, database_url),
                             username=username, password=password)
    cluster.log_dir.mkdir(exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    migrate_log = cluster.log_dir / "db-migrate.log"
    sqlite = None if database_url else home / "airflow.db"
    if sqlite is not None and _MIGRATED_SQLITE:
        shutil.copyfile(_MIGRATED_SQLITE[0], sqlite)
        migrate_log.write_text(f"copied from {_MIGRATED_SQLITE[0]}, migrated by this session's first deployment\n")
    else:
        with open(migrate_log, "wb") as log:
            migrated = subprocess.run([airflow, "db", "migrate"], env=cluster.env, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=300, cwd=home)
        if migrated.returncode != 0:
            raise AssertionError(f"airflow db migrate failed ({migrated.returncode}):\n{tail(migrate_log, 60)}")
        if sqlite is not None:  # kept before any component writes to it: the next SQLite deployment starts from it
            template = Path(tempfile.mkdtemp(prefix="airflow-migrated-")) / "airflow.db"
            shutil.copyfile(sqlite, template)
            atexit.register(shutil.rmtree, template.parent, ignore_errors=True)
            _MIGRATED_SQLITE.append(template)
    try:
        for name, args in COMPONENTS.items():
            if name != "api-server" and name not in components:
                continue
            cluster.start_process(name, [airflow, *args])
        _wait(lambda: all_healthy(cluster), startup_timeout,
              f"the API server did not report healthy {', '.join(cluster.processes)}", cluster)
        yield cluster
    except BaseException:
        print(cluster.diagnostics())  # pytest shows it with the failure
        raise
    finally:
        cluster.stop()
