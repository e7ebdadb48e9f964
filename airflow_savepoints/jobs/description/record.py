"""A run's record (``<savepoint dir>/<job>/_run.json``) and where its driver is.

A started job is recorded (run id, pid and its start time, host, log file, command, control
folder, master), so a later task on any worker or an engineer at a terminal finds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from airflow_savepoints.core.models import SavepointInfo, SavepointManifest
from airflow_savepoints.core.names import RUN_FILE
from airflow_savepoints.core.pointer import latest_savepoint
from airflow_savepoints.errors import InvalidInputError, NotLiveCheckpointError
from airflow_savepoints.jobs.description.files import read_json, tolerant
from airflow_savepoints.storage import Store


@dataclass
class RunTarget:
    """Where a run's driver is, as far as the run record and its lease say."""

    job: str
    host: str | None = None
    run_id: str | None = None  # with the job's name, what the driver's token is made of (jobs/description/trust.py)
    pid: int | None = None
    pid_started: float | None = None  # the process's create_time (psutil), to tell a reused pid
    application_id: str | None = None
    master: str | None = None  # from the job's configuration (jobs.yaml, the Spark connection), never a run file
    master_ui: str | None = None
    driver_pod: str | None = None
    app_name: str | None = None  # the application's name at the master (spark-submit --name); default: job


class JobRun(BaseModel):
    """One launched run of a streaming job (``_run.json``: read through :func:`read_run`, which checks it)."""

    model_config = ConfigDict(allow_inf_nan=False)

    job: str
    pid: int | None = Field(default=None, gt=0)  # None: started by another tool (the driver holds the lease itself)
    host: str | None = None
    command: list[str] = []
    log_file: str | None = None
    checkpoint: str
    started_at: datetime
    run_id: str | None = None  # the fencing token (the control folder's name)
    pid_started: float | None = None  # the process's start time, so a reused pid is never taken for it
    master: str | None = None
    master_ui: str | None = None  # a standalone master's web UI
    application_id: str | None = None  # from the driver's log (a job without the helper) or its lease
    start_batch: int | None = None  # newest committed batch before the start (None: fresh checkpoint)
    control: str | None = None  # the run's control folder (see airflow_savepoints.jobs.driver.control)
    ended: Literal["stopped", "cancelled", "failed"] | None = None  # set once the run's end is handled
    ended_at: datetime | None = None
    termination: dict[str, Any] | None = None  # what was done about it (the checkpoint retention outcome)
    version: dict[str, Any] | None = None  # the job's version it runs (see JobVersion: application, args, conf, hash)


    def target(self, master: str | None = None, master_ui: str | None = None) -> RunTarget:
        """Where the driver is: the record's facts, with the runner's addresses the caller's
        configuration gives (``master``, ``master_ui``), never the record's ``master``/``master_ui``."""
        return RunTarget(job=self.job, host=self.host, run_id=self.run_id, pid=self.pid, pid_started=self.pid_started,
                         application_id=self.application_id, master=master, master_ui=master_ui)


def write_run(job_folder: Store, run: JobRun) -> None:
    job_folder.write_bytes_atomic(RUN_FILE, run.model_dump_json(indent=1).encode())


def read_run(job_folder: Store, warnings: list[str] | None = None) -> JobRun | None:
    """The run record; None if there is none, or (with a warning naming it) it is damaged beyond use."""
    data = read_json(job_folder, RUN_FILE, warnings)
    return tolerant(JobRun, data, job_folder.url_of(RUN_FILE), warnings) if data is not None else None


def record_end(job_folder: Store, run: JobRun, ended: Literal["stopped", "cancelled", "failed"],
               termination: dict[str, Any] | None = None) -> JobRun:
    """Mark the recorded run as ended (once handled), unless a newer run was recorded meanwhile."""
    current = read_run(job_folder)
    finished = run.model_copy(update={"ended": ended, "ended_at": datetime.now(UTC), "termination": termination})
    if current is not None and (current.run_id, current.pid, current.started_at) == (run.run_id, run.pid, run.started_at):
        job_folder.write_bytes_atomic(RUN_FILE, finished.model_dump_json(indent=1).encode())
    return finished


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two checkpoint URLs name one location (a trailing slash aside)."""
    return a.rstrip("/") == b.rstrip("/")


def refuse_left_checkpoint(job_folder: Store, job: str, checkpoint: str, *, retired: bool = False) -> None:
    """Refuse a savepoint of ``checkpoint`` when the job's recorded run writes another checkpoint: a
    restart from a savepoint moves a job to ``<checkpoint>-<time>``, and the one it left is stale.
    ``retired``: the caller means a checkpoint the job has left, and is refused if it is the live one."""
    run = read_run(job_folder)
    live = run is None or not run.checkpoint or same_checkpoint(run.checkpoint, checkpoint)
    if retired and live:
        raise InvalidInputError(
            f"checkpoint {checkpoint} is not one job '{job}' has left: " + (
                "its recorded run writes it" if run is not None and run.checkpoint else "the job has no recorded run"),
            "leave --retired-checkpoint (retired_checkpoint=True) out; nothing was copied")
    if live or retired:
        return
    raise NotLiveCheckpointError(
        f"job '{job}' has left checkpoint {checkpoint}: its run {run.run_id or '(no id)'}, started "
        f"{run.started_at:%Y-%m-%d %H:%M:%S} UTC, writes {run.checkpoint}; nothing was copied",
        f"take the live query's savepoint with `airflow-savepoints job savepoint {job}` (or leave checkpoint= "
        "out of TriggerSavepointOperator); to keep a copy of the old checkpoint anyway, pass --retired-checkpoint "
        "(retired_checkpoint=True): that savepoint is never a restore default",
    )


def in_lineage(run: JobRun | None) -> Callable[[SavepointManifest], bool]:
    """Whether a savepoint belongs to the job's current lineage: taken of the recorded run's checkpoint,
    or before that run started (a savepoint of a checkpoint the job had already left is not)."""
    def accept(manifest: SavepointManifest) -> bool:
        return run is None or same_checkpoint(manifest.checkpoint, run.checkpoint) or manifest.created_at <= run.started_at
    return accept


def restore_default(root: Store, job: str) -> SavepointInfo | None:
    """The savepoint a start without ``--from`` restores: the newest of the job's current lineage
    (:func:`in_lineage`), never one taken of a checkpoint the job has left."""
    return latest_savepoint(root, job, in_lineage(read_run(root.child(job))))
