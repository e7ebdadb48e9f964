"""``airflow-savepoints demo --console`` (``make console``): the savepoints console on what the demo made.

An Airflow API server on the demo's own Airflow (``<work folder>/airflow``, its SQLite database and
DAG runs), the plugin reading the demo's savepoint root, the example DAGs serialized and unpaused, a
login (SimpleAuthManager, user ``admin``) printed. No scheduler runs: an action of the console queues a
DAG run, which ``airflow scheduler`` in the same environment would run. Ctrl-C (SIGINT) or SIGTERM
stops the server and its workers.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from airflow_savepoints.errors import InvalidInputError

USER = "admin"


def console_environment(workdir: Path, port: int) -> dict[str, str]:
    """The demo's Airflow, its savepoint root and jobs file, an API server on 127.0.0.1:``port``."""
    from airflow_savepoints.demo.__main__ import airflow_environment

    dags = workdir / "dags"
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}  # nothing of the caller's Airflow
    return {
        **base, **airflow_environment(workdir, dags),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(workdir / "airflow" / "console-passwords.json"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR": str(workdir / "savepoints"),
        "AIRFLOW__SAVEPOINTS__JOBS_FILE": str(dags / "jobs.yaml"),
    }


def _airflow(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=env["AIRFLOW_HOME"])
    if done.returncode != 0:
        raise InvalidInputError(f"airflow {' '.join(args)} failed: {done.stderr.strip()[-1500:]}",
                                "run the demo again (make demo) to recreate its Airflow")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5) as answer:  # noqa: S310 - our own server
            return answer.status == 200
    except OSError:
        return False


def _say(line: str) -> None:
    print(line, flush=True)


def serve(workdir: Path, port: int = 8080, say: Callable[[str], None] = _say, timeout: float = 180) -> int:
    """Serve the console on the demo in ``workdir`` until Ctrl-C or SIGTERM; 0 once stopped cleanly."""
    workdir = workdir.resolve()
    if not (workdir / "savepoints").is_dir() or not (workdir / "dags" / "jobs.yaml").is_file():
        raise InvalidInputError(f"{workdir} holds no demo (no savepoints/ or dags/jobs.yaml)",
                                f"run the demo first: make demo, or airflow-savepoints demo --workdir {workdir}")
    env = console_environment(workdir, port)
    if not (workdir / "airflow" / "airflow.db").is_file():  # the demo's database, else a fresh one
        (workdir / "airflow").mkdir(exist_ok=True)
        _airflow(env, "db", "migrate")
    _airflow(env, "dags", "reserialize")
    _airflow(env, "dags", "unpause", "--treat-dag-id-as-regex", "--yes", ".*")
    url = f"http://127.0.0.1:{port}"
    log = workdir / "airflow" / "console-api-server.log"
    with open(log, "ab") as output:
        server = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server"], env=env, stdout=output,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                  cwd=env["AIRFLOW_HOME"])
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C and SIGTERM stop it, also where SIGINT came in ignored (a shell's background job)
    previous = {number: signal.signal(number, interrupt) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = time.monotonic() + timeout
        while not _healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise InvalidInputError(f"the Airflow API server did not start (see {log})",
                                        f"free port {port} (--port), or read the log")
            time.sleep(1)
        password = json.loads(Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).read_text())[USER]
        say(f"the savepoints console: {url}/plugin/savepoints (Browse > Savepoints)\n"
            f"log in as {USER} / {password}; the example DAGs are unpaused (no scheduler runs: actions queue runs)\n"
            f"stop with Ctrl-C; server log: {log}")
        server.wait()
        return server.returncode or 0
    except KeyboardInterrupt:
        say("stopping the console")
        return 0
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _stop(server)


def _stop(server: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM the server's process group (its workers too), SIGKILL after ``grace`` seconds."""
    if server.poll() is None:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        except ProcessLookupError:
            pass
    try:
        os.killpg(server.pid, signal.SIGKILL)  # a worker left behind by its parent
    except (ProcessLookupError, PermissionError):
        pass
