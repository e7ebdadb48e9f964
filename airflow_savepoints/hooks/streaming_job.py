"""The Spark provider's side of streaming jobs: spark-submit command lines built with its
SparkSubmitHook, and the Kubernetes runner back end over the same hook (YARN has its own runner,
:class:`airflow_savepoints.jobs.launch.runners.YarnRunner`: the hook's YARN status and kill need its
connection's ``yarn_resourcemanager_webapp_address``, whatever the job's, and its kill never says whether
it happened)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook

from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.description.record import RunTarget
from airflow_savepoints.jobs.launch.runners import Runner, RunnerView, register_runner

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
        with contextlib.redirect_stdout(sys.stderr):  # its "Spark-Submit cmd" log line: stdout is a CLI's answer
            return submit._build_spark_submit_command(job.application)


def connection_master(job: StreamingJob) -> str | None:
    """The master of the job's Spark connection (``spark_conn_id``) as the Spark provider reads it;
    None for a job without one (its jobs.yaml ``master`` applies). The runner's address comes from
    here or jobs.yaml, never from a run file."""
    if not job.spark_conn_id:
        return None
    return SparkSubmitHook(conn_id=job.spark_conn_id)._connection.get("master") or None


class SparkProviderRunner(Runner):
    """Kubernetes runs through the Spark provider's SparkSubmitHook: kill by deleting the driver pod; no status.

    Not tested here: no Kubernetes cluster runs on this project's test machine."""

    name = "spark-provider"

    def __init__(self, conn_id: str = "spark_default") -> None:
        self.conn_id = conn_id

    def _hook(self) -> SparkSubmitHook:
        return SparkSubmitHook(conn_id=self.conn_id)

    def status(self, target: RunTarget) -> RunnerView:
        return RunnerView("unknown", f"the Spark provider cannot tell the state of {target.application_id} on "
                                     f"{target.master}")

    def kill(self, target: RunTarget, grace: float) -> dict[str, Any]:
        hook = self._hook()
        if target.master and target.master.startswith("k8s") and target.driver_pod:
            hook._kubernetes_driver_pod = target.driver_pod
            hook._delete_driver_pod()
            return {"method": "kubernetes", "killed": True, "detail": f"driver pod {target.driver_pod} deleted"}
        return {"method": "none", "killed": False, "detail": f"no kill path for {target.master}"}


register_runner("k8s://", SparkProviderRunner)
