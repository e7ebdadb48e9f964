"""Build the spark-submit command of a streaming job with the Spark provider's SparkSubmitHook."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook

from airflow_savepoints.jobs import StreamingJob

CHECKPOINT_PLACEHOLDER = "{checkpoint}"


class SparkStreamingJobHook(BaseHook):
    """spark-submit command lines for :class:`StreamingJob` runs.

    The Spark connection (``job.spark_conn_id``) gives master and deploy mode as the Spark provider
    reads them; without one, the job's own ``master`` and ``deploy_mode`` are used.
    ``{checkpoint}`` in the application arguments becomes the run's checkpoint location.
    """

    def __init__(self, job: StreamingJob, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job

    def submit_command(self, checkpoint: str, extra_conf: dict[str, str] | None = None) -> list[str]:
        job = self.job
        args = [a.replace(CHECKPOINT_PLACEHOLDER, checkpoint) for a in job.application_args]
        submit = SparkSubmitHook(
            conf={**job.spark_conf, **(extra_conf or {})},
            conn_id=job.spark_conn_id or "spark_default",
            name=job.name,
            application_args=args,
            deploy_mode=job.deploy_mode,
        )
        if not job.spark_conn_id:
            submit._connection["master"] = job.master  # no connection: the job's own master
        return submit._build_spark_submit_command(job.application)
