"""Operators that start (from a savepoint), stop, cancel and check streaming jobs.

Thin: the work is in :mod:`airflow_savepoints.jobs.workflows.lifecycle`, which goes through shared storage
(the run lease, the run's control folder) and the job's runner, so each task may run on any worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowSkipException
from airflow.sdk.log import mask_secret

from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.hooks.savepoint import SavepointStorageHook
from airflow_savepoints.hooks.streaming_job import SparkStreamingJobHook
from airflow_savepoints.jobs import StreamingJob, load_jobs
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.jobs.workflows.lifecycle import NoSavepointError
from airflow_savepoints.jobs.workflows.run import JobContext
from airflow_savepoints.operators.base import SavepointsBaseOperator, rendered_count, rendered_flag, savepoints_template_fields
from airflow_savepoints.operators.savepoint import (
    RemovesPartialSavepoint,
    checkpoint_options,
    savepoint_outlets,
    task_request_id,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

T = TypeVar("T")

__all__ = ["CancelJobOperator", "CheckJobOperator", "InspectJobOperator", "NoSavepointError", "RestoreJobOperator",
           "StopJobWithSavepointOperator"]


class _JobOperator(SavepointsBaseOperator):
    """Shared parts: the job, looked up by name in a jobs file at run time, and its storage.

    :param job: the job's name in ``jobs_file`` (templated)
    :param jobs_file: the YAML file of jobs (``dags/jobs.yaml`` in the examples)
    :param savepoints_conn_id: a ``savepoints`` connection (the savepoint directory and its credentials)
    :param savepoint_dir: the savepoint directory (templated); default: the job's ``savepoint_dir``,
        else the connection's host, else configuration
    :param checkpoint_conn_id: a ``savepoints`` connection whose storage options open the job's live
        checkpoints; default: the savepoint connection's, when the checkpoint is on the same kind of store
    """

    template_fields: Sequence[str] = savepoints_template_fields("job")

    def __init__(self, *, job: str, jobs_file: str, checkpoint_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.jobs_file = jobs_file
        self.checkpoint_conn_id = checkpoint_conn_id

    @cached_property
    def checkpoint_hook(self) -> SavepointStorageHook | None:
        """The hook of ``checkpoint_conn_id``; None: the savepoint connection's options apply."""
        return self.hook_class(self.checkpoint_conn_id) if self.checkpoint_conn_id else None

    @property
    def streaming_job(self) -> StreamingJob:
        jobs = load_jobs(self.jobs_file)
        if self.job not in jobs:
            raise InvalidInputError(f"no job named {self.job!r} in {self.jobs_file}",
                                    f"use one of: {', '.join(sorted(jobs))}")
        return jobs[self.job]

    def job_context(self) -> JobContext:
        job = self.streaming_job
        for secret in job.secrets():  # Airflow's masker hides them in every line of the task's log
            mask_secret(secret)
        root = self.savepoint_store(job.savepoint_dir)
        options = (self.checkpoint_hook.storage_options() if self.checkpoint_hook
                   else checkpoint_options(job.checkpoint, root, None))
        from airflow_savepoints.hooks.streaming_job import connection_master

        return JobContext(job, root, options, log=self.log.info, spark_master=connection_master(job))

    def log_dir(self) -> Path:
        return Path(conf.get("logging", "base_log_folder", fallback="/tmp")) / "streaming-jobs"


class _EachJobOperator(_JobOperator):
    """A task over several jobs of ``jobs_file`` (``jobs``, default :meth:`job_names`): one step per job
    (:meth:`each_job`); the subclass decides what of the results fails the task.

    :param jobs: job names (default: :meth:`job_names`)
    """

    template_fields: Sequence[str] = savepoints_template_fields("jobs")

    def __init__(self, *, jobs: list[str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("job", "")
        super().__init__(**kwargs)
        self.jobs = jobs

    def job_names(self) -> list[str]:
        """The jobs a run covers when ``jobs`` names none: every job of ``jobs_file``."""
        return sorted(load_jobs(self.jobs_file))

    def each_job(self, step: Callable[[JobContext], T]) -> list[T]:
        """``step`` for each job in turn, with its context."""
        results = []
        for name in self.jobs or self.job_names():
            self.job = name
            results.append(step(self.job_context()))
        return results


class RestoreJobOperator(_JobOperator):
    """Start a job from its latest (or a given) savepoint in a fresh checkpoint location.

    Refuses while another run of the job lives (wherever it runs: the run lease); takes over the
    lease of a lost run. The task ends once the job is live (a batch committed past the restored
    one, or a trigger with no data run: an idle source is healthy), and fails with Spark's message
    when its query fails first; the job keeps running detached. Starting with empty state happens
    only with ``fresh_start=True``.

    :param pointer: a savepoint to restore (templated); default: the job's newest completed savepoint
    :param fresh_start: start with empty state in the job's checkpoint location (must be empty)
    :param max_age: refuse a savepoint older than this (``12h``, ``7d``; templated)
    :param skip_missing_input: start even if input files a file source will read again, or Kafka
        records it resumes at, are gone (templated; by default such a restore is refused, naming
        them); the run gets ``spark.savepoints.skipMissingInput=true``, so the in-job helper reads
        Kafka with ``failOnDataLoss=false``
    :param target_checkpoint: where to restore (templated): the job's checkpoint or
        ``<checkpoint>-<suffix>``; default ``<checkpoint>-<UTC time>``
    :param wait_timeout: seconds to wait for the first committed batch
    :param allow_foreign_savepoint: allow a ``pointer`` to a savepoint of another job, or outside the
        job's folder of the savepoint root (off by default, and in the example DAGs and the console)
    :param state_partitions: rescale the state into this many partitions on the way (templated; RocksDB
        state; the rescale is a Spark application of the job, Spark 4.2 where the job runs, no pyspark on
        the worker; see docs/evolve.md); empty: keep them
    :param allow_repeats: start even though the job's at-least-once sink (``sink: {kind: kafka}`` and the
        like) gets the batches after the savepoint again (templated; else ``sink_repeats``)
    :param reprocess: a Delta sink gets the batches after the savepoint again under a new query id (only
        once their rows are gone from the table: a bug-fix rollback after a table RESTORE)
    """

    template_fields: Sequence[str] = savepoints_template_fields("job", "pointer", "fresh_start", "max_age",
                                                                "skip_missing_input", "target_checkpoint",
                                                                "state_partitions", "allow_repeats")

    def __init__(self, *, pointer: str | None = None, fresh_start: bool | str = False, max_age: str | None = None,
                 skip_missing_input: bool | str = False, target_checkpoint: str | None = None,
                 wait_timeout: float = 300, allow_foreign_savepoint: bool = False,
                 state_partitions: int | str | None = None, allow_repeats: bool | str = False, reprocess: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.allow_repeats = allow_repeats
        self.reprocess = reprocess
        self.allow_foreign_savepoint = allow_foreign_savepoint
        self.state_partitions = state_partitions
        self.pointer = pointer
        self.fresh_start = fresh_start
        self.max_age = max_age
        self.skip_missing_input = skip_missing_input
        self.target_checkpoint = target_checkpoint
        self.wait_timeout = wait_timeout

    def execute(self, context: Context) -> dict[str, Any]:
        ctx = self.job_context()
        return lifecycle.start(
            ctx, submit_command=SparkStreamingJobHook(ctx.job).submit_command, log_dir=self.log_dir(),
            pointer=self.pointer or None, max_age=self.max_age or None,  # "" from a Param: not given
            fresh=rendered_flag(self.fresh_start), skip_missing_input=rendered_flag(self.skip_missing_input),
            target_checkpoint=self.target_checkpoint or None, wait_timeout=self.wait_timeout,
            allow_foreign_savepoint=self.allow_foreign_savepoint, allow_repeats=rendered_flag(self.allow_repeats),
            reprocess=self.reprocess, state_partitions=rendered_count(self.state_partitions, "state_partitions"))


class StopJobWithSavepointOperator(_JobOperator, RemovesPartialSavepoint):
    """Stop a running job, then take a ``stop`` savepoint of its last committed batch.

    A savepoint in flight (a periodic one) is waited for first, at most ``inflight_wait`` seconds;
    after that the stop fails before it stops anything. A job that cooperates (calls
    :func:`airflow_savepoints.jobs.driver.control.run_until_stopped`) stops between two batches: the
    savepoint has no batch in flight. Any other job (or one that does not answer within ``grace``
    seconds) is ended through its runner (signals to the local driver, the standalone master's
    kill, the cluster manager); the savepoint is then crash-consistent: a batch in flight re-runs on
    restore with the same offsets.
    """

    def __init__(self, *, grace: float = 60, inflight_wait: float = 300, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", savepoint_outlets(kwargs.get("job", "")))
        super().__init__(**kwargs)
        self.grace = grace
        self.inflight_wait = inflight_wait

    def execute(self, context: Context) -> dict[str, Any]:
        ctx = self.job_context()
        stopped = lifecycle.stop(ctx, grace=self.grace, request_id=task_request_id(context),
                                 inflight_wait=self.inflight_wait, on_event=self.savepoint_events(ctx.root, ctx.job.name))
        self.announce(context, ctx.job.name, stopped)
        return stopped


class CancelJobOperator(_JobOperator, RemovesPartialSavepoint):
    """Cancel a running job without a savepoint, then apply its checkpoint retention policy.

    :param policy: RETAIN_ON_CANCELLATION (keep the live checkpoint and register it as a
        ``retained_checkpoint`` savepoint), RETAIN_ON_FAILURE or NEVER_RETAIN_AFTER_TERMINATION
        (delete it); default: the job's ``checkpoint_retention`` (templated)
    :param grace: seconds for the job to answer its control folder, and between SIGTERM and SIGKILL
    """

    template_fields: Sequence[str] = savepoints_template_fields("job", "policy")

    def __init__(self, *, policy: str | None = None, grace: float = 60, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", savepoint_outlets(kwargs.get("job", ""), only_when_taken=True))
        super().__init__(**kwargs)
        self.policy = policy
        self.grace = grace

    def execute(self, context: Context) -> dict[str, Any]:
        ctx = self.job_context()
        cancelled = lifecycle.cancel(ctx, policy=self.policy, grace=self.grace,
                                     on_event=self.savepoint_events(ctx.root, ctx.job.name))
        self.announce(context, ctx.job.name, cancelled.get("retained_savepoint"))
        return cancelled


class CheckJobOperator(_JobOperator):
    """Check a job's current run, e.g. before its periodic savepoint; return its state.

    Running (or not started): returns the state (``job``, ``state``, ``run_id``, ``host``,
    ``application_id``, ``last_batch``, ``heartbeat_age_s``, ...). Failed (its query reported a
    failure, or its driver ended without being stopped): applies the job's ``checkpoint_retention``
    for a failure once, then fails with the reason. Lost (heartbeats lapsed): fails. Stopped or
    cancelled on purpose: skips, and so do the tasks after it.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        state = lifecycle.check(self.job_context())
        if state.state == "stopped":
            raise AirflowSkipException(f"job {state.job} was {state.ended or 'stopped'} ({state.detail}); restart it "
                                       "with restore_from_savepoint")
        return state.model_dump(mode="json")


class InspectJobOperator(_JobOperator):
    """Read a savepoint of a job on the job's own cluster, as ``airflow-savepoints job inspect`` does (a Spark
    application of the job counts the state: the worker needs no pyspark), and record its summary beside it,
    as :class:`~airflow_savepoints.operators.inspect.InspectSavepointOperator` does. Returns the summary and
    ``application`` (its id, Spark version, seconds).

    :param pointer: a savepoint of the job (templated); default: its newest completed one
    :param operator_id: only this stateful operator
    :param sample: rows of each store in the returned summary (0-1000; never recorded)
    :param timeout: seconds the application may take
    """

    template_fields: Sequence[str] = savepoints_template_fields("job", "pointer")

    def __init__(self, *, pointer: str | None = None, operator_id: int | None = None, sample: int = 0,
                 timeout: float = 3600, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pointer = pointer
        self.operator_id = operator_id
        self.sample = sample
        self.timeout = timeout

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_savepoints.core.state_summary import record_beside
        from airflow_savepoints.jobs.workflows.inspect import inspect_on_the_job

        ctx = self.job_context()
        summary, application = inspect_on_the_job(
            ctx, SparkStreamingJobHook(ctx.job).submit_command, self.log_dir(), pointer=self.pointer or None,
            operator=self.operator_id, sample=self.sample, progress=self.log.info, timeout=self.timeout)
        recorded = record_beside(summary, ctx.root.storage_options)
        self.log.info("state summary of %s (%s rows) recorded at %s", summary.pointer, summary.total_rows, recorded)
        return {**summary.as_json(), "application": application, "recorded": recorded}
