"""A distributed test bed on one machine: real Postgres, Redis, Airflow 3.3 with the CeleryExecutor
and Celery workers that are "hosts" of their own, and a Spark standalone cluster.

Every part listens on 127.0.0.1 on a free port and is stopped at exit, also when a test fails:

- Postgres (the Debian package's ``initdb``/``pg_ctl`` as the ``postgres`` user, in a temp folder)
  holds Airflow's metadata database and Celery's results; Redis is the Celery broker.
- ``tests/support/airflow_cluster.py`` runs the API server, scheduler, DAG processor and triggerer
  with ``CeleryExecutor``. Each Celery worker runs in its own PID, mount and UTS namespace
  (``unshare --pid --fork --mount-proc --uts``): its hostname is its name (``worker-a``, resolved
  by an ``/etc/hosts`` of its own, bind-mounted there), it sees only its own processes, and it
  consumes only the queue of its name, so ``queue="worker-a"`` on a task sends the task there.
  Network and files stay shared, as on hosts that mount one shared folder. Killing a worker's
  namespace pid 1 kills everything in it: an honest host loss.
- Workers serve no logs (``--skip-serve-logs``): the API server reads task logs from the shared
  files. The Execution API URL points at the API server.
- ``tests/support/spark_cluster.py`` runs a Spark standalone master and two workers of 4 cores and 2 GiB
  each (started together): an application can spread its executors over two machines' worth of slots
  (the autoscaler's test scales a job across them).

No worker can import pyspark, as on an Airflow host without it: ``tests/support/no_pyspark/sitecustomize.py``
on its PYTHONPATH blocks the import in the worker and the task processes it forks; what they execute
(spark-submit, a job's driver, the CLI) imports pyspark as usual.

A worker may run with its clock shifted (``clock_offset="+5m"``): libfaketime (Debian ``faketime``)
preloaded into the worker and everything it starts.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from tests.support.airflow_cluster import AirflowCluster, airflow_cluster, free_port, tail
from tests.support.spark_cluster import StandaloneCluster, standalone_cluster

DAGS = Path(__file__).resolve().parents[1] / "distributed_dags"
FAKETIME_LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
NO_PYSPARK = Path(__file__).resolve().parent / "no_pyspark"  # its sitecustomize.py: a worker without pyspark
TERMINAL = ("success", "failed")
CELERY_EXECUTOR = "airflow.providers.celery.executors.celery_executor.CeleryExecutor"
SPARK_WORKERS, SPARK_CORES = 2, 4  # task slots, not CPUs: the jobs that need many wait rather than compute


def postgres_bin() -> Path | None:
    """The newest Debian Postgres server binaries (``/usr/lib/postgresql/<version>/bin``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def missing_parts() -> str | None:
    """Why the test bed cannot run here (``None`` when it can): what is missing and how to get it."""
    if os.geteuid() != 0:
        return "the distributed test bed needs root (unshare for worker namespaces, runuser for Postgres)"
    install = "install it with `make testbed` (apt: postgresql redis-server faketime)"
    if postgres_bin() is None:
        return f"no Postgres server (/usr/lib/postgresql/*/bin/initdb): {install}"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return f"no `postgres` user to run Postgres as: {install}"
    for tool in ("redis-server", "unshare", "nsenter", "runuser"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on PATH: {install}"
    if not Path(FAKETIME_LIBRARY).exists():
        return f"no libfaketime ({FAKETIME_LIBRARY}): {install}"
    return None


# ---- Postgres and Redis ---------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_server(work: Path) -> Iterator[str]:
    """A throw-away Postgres cluster on 127.0.0.1 (trust auth, no fsync); yields the SQLAlchemy URL
    of an empty ``airflow`` database. The cluster lives in the system temp dir (the ``postgres`` user
    must reach it) and is removed at exit; its log (lock waits included) is kept in ``work``."""
    bindir, user = postgres_bin(), pwd.getpwnam("postgres")
    folder = Path(tempfile.mkdtemp(prefix="testbed-postgres-"))
    os.chown(folder, user.pw_uid, user.pw_gid)
    data, port = folder / "data", free_port()

    def as_postgres(*argv: str, timeout: float = 120) -> None:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True,
                              timeout=timeout, cwd=folder, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n"
                                 f"{tail(folder / 'postgres.log')}")

    started = False
    try:
        as_postgres(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "postgres.log"), "-w", "-t", "60",
                    "-o", f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off -c synchronous_commit=off "
                          "-c full_page_writes=off -c max_connections=200 -c log_lock_waits=on "
                          "-c deadlock_timeout=2s", "start")
        started = True
        as_postgres(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "airflow")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/airflow"
    finally:
        if started:
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop", timeout=60)
        with contextlib.suppress(OSError):
            work.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / "postgres.log", work / "postgres.log")
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[str]:
    """A Redis server on 127.0.0.1 with no persistence; yields its URL."""
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "redis.log", "wb") as log:
        process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--dir", str(work)],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "Ready to accept connections" not in (work / "redis.log").read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"redis-server did not start:\n{tail(work / 'redis.log')}")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# ---- the test bed ---------------------------------------------------------------------------------


