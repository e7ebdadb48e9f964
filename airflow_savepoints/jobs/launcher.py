"""Start streaming jobs detached, watch them, stop them (local and client-mode drivers).

A started job is recorded in ``<savepoint dir>/<job>/_run.json`` (pid, host, log file, command,
control folder), so any later task or an engineer at a terminal finds it. Its progress comes from
its checkpoint: the newest ``commits/N`` and when it was written. A job that cooperates (see
:mod:`airflow_savepoints.jobs.control`) is stopped between two batches; any other with signals.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs.control import JobControl
from airflow_savepoints.storage import Store

RUN_FILE = "_run.json"
CONTROL_FOLDER = "_control"


class JobFailedError(SavepointError):
    code = "job_failed"


class JobRun(BaseModel):
    """One launched run of a streaming job."""

    job: str
    pid: int
    host: str
    command: list[str]
    log_file: str
    checkpoint: str
    started_at: datetime
    start_batch: int | None = None  # newest committed batch before the start (None: fresh checkpoint)
    control: str | None = None  # the run's control folder (see airflow_savepoints.jobs.control)
    ended: Literal["stopped", "cancelled", "failed"] | None = None  # set once the run's end is handled
    ended_at: datetime | None = None
    termination: dict[str, Any] | None = None  # what was done about it (the checkpoint retention outcome)


class JobStatus(BaseModel):
    job: str
    running: bool
    pid: int | None
    application_id: str | None = None  # what a cooperating job announced (local-…, app-…)
    last_committed_batch: int | None
    last_progress_at: datetime | None


def checkpoint_progress(checkpoint: Store) -> tuple[int | None, datetime | None]:
    """The newest committed batch of a checkpoint and when its commit file was written."""
    listing = checkpoint.list_files("commits")
    batches = {int(p): p for p in listing if p.isdigit()}
    if not batches:
        return None, None
    newest = max(batches)
    try:
        info = checkpoint.fs.info(checkpoint.path_of(f"commits/{newest}"))
    except FileNotFoundError:
        return newest, None
    mtime = info.get("mtime") or info.get("LastModified")
    if isinstance(mtime, (int, float)):
        mtime = datetime.fromtimestamp(mtime, UTC)
    return newest, mtime


def _resolve_binary(command: list[str]) -> list[str]:
    """Find ``spark-submit`` on PATH or beside this interpreter (a virtualenv's bin/)."""
    if os.sep in command[0] or shutil.which(command[0]):
        return command
    beside = Path(sys.executable).parent / command[0]
    return [str(beside), *command[1:]] if beside.exists() else command


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def log_tail(path: str, lines: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def new_control_folder(job_folder: Store) -> Store:
    """A fresh control folder for the next run of the job in ``job_folder``."""
    return job_folder.child(CONTROL_FOLDER).child(f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}")


def start_detached(job: str, command: list[str], checkpoint: Store, job_folder: Store, log_dir: Path,
                   env: dict[str, str] | None = None, control: Store | None = None) -> JobRun:
    """Start ``command`` in its own session (it outlives the caller) and record the run.

    ``control``: the control folder passed to the job in its command (``spark.savepoints.control``).
    The previous run's control folder is removed once that run has ended.
    """
    previous = read_run(job_folder)
    if previous and previous.control and previous.control != (control.url if control else None) \
            and not (previous.host == socket.gethostname() and process_alive(previous.pid)):
        name = previous.control.rstrip("/").rsplit("/", 1)[-1]
        if job_folder.child(CONTROL_FOLDER).child(name).url == previous.control:
            job_folder.child(CONTROL_FOLDER).remove_tree(name)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{job}-{datetime.now(UTC):%Y%m%dT%H%M%S}.log"
    start_batch, _ = checkpoint_progress(checkpoint)
    command = _resolve_binary(command)
    child_env = {**os.environ, **(env or {})}
    child_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{child_env.get('PATH', '')}"
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env=child_env)
    run = JobRun(job=job, pid=process.pid, host=socket.gethostname(), command=command, log_file=str(log_file),
                 checkpoint=checkpoint.url, started_at=datetime.now(UTC), start_batch=start_batch,
                 control=control.url if control else None)
    job_folder.write_bytes_atomic(RUN_FILE, run.model_dump_json(indent=1).encode())
    return run


def wait_for_commit(run: JobRun, checkpoint: Store, timeout: float = 300, poll: float = 1.0) -> int:
    """Wait until the run commits a batch newer than when it started; fail fast if it dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch, _ = checkpoint_progress(checkpoint)
        if batch is not None and (run.start_batch is None or batch > run.start_batch):
            return batch
        if not process_alive(run.pid):
            raise JobFailedError(
                f"job '{run.job}' (pid {run.pid}) exited before committing a batch; last log lines:\n"
                + log_tail(run.log_file),
                f"see the full log in {run.log_file}",
            )
        time.sleep(poll)
    raise JobFailedError(f"job '{run.job}' committed no batch within {timeout:.0f}s",
                         f"see its log in {run.log_file}; it is still running as pid {run.pid}")


def read_run(job_folder: Store) -> JobRun | None:
    try:
        return JobRun.model_validate_json(job_folder.read_bytes(RUN_FILE))
    except FileNotFoundError:
        return None


def record_end(job_folder: Store, run: JobRun, ended: Literal["stopped", "cancelled", "failed"],
               termination: dict[str, Any] | None = None) -> JobRun:
    """Mark the recorded run as ended (once handled), unless a newer run was recorded meanwhile."""
    current = read_run(job_folder)
    finished = run.model_copy(update={"ended": ended, "ended_at": datetime.now(UTC), "termination": termination})
    if current is not None and (current.pid, current.started_at) == (run.pid, run.started_at):
        job_folder.write_bytes_atomic(RUN_FILE, finished.model_dump_json(indent=1).encode())
    return finished


def found_failed(run: JobRun | None) -> str | None:
    """Why the recorded run counts as failed: it ended without being stopped or cancelled here.

    None while it runs, once its end was handled, or when its state cannot be seen from here."""
    if run is None or run.ended is not None:
        return None
    control = run_control(run)
    failure = control.failure() if control else None
    if failure is not None:
        return f"the query failed: {failure.get('error', 'unknown error')}"
    if run.host == socket.gethostname() and not process_alive(run.pid):
        stopped = control.stopped() if control else None
        if stopped is not None:
            return None  # it acknowledged a stop request: a stop, not a failure
        return f"its process (pid {run.pid}) exited without a stop request; last log lines:\n{log_tail(run.log_file)}"
    return None


def handle_failed_run(job: str, job_folder: Store, savepoint_root: Store, policy: str) -> dict[str, Any] | None:
    """If the recorded run failed and that was not handled yet: apply the checkpoint retention
    policy for a failure (keep and register, or delete) and mark the run ended. Returns what was
    done, with the reason; None when the run has not failed (or its failure was handled before)."""
    from airflow_savepoints.core.termination import apply_checkpoint_retention

    run = read_run(job_folder)
    reason = found_failed(run)
    if run is None or reason is None:
        return None
    outcome = apply_checkpoint_retention(run.checkpoint, job, policy, "failed", savepoint_dir=savepoint_root)
    outcome = {**outcome, "reason": reason, "pid": run.pid}
    record_end(job_folder, run, "failed", outcome)
    return outcome


def run_control(run: JobRun) -> JobControl | None:
    return JobControl(Store(run.control)) if run.control else None


def job_status(job: str, job_folder: Store) -> JobStatus:
    """Whether the job's recorded run is alive, its application id, and its checkpoint's progress."""
    run = read_run(job_folder)
    if run is None:
        return JobStatus(job=job, running=False, pid=None, last_committed_batch=None, last_progress_at=None)
    running = run.host == socket.gethostname() and process_alive(run.pid)
    control = run_control(run)
    announced = control.announcement() if control else None
    batch, at = checkpoint_progress(Store(run.checkpoint))
    return JobStatus(job=job, running=running, pid=run.pid, application_id=(announced or {}).get("application_id"),
                     last_committed_batch=batch, last_progress_at=at)


def stop_run(run: JobRun, grace: float = 60, request_id: str = "stop") -> dict:
    """Stop a run: between two batches if it cooperates, else (or if that takes longer than
    ``grace``) with signals. Returns how: ``{"method": "cooperative"|"signal"|"not_running", ...}``."""
    _require_this_host(run)
    if not process_alive(run.pid):
        return {"method": "not_running", "pid": run.pid}
    control = run_control(run)
    if control is not None and control.announcement() is not None:
        control.request_stop(request_id)
        acknowledged = control.wait_until_stopped(request_id, timeout=grace)
        deadline = time.monotonic() + grace
        while acknowledged and process_alive(run.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if acknowledged and not process_alive(run.pid):
            return {"method": "cooperative", "pid": run.pid, "acknowledgement": acknowledged}
    stop_process(run, grace)
    return {"method": "signal", "pid": run.pid}


def stop_process(run: JobRun, grace: float = 60) -> bool:
    """SIGTERM the run's process group, SIGKILL after ``grace`` seconds. True if it was running."""
    _require_this_host(run)
    if not process_alive(run.pid):
        return False
    with_signal(run.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not process_alive(run.pid):
            return True
        time.sleep(0.5)
    with_signal(run.pid, signal.SIGKILL)
    return True


def _require_this_host(run: JobRun) -> None:
    if run.host != socket.gethostname():
        raise JobFailedError(f"job '{run.job}' runs on {run.host}, not here",
                             "stop it from that host or through its cluster manager (see docs/airflow.md)")


def with_signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the whole session: spark-submit and its JVM and Python workers
    except ProcessLookupError:
        pass


def committed_past(checkpoint: Store, after_batch: int, run: JobRun | None) -> int | None:
    """The newest committed batch if it is past ``after_batch``, else None (keep waiting).

    Raises :class:`JobFailedError` when the job's recorded run (on this host) has exited, so a
    waiting sensor fails with a reason instead of hanging.
    """
    batch, _ = checkpoint_progress(checkpoint)
    if batch is not None and batch > after_batch:
        return batch
    if run is not None and run.host == socket.gethostname() and not process_alive(run.pid):
        raise JobFailedError(
            f"job '{run.job}' (pid {run.pid}) is not running; its last committed batch is {batch}, "
            f"waiting for one past {after_batch}. Last log lines:\n{log_tail(run.log_file)}",
            f"see {run.log_file}; restart it with restore_from_savepoint",
        )
    return None
