"""Start streaming jobs detached and record them (the local runner's side of a start).

A started job is recorded in ``<savepoint dir>/<job>/_run.json`` (run id, pid and its start time,
host, log file, command, control folder, master), so a later task on any worker or an engineer at
a terminal finds it. Its progress comes from its checkpoint: the newest ``commits/N`` and when it
was written. Whether it runs, and how it is stopped, is the run object's business
(:mod:`airflow_savepoints.jobs.workflows.run`): nothing here compares hosts or signals a process, and
nothing here imports the lifecycle.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.core.redaction import redact_command
from airflow_savepoints.errors import JobFailedError
from airflow_savepoints.jobs.description import trust
from airflow_savepoints.jobs.description.channel import CONTROL_FOLDER, new_run_id
from airflow_savepoints.jobs.description.files import process_started
from airflow_savepoints.jobs.description.record import JobRun, write_run
from airflow_savepoints.jobs.launch.runners import LocalRunner
from airflow_savepoints.storage import Store


def spark_submit_command(job, checkpoint: str, conf: dict[str, str]) -> list[str]:
    """A plain ``spark-submit`` command line for ``job`` (a :class:`StreamingJob`), without Airflow:
    what the CLI runs (operators build theirs with the Spark provider, which reads connections).
    ``{checkpoint}`` in the application arguments becomes ``checkpoint``."""
    command = ["spark-submit", "--master", job.master, "--deploy-mode", job.deploy_mode, "--name", job.name]
    for key, value in {**job.spark_conf, **conf}.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, job.application, *(a.replace("{checkpoint}", checkpoint) for a in job.application_args)]


def _resolve_binary(command: list[str]) -> list[str]:
    """Find ``spark-submit`` on PATH or beside this interpreter (a virtualenv's bin/)."""
    if os.sep in command[0] or shutil.which(command[0]):
        return command
    beside = Path(sys.executable).parent / command[0]
    return [str(beside), *command[1:]] if beside.exists() else command


def process_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs here (a zombie, exited but not reaped, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*-\d{8}T\d{6}(\d{6})?\.log")  # what start_detached and rescale name
LOG_TAIL_BYTES = 64 * 1024


def _read_log(path: str | None, size: int, *, tail: bool = False) -> str:
    """A driver log named by a run file, if it is one this tool names (``<job>-<UTC time>.log``), a
    regular file and no link (a run file chooses no other file to show): its first (``tail``: last)
    ``size`` bytes."""
    if not path or LOG_NAME.fullmatch(os.path.basename(path)) is None:
        return ""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(descriptor, "rb") as log:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return ""
        if tail:
            log.seek(max(0, os.fstat(descriptor).st_size - size))
        return log.read(size).decode(errors="replace")


def log_tail(path: str | None, lines: int = 25) -> str:
    try:
        return "\n".join(_read_log(path, LOG_TAIL_BYTES, tail=True).splitlines()[-lines:])
    except OSError:
        return ""


def new_control_folder(job_folder: Store, run_id: str | None = None) -> Store:
    """The control folder of a run (a fresh run id if none is given) of the job in ``job_folder``."""
    return job_folder.child(CONTROL_FOLDER).child(run_id or new_run_id())


# a standalone driver's "... with app ID app-…"; spark-submit's "Submitted application application_…" on YARN
APP_ID_IN_LOG = re.compile(r"app ID (app-\d{14}-\d{4,})|Submitted application (application_\d+_\d+)")


def application_id_from_log(path: str | None) -> str | None:
    """The application id a driver or spark-submit logs: a standalone master's (``... with app ID app-…``),
    YARN's (``Submitted application application_…``)."""
    try:
        found = APP_ID_IN_LOG.search(_read_log(path, 4 * 1024 * 1024))
    except OSError:
        return None
    return (found.group(1) or found.group(2)) if found is not None else None


def start_detached(job: str, command: list[str], checkpoint: Store, job_folder: Store, log_dir: Path,
                   env: dict[str, str] | None = None, control: Store | None = None, secrets: list[str] | tuple = (),
                   **recorded: Any) -> JobRun:
    """Start ``command`` in its own session (it outlives the caller) and record the run.

    ``control``: the control folder passed to the job in its command (``spark.savepoints.control``);
    its name is the run id (else a fresh one). ``secrets``: values the recorded command shows as ``***``
    (besides the ``--conf`` of secret-looking keys); the process gets them. ``recorded``: further fields
    of the run record (``master``, ``master_ui``, ``version``). The process gets the run's token in its
    environment (:func:`~airflow_savepoints.jobs.description.trust.run_token`): the proof, never
    written anywhere, that lets the local runner signal it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{job}-{datetime.now(UTC):%Y%m%dT%H%M%S}.log"
    start_batch, _ = checkpoint_progress(checkpoint)
    run_id = control.name if control else new_run_id()
    secrets_env = {trust.RUN_TOKEN_ENV: trust.run_token(job, run_id),
                   trust.RUN_SECRET_ENV: f"{run_id}:{trust.channel_secret(job, run_id)}"}
    process = spawn_submit(command, log_file, {**(env or {}), **secrets_env})
    run = JobRun(job=job, pid=process.pid, pid_started=process_started(process.pid), host=socket.gethostname(),
                 command=redact_command(list(process.args), secrets), log_file=str(log_file), checkpoint=checkpoint.url,
                 started_at=datetime.now(UTC), start_batch=start_batch, control=control.url if control else None,
                 run_id=run_id, **recorded)
    write_run(job_folder, run)
    return run


def spawn_submit(command: list[str], log_file: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a submit command in a session of its own, its output appended to ``log_file``, with this
    Python's bin folder first on PATH and as PySpark's Python unless set."""
    child_env = {**os.environ, **(env or {})}
    child_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{child_env.get('PATH', '')}"
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    with open(log_file, "ab") as log:
        return subprocess.Popen(_resolve_binary(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=child_env)


def wait_for_commit(run: JobRun, checkpoint: Store, timeout: float = 300, poll: float = 1.0) -> int:
    """Wait until the run commits a batch newer than when it started; fail fast if it dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch, _ = checkpoint_progress(checkpoint)
        if batch is not None and (run.start_batch is None or batch > run.start_batch):
            return batch
        if LocalRunner().status(run.target()).state == "ended":
            raise JobFailedError(
                f"job '{run.job}' (pid {run.pid}) exited before committing a batch; last log lines:\n"
                + log_tail(run.log_file),
                f"see the full log in {run.log_file}",
            )
        time.sleep(poll)
    raise JobFailedError(f"job '{run.job}' committed no batch within {timeout:.0f}s",
                         f"see its log in {run.log_file}; it is still running as pid {run.pid}")


