"""A run's record (``<savepoint dir>/<job>/_run.json``) and where its driver is.

A started job is recorded (run id, pid and its start time, host, log file, command, control
folder, master), so a later task on any worker or an engineer at a terminal finds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from airflow_savepoints.core.names import RUN_FILE
from airflow_savepoints.jobs.description.files import read_json, tolerant
from airflow_savepoints.storage import Store


@dataclass
class RunTarget:
    """Where a run's driver is, as far as the run record and its lease say."""

    job: str
    host: str | None = None
    pid: int | None = None
    pid_started: float | None = None  # the process's create_time (psutil), to tell a reused pid
    application_id: str | None = None
    master: str | None = None
    master_ui: str | None = None
    driver_pod: str | None = None


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


    def target(self) -> RunTarget:
        return RunTarget(job=self.job, host=self.host, pid=self.pid, pid_started=self.pid_started,
                         application_id=self.application_id, master=self.master, master_ui=self.master_ui)


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
