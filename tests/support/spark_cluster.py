"""A real Spark standalone cluster (one master, one worker or more) started from pyspark's own jars.

``standalone_cluster`` starts one for its caller (the distributed test bed, on ports it names, two
workers); ``spark_standalone`` is the session's: one master and worker shared by the tests that only need a
cluster to run a job on (tests/test_job_control.py, tests/test_lifecycle.py). Two JVMs and their
registration took 28 s at load 6 per start; each test tells its own application by its id."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class StandaloneCluster:
    master_url: str  # spark://127.0.0.1:PORT
    web_url: str  # the master's web UI (its /json/ endpoint lists applications)
    logs: Path

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=10) as response:
            return json.load(response)

    def app_ids(self, which: str) -> list[str]:
        """``which``: "activeapps" or "completedapps"."""
        return [app["id"] for app in self.state().get(which, [])]

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:])
                         for p in sorted(self.logs.glob("*.log")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _wait_for(predicate, timeout: float, what: str, cluster: StandaloneCluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if predicate():
                return
        time.sleep(0.5)
    raise TimeoutError(f"{what} within {timeout}s\n{cluster.log_tails()}")


@contextlib.contextmanager
def standalone_cluster(work: Path, cores: int = 2, memory: str = "1g", port: int | None = None,
                       web_port: int | None = None, workers: int = 1) -> Iterator[StandaloneCluster]:
    """Start a master (on ``port`` and ``web_port``, free ports by default) and ``workers`` workers (each
    with ``cores`` and ``memory``, started together) bound to 127.0.0.1; stop them all (their process
    groups) at exit."""
    home = _spark_home()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_WORKER_DIR": str(work / "worker")}
    port, web = port or _free_port(), web_port or _free_port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web}", work)
    spark_class = str(home / "bin" / "spark-class")
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                   "--webui-port", str(web)],
        **{name: [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", "127.0.0.1",
                  "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
                  "--work-dir", str(work / name)]
           for name in ["worker", *(f"worker{n}" for n in range(2, workers + 1))]},
    }
    processes: list[subprocess.Popen] = []
    try:
        for name, command in commands.items():
            with open(work / f"{name}.log", "wb") as log:
                processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                  stdin=subprocess.DEVNULL, start_new_session=True))
            if name == "master":
                _wait_for(lambda: cluster.state()["status"] == "ALIVE", 90, "the master did not come up", cluster)
        _wait_for(lambda: sum(w["state"] == "ALIVE" for w in cluster.state()["workers"]) >= workers, 90,
                  f"not all {workers} worker(s) registered", cluster)
        yield cluster
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory) -> Iterator[StandaloneCluster]:
    """The session's standalone cluster (2 cores, 1 GB), started by the first test that asks for it.
    A test leaves no application running (each stops or kills its own in a ``finally``): the worker's
    cores are the next test's."""
    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster
