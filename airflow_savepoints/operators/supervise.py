"""The watchdog as a task: restart failed or lost jobs with backoff, fail on jobs that stay down or stall.

Thin: each job's decision is :func:`airflow_savepoints.jobs.workflows.watchdog.supervise`'s (kept on the
job's storage beside its run lease, shown by ``airflow-savepoints job status --json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_savepoints.hooks.streaming_job import SparkStreamingJobHook
from airflow_savepoints.jobs.workflows.watchdog import alerts, supervise
from airflow_savepoints.operators.job import _EachJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["SuperviseJobsOperator"]


class SuperviseJobsOperator(_EachJobOperator):
    """Check every job of ``jobs_file`` (or the named ``jobs``) once: restart a failed or lost one
    (as its ``restart`` settings allow), report a stalled one (``progress_timeout``). Returns the
    decisions; fails, after handling every job, when a job stays down (restarts off or given up
    after ``max_restarts``) or stalled, naming the job and the reason.

    :param jobs: job names to supervise (default: every job in ``jobs_file``)
    :param wait_timeout: seconds a restart waits for the restarted run's first committed batch
    """

    def __init__(self, *, wait_timeout: float = 300, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wait_timeout = wait_timeout

    def execute(self, context: Context) -> list[dict[str, Any]]:
        decisions = self.each_job(lambda ctx: supervise(
            ctx, submit_command=SparkStreamingJobHook(ctx.job).submit_command, log_dir=self.log_dir(),
            wait_timeout=self.wait_timeout))
        if (error := alerts(decisions)) is not None:
            raise error
        return [d.model_dump(mode="json") for d in decisions]
