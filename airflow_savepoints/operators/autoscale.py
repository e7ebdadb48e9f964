"""The autoscaler as a task: decide for each job with an ``autoscale:`` policy, act where it says ``mode: act``.

Thin: each job's decision and action is :func:`airflow_savepoints.jobs.workflows.autoscale.evaluate`'s (recorded
in the job's decision history, ``_autoscale.json``; docs/autoscale.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_savepoints.hooks.streaming_job import SparkStreamingJobHook
from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.jobs.workflows.autoscale import act_failures, evaluate
from airflow_savepoints.operators.base import rendered_flag, savepoints_template_fields
from airflow_savepoints.operators.job import _EachJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["AutoscaleJobsOperator"]


class AutoscaleJobsOperator(_EachJobOperator):
    """Decide once for every job of ``jobs_file`` with an ``autoscale:`` block (or the named ``jobs``): scale up,
    scale down or hold, with the evidence; a job with ``mode: act`` is changed through a checked savepoint
    upgrade to the same version, rolled back on failure. Returns the decisions; fails, after every job, when
    an action was rolled back or failed, naming the job and the cause.

    :param jobs: job names (default: every job in ``jobs_file`` with an ``autoscale:`` block)
    :param dry_run: only decide and record, whatever the jobs' ``mode`` (templated)
    """

    template_fields: Sequence[str] = savepoints_template_fields("jobs", "dry_run")

    def __init__(self, *, dry_run: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dry_run = dry_run

    def job_names(self) -> list[str]:
        """Every job of ``jobs_file`` with an ``autoscale:`` block."""
        return sorted(name for name, job in load_jobs(self.jobs_file).items() if job.autoscale)

    def execute(self, context: Context) -> list[dict[str, Any]]:
        results = self.each_job(lambda ctx: evaluate(
            ctx, dry_run=rendered_flag(self.dry_run), log_dir=self.log_dir(),
            submit_for=lambda job: SparkStreamingJobHook(job).submit_command))
        if (error := act_failures(results)) is not None:
            raise error
        return results