@dataclass
class Worker:
    """A Celery worker on a "host" of its own: ``process`` is ``unshare`` on the real host; its child
    is the namespace's pid 1, the Celery worker itself."""

    name: str  # its hostname and its queue
    process: subprocess.Popen
    clock_offset: str | None = None

    @property
    def pid1(self) -> int:
        """The host pid of the namespace's pid 1 (the Celery worker)."""
        children = psutil.Process(self.process.pid).children()
        if not children:
            raise AssertionError(f"{self.name}: unshare ({self.process.pid}) has no child (exit code "
                                 f"{self.process.poll()})")
        return children[0].pid


@dataclass
class Testbed:
    __test__ = False  # a test bed, not a test class (pytest collects names starting with Test)

    airflow: AirflowCluster
    spark: StandaloneCluster
    shared: Path  # the folder every host and the Spark cluster see (checkpoints, savepoints, inputs)
    s3_endpoint: str
    database_url: str
    broker_url: str
    workers: dict[str, Worker] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds each part took to start

    # ---- workers ----------------------------------------------------------------------------------

    def start_workers(self, *names: str, clock_offset: str | None = None, timeout: float = 120) -> list[Worker]:
        """Start a Celery worker per name in new PID, mount and UTS namespaces with hostname ``name``,
        serving the queue ``name`` with one slot; ``clock_offset`` (libfaketime syntax, e.g. ``"+5m"``)
        shifts their clocks and those of everything they start. Returns when all report ready."""
        started = [self._launch_worker(name, clock_offset) for name in names]
        deadline = time.monotonic() + timeout
        for worker in started:
            log = self.airflow.log_dir / f"{worker.name}.log"
            while f"celery@{worker.name} ready" not in log.read_text(errors="replace"):
                if worker.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"worker {worker.name} did not become ready (exit code "
                                         f"{worker.process.poll()}):\n{tail(log, 60)}")
                time.sleep(0.5)
        return started

    def _launch_worker(self, name: str, clock_offset: str | None) -> Worker:
        airflow = str(Path(sys.executable).parent / "airflow")
        command = [airflow, "celery", "worker", "--queues", name, "--concurrency", "1", "--skip-serve-logs",
                   "--pid", str(self.airflow.home / f"{name}.pid"), "--without-gossip", "--without-mingle"]
        # a host without pyspark: the worker and its task processes cannot import it, what they execute can
        pythonpath = os.pathsep.join(p for p in (str(NO_PYSPARK), self.airflow.env.get("PYTHONPATH")) if p)
        env = {"PYTHONPATH": pythonpath, "TESTBED_NO_PYSPARK": "1", **self.host_state(name)}
        if clock_offset:
            env |= {"LD_PRELOAD": FAKETIME_LIBRARY, "FAKETIME": clock_offset, "FAKETIME_DONT_RESET": "1",
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        # as on a real host, its name resolves (Java's InetAddress.getLocalHost needs it): an /etc/hosts
        # of its own, bind-mounted in its private mount namespace
        hosts = self.airflow.home / f"{name}.hosts"
        hosts.write_text(f"127.0.0.1 localhost {name}\n::1 localhost ip6-localhost\n")
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--",
                "sh", "-c", 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"', name, str(hosts),
                *command]
        process = self.airflow.start_process(name, argv, env)
        worker = self.workers[name] = Worker(name, process, clock_offset)
        return worker

    def host_state(self, name: str) -> dict[str, str]:
        """A host's own state folder (``XDG_STATE_HOME``): each worker makes its own host run key there, as
        separate machines would, so only the bed's shared ``[savepoints] run_key`` lets one host judge
        another's runs."""
        return {"XDG_STATE_HOME": str(self.airflow.home / f"state-{name}")}

    def kill_worker(self, name: str) -> None:
        """Host loss: SIGKILL the namespace's pid 1; the kernel kills every process in the namespace
        (a Spark driver started there included). The worker is no longer checked as alive."""
        worker = self.workers[name]
        os.kill(worker.pid1, signal.SIGKILL)
        worker.process.wait(30)  # unshare returns once its child is gone
        self.airflow.retire(name)

    def in_worker(self, name: str, argv: list[str], *, clock: bool = True, timeout: float = 120,
                  env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside a worker's namespaces (``nsenter -t PID -p -u -m``), with the test bed's
        environment and, when ``clock``, the worker's clock offset."""
        worker = self.workers[name]
        extra = {**self.host_state(name), **(env or {})}
        if clock and worker.clock_offset:
            extra |= {"LD_PRELOAD": FAKETIME_LIBRARY, "FAKETIME": worker.clock_offset,
                      "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        done = subprocess.run(["nsenter", "-t", str(worker.pid1), "-p", "-u", "-m", "--", *argv],
                              env={**self.airflow.env, **extra}, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=self.shared)
        if check and done.returncode != 0:
            raise AssertionError(f"{argv} in {name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    # ---- DAG runs over REST -----------------------------------------------------------------------

    def wait_for_dags(self, *dag_ids: str, timeout: float = 180) -> None:
        """Until the DAG processor has serialized every one of ``dag_ids`` (no import error allowed)."""
        deadline = time.monotonic() + timeout
        while True:
            errors = self.airflow.get("/api/v2/importErrors")
            assert errors["total_entries"] == 0, errors
            if all(self.airflow.request("GET", f"/api/v2/dags/{d}").status_code == 200 for d in dag_ids):
                return
            self.airflow.check_alive()
            assert time.monotonic() < deadline, f"DAGs {dag_ids} not parsed within {timeout:.0f}s"
            time.sleep(0.25)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run of ``dag_id`` with ``conf``; its run id."""
        run = self.airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                               json={"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.airflow.get(run_path(dag_id, run_id))["state"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 180, poll: float = 0.5) -> str:
        """Until the run ends; its state (``success`` or ``failed``)."""
        deadline = time.monotonic() + timeout
        while (state := self.run_state(dag_id, run_id)) not in TERMINAL:
            self.airflow.check_alive()
            assert time.monotonic() < deadline, (f"{dag_id} {run_id} still {state} after {timeout:.0f}s: "
                                                 f"{self.task_states(dag_id, run_id)}")
            time.sleep(poll)
        return state

    def run(self, dag_id: str, conf: dict[str, Any] | None = None, timeout: float = 180,
            expect: str = "success") -> str:
        """Trigger a run, wait for it, assert it ended ``expect`` (task states and logs otherwise); its id."""
        run_id = self.trigger(dag_id, conf)
        state = self.wait_run(dag_id, run_id, timeout)
        if state != expect:
            raise AssertionError(f"{dag_id} {run_id} ended {state}, expected {expect}: "
                                 f"{self.task_states(dag_id, run_id)}\n{self.failed_logs(dag_id, run_id)}")
        return run_id

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        tis = self.airflow.get(f"{run_path(dag_id, run_id)}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in tis}

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {task: ti["state"] for task, ti in self.task_instances(dag_id, run_id).items()}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        value = self.airflow.get(f"{run_path(dag_id, run_id)}/taskInstances/{task_id}/xcomEntries/{key}")["value"]
        return json.loads(value) if isinstance(value, str) else value

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task's log as the REST API serves it (read from the shared log folder)."""
        answer = self.airflow.api("GET", f"{run_path(dag_id, run_id)}/taskInstances/{task_id}/logs/{try_number}",
                                  params={"full_content": "true"}, headers={"Accept": "application/json"})
        return "\n".join(entry if isinstance(entry, str) else json.dumps(entry) for entry in answer["content"])

    def failed_logs(self, dag_id: str, run_id: str, lines: int = 40) -> str:
        parts = []
        for task, ti in self.task_instances(dag_id, run_id).items():
            if ti["state"] not in ("success", "skipped") and ti.get("try_number"):
                with contextlib.suppress(AssertionError):
                    log = self.task_log(dag_id, run_id, task, ti["try_number"])
                    parts.append(f"--- {task} ({ti['state']}, on {ti.get('hostname')}):\n"
                                 + "\n".join(log.splitlines()[-lines:]))
        return "\n".join(parts)

    def diagnostics(self) -> str:
        return f"{self.airflow.diagnostics()}\n===== spark\n{self.spark.log_tails()}"


@contextlib.contextmanager
def timed(timings: dict[str, float], part: str) -> Iterator[None]:
    """Record in ``timings`` how many seconds the body took."""
    started = time.monotonic()
    yield
    timings[part] = round(time.monotonic() - started, 1)


def timed_call(timings: dict[str, float], part: str, call: Any) -> Any:
    with timed(timings, part):
        return call()


def run_path(dag_id: str, run_id: str) -> str:
    return f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"


@contextlib.contextmanager
def distributed_testbed(work: Path, s3_endpoint: str, workers: tuple[str, ...] = ("worker-a", "worker-b"),
                        env: dict[str, str] | None = None, dags_folder: Path = DAGS) -> Iterator[Testbed]:
    """Start Postgres, Redis, a Spark standalone cluster, Airflow with the CeleryExecutor and one
    Celery worker per name in ``workers``; stop everything at exit, also when the body fails.

    ``env`` reaches every Airflow component, worker and task (connections, the S3 endpoint, ...)."""
    reason = missing_parts()
    if reason:
        raise RuntimeError(reason)
    shared = work / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        with timed(timings, "postgres"):
            database_url = stack.enter_context(postgres_server(work / "postgres"))
        with timed(timings, "redis"):
            broker_url = stack.enter_context(redis_server(work / "redis"))
        # the Spark cluster starts in a thread while Airflow migrates its database and starts
        spark_port, spark_web = free_port(), free_port()
        spark_start = standalone_cluster(work / "spark", port=spark_port, web_port=spark_web, cores=SPARK_CORES,
                                         memory="2g", workers=SPARK_WORKERS)
        pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="spark-start"))
        spark_started = pool.submit(timed_call, timings, "spark", spark_start.__enter__)

        def stop_spark(*_exc_info: object) -> bool:
            if spark_started.exception() is None:  # waits for the start; a failed start cleaned up itself
                spark_start.__exit__(None, None, None)
            return False

        stack.push(stop_spark)
        celery = {
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{database_url}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "socket.gethostname",  # no DNS look-up of "worker-a"
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "TESTBED_SHARED": str(shared),
            "TESTBED_SPARK_MASTER": f"spark://127.0.0.1:{spark_port}",
            "TESTBED_SPARK_WEB": f"http://127.0.0.1:{spark_web}",
            "TESTBED_S3_ENDPOINT": s3_endpoint,
        }
        with timed(timings, "airflow"):
            cluster = stack.enter_context(airflow_cluster(work / "airflow", dags_folder, {**celery, **(env or {})},
                                                          executor=CELERY_EXECUTOR, database_url=database_url))
        spark = spark_started.result()
        bed = Testbed(cluster, spark, shared, s3_endpoint, database_url, broker_url, timings=timings)
        try:
            with timed(timings, "workers"):
                bed.start_workers(*workers)
            yield bed
        except BaseException:
            print(f"===== spark\n{spark.log_tails()}")  # the Airflow parts print theirs on the way out
            raise
