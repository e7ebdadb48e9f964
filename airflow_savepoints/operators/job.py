"""Operators that start (from a savepoint), stop and cancel streaming jobs."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowSkipException

from airflow_savepoints.core import (
    SavepointType,
    resolve_pointer,
    restore_savepoint,
    take_savepoint,
)
from airflow_savepoints.core.pointer import latest_savepoint
from airflow_savepoints.core.settings import parse_duration
from airflow_savepoints.core.termination import apply_checkpoint_retention, parse_policy
from airflow_savepoints.errors import InvalidInputError, SavepointError
from airflow_savepoints.hooks.savepoint import SavepointStorageHook
from airflow_savepoints.hooks.streaming_job import SparkStreamingJobHook
from airflow_savepoints.jobs import StreamingJob, load_jobs
from airflow_savepoints.jobs.control import CONTROL_CONF
from airflow_savepoints.jobs.launcher import (
    JobFailedError,
    handle_failed_run,
    job_status,
    new_control_folder,
    process_alive,
    read_run,
    record_end,
    start_detached,
    stop_process,
    stop_run,
    wait_for_commit,
)
from airflow_savepoints.operators.savepoint import RemovesPartialSavepoint, task_request_id
from airflow_savepoints.storage import Store

if TYPE_CHECKING:
    from airflow.sdk import Context


class NoSavepointError(SavepointError):
    code = "no_savepoint"


class _JobOperator(BaseOperator):
    """Shared parts: the job, looked up by name in a jobs file at run time, and its savepoint folder.

    :param job: the job's name in ``jobs_file`` (templated)
    :param jobs_file: the YAML file of jobs (``dags/jobs.yaml`` in the examples)
    :param savepoints_conn_id: a ``savepoints`` connection
    """

    def __init__(self, *, job: str, jobs_file: str, savepoints_conn_id: str = "savepoints_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.jobs_file = jobs_file
        self.savepoints_conn_id = savepoints_conn_id

    @property
    def streaming_job(self) -> StreamingJob:
        jobs = load_jobs(self.jobs_file)
        if self.job not in jobs:
            raise InvalidInputError(f"no job named {self.job!r} in {self.jobs_file}",
                                    f"use one of: {', '.join(sorted(jobs))}")
        return jobs[self.job]

    def savepoint_root(self, job: StreamingJob) -> Store:
        return SavepointStorageHook(self.savepoints_conn_id).get_store(job.savepoint_dir)

    def log_dir(self) -> Path:
        return Path(conf.get("logging", "base_log_folder", fallback="/tmp")) / "streaming-jobs"


class RestoreJobOperator(_JobOperator):
    """Start a job from its latest (or a given) savepoint in a fresh checkpoint location.

    The task ends once the job has committed its first batch; the job keeps running detached.
    Starting with empty state happens only with ``fresh_start=True``.

    :param pointer: a savepoint to restore (templated); default: the job's newest completed savepoint
    :param fresh_start: start with empty state in the job's checkpoint location (must be empty)
    :param max_age: refuse a savepoint older than this (``12h``, ``7d``; templated)
    :param target_checkpoint: where to restore (templated); default ``<checkpoint>-<UTC time>``
    :param wait_timeout: seconds to wait for the first committed batch
    """

    template_fields: Sequence[str] = ("job", "pointer", "fresh_start", "max_age", "target_checkpoint")

    def __init__(self, *, pointer: str | None = None, fresh_start: bool | str = False, max_age: str | None = None,
                 target_checkpoint: str | None = None, wait_timeout: float = 300, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pointer = pointer
        self.fresh_start = fresh_start
        self.max_age = max_age
        self.target_checkpoint = target_checkpoint
        self.wait_timeout = wait_timeout

    def _latest_savepoint(self, root: Store) -> str:
        job = self.streaming_job
        latest = latest_savepoint(root, job.name)
        if latest is None:
            raise NoSavepointError(
                f"job '{job.name}' has no completed savepoint in {root.url}",
                "pass a pointer, or fresh_start=True to start it with empty state",
            )
        return latest.pointer

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.streaming_job
        root = self.savepoint_root(job)
        previous = read_run(root.child(job.name))
        if previous is not None and previous.host == socket.gethostname() and process_alive(previous.pid):
            raise InvalidInputError(
                f"job '{job.name}' is already running as pid {previous.pid} on checkpoint {previous.checkpoint}; "
                "a second run would write the same sink twice",
                "stop it first (stop_job_with_savepoint), then restore",
            )
        pointer, max_age = self.pointer or None, self.max_age or None  # "" from a Param: not given
        fresh_start = str(self.fresh_start).strip().lower() in ("true", "1", "yes")
        restored: dict[str, Any] | None = None
        extra_conf: dict[str, str] = {}
        if fresh_start:
            checkpoint = self.target_checkpoint or job.checkpoint
            if Store(checkpoint).list_files():
                raise InvalidInputError(
                    f"fresh_start needs an empty checkpoint location, but {checkpoint} holds files",
                    "restore from a savepoint instead, or give an empty target_checkpoint",
                )
            self.log.info("starting job %s with EMPTY state (fresh_start=True) at %s", job.name, checkpoint)
        else:
            pointer = pointer or self._latest_savepoint(root)
            if max_age is not None:
                _, manifest = resolve_pointer(pointer, root.storage_options)
                if manifest.age_seconds() > parse_duration(max_age):
                    raise InvalidInputError(
                        f"savepoint {pointer} is {manifest.age_seconds() / 3600:.1f} h old, older than "
                        f"max_age {max_age}",
                        "take a fresh savepoint, raise max_age, or pass the pointer you mean",
                    )
            checkpoint = self.target_checkpoint or f"{job.checkpoint.rstrip('/')}-{datetime.now(UTC):%Y%m%dT%H%M%S}"
            sink = job.sink.path if job.sink and job.sink.kind == "file" else None
            result = restore_savepoint(pointer, checkpoint, sink_path=sink, storage_options=root.storage_options)
            restored = result.model_dump(mode="json")
            extra_conf = result.spark_conf_to_set
            self.log.info("restored %s (batch %s) into %s", pointer, result.batch_id, checkpoint)
        control = new_control_folder(root.child(job.name))
        command = SparkStreamingJobHook(job).submit_command(checkpoint, {**extra_conf, CONTROL_CONF: control.url})
        run = start_detached(job.name, command, Store(checkpoint), root.child(job.name), self.log_dir(), control=control)
        batch = wait_for_commit(run, Store(checkpoint), timeout=self.wait_timeout)
        self.log.info("job %s runs as pid %s and committed batch %s", job.name, run.pid, batch)
        return {"job": job.name, "pid": run.pid, "checkpoint": checkpoint, "first_batch": batch,
                "log_file": run.log_file, "savepoint_dir": root.url, "restored": restored}


class StopJobWithSavepointOperator(_JobOperator, RemovesPartialSavepoint):
    """Stop a running job, then take a ``stop`` savepoint of its last committed batch.

    A job that cooperates (calls :func:`airflow_savepoints.jobs.control.run_until_stopped`) stops
    between two batches: the savepoint has no batch in flight. Any other job (or one that does not
    answer within ``grace`` seconds) gets SIGTERM, then SIGKILL after ``grace`` seconds; the savepoint
    is then crash-consistent: a batch in flight re-runs on restore with the same offsets.
    """

    template_fields: Sequence[str] = ("job",)

    def __init__(self, *, grace: float = 60, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.grace = grace

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.streaming_job
        root = self.savepoint_root(job)
        run = read_run(root.child(job.name))
        checkpoint = run.checkpoint if run else job.checkpoint
        request_id = task_request_id(context)
        stop_request = request_id or f"stop-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
        stopped = stop_run(run, self.grace, stop_request) if run is not None else {"method": "not_running"}
        self.log.info("job %s stopped: %s", job.name, stopped)
        if run is not None:
            record_end(root.child(job.name), run, "stopped")
        info = take_savepoint(checkpoint, job.name, savepoint_dir=root, savepoint_type=SavepointType.STOP,
                              reason="stop", request_id=request_id, on_event=self.savepoint_events(root, job.name))
        consistency = "crash-consistent" if info.manifest.includes_next_offsets else "clean"
        self.log.info("stop savepoint %s of batch %s (%s)", info.pointer, info.manifest.batch_id, consistency)
        return {**info.summary(), "stop_method": stopped["method"], "consistency": consistency}


class CancelJobOperator(_JobOperator, RemovesPartialSavepoint):
    """Cancel a running job without a savepoint, then apply its checkpoint retention policy.

    :param policy: RETAIN_ON_CANCELLATION (keep the live checkpoint and register it as a
        ``retained_checkpoint`` savepoint), RETAIN_ON_FAILURE or NEVER_RETAIN_AFTER_TERMINATION
        (delete it); default: the job's ``checkpoint_retention`` (templated)
    :param grace: seconds between SIGTERM and SIGKILL
    """

    template_fields: Sequence[str] = ("job", "policy")

    def __init__(self, *, policy: str | None = None, grace: float = 60, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.policy = policy
        self.grace = grace

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.streaming_job
        root = self.savepoint_root(job)
        policy = parse_policy(self.policy or job.checkpoint_retention)  # bad input fails before the cancel
        run = read_run(root.child(job.name))
        if run is not None:
            self.log.info("cancelled pid %s: %s", run.pid, stop_process(run, self.grace))
        outcome = apply_checkpoint_retention(run.checkpoint if run else job.checkpoint, job.name, policy,
                                             "cancelled", savepoint_dir=root,
                                             on_event=self.savepoint_events(root, job.name))
        if run is not None:
            record_end(root.child(job.name), run, "cancelled", outcome)
        self.log.info("checkpoint %s %s (%s)", outcome["checkpoint"], outcome["action"], policy.value)
        return outcome


class CheckJobOperator(_JobOperator):
    """Check a job's recorded run, e.g. before its periodic savepoint.

    Running (or no run recorded): returns its status. Failed (its query reported a failure, or its
    process exited without being stopped): applies the job's ``checkpoint_retention`` for a failure
    once (keep and register a ``retained_checkpoint`` savepoint, or delete), then fails with the
    reason. Stopped or cancelled on purpose: skips, and so do the tasks after it.
    """

    template_fields: Sequence[str] = ("job",)

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.streaming_job
        root = self.savepoint_root(job)
        folder = root.child(job.name)
        run = read_run(folder)
        if run is not None and run.ended in ("stopped", "cancelled"):
            raise AirflowSkipException(f"job {job.name} was {run.ended} at {run.ended_at}; restart it with "
                                       "restore_from_savepoint")
        outcome = handle_failed_run(job.name, folder, root, job.checkpoint_retention)
        if outcome is not None:
            kept = outcome.get("retained_savepoint") or {}
            raise JobFailedError(
                f"job '{job.name}' failed: {outcome['reason']}\ncheckpoint {outcome['checkpoint']}: {outcome['action']} "
                f"({outcome['policy']})" + (f"; restorable as {kept['pointer']} (batch {kept['batch_id']})" if kept else ""),
                "fix the cause, then restart it with restore_from_savepoint (it takes the newest savepoint)",
            )
        if run is not None and run.ended == "failed":
            raise JobFailedError(f"job '{job.name}' is down since it failed at {run.ended_at}: "
                                 f"{(run.termination or {}).get('reason', '')[:500]}",
                                 "fix the cause, then restart it with restore_from_savepoint")
        return job_status(job.name, folder).model_dump(mode="json")
