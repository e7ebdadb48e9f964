"""The Spark provider's side of streaming jobs: spark-submit command lines built with its
SparkSubmitHook, and the YARN / Kubernetes runner back end over the same hook."""

from __future__ import annotations

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
        return submit._build_spark_submit_command(job.application)


def connection_master(job: StreamingJob) -> str | None:
    """The master of the job's Spark connection (``spark_conn_id``) as the Spark provider reads it;
    None for a job without one (its jobs.yaml ``master`` applies). The runner's address comes from
    here or jobs.yaml, never from a run file."""
    if not job.spark_conn_id:
        return None
    return SparkSubmitHook(conn_id=job.spark_conn_id)._connection.get("master") or None


class SparkProviderRunner(Runner):
    """YARN and Kubernetes runs through the Spark provider's SparkSubmitHook: status from YARN's
    ResourceManager, kill through its REST API (YARN) or by deleting the driver pod (Kubernetes).

    Not tested here: no YARN or Kubernetes cluster runs on this project's test machine."""

    name = "spark-provider"

    def __init__(self, conn_id: str = "spark_default") -> None:
        self.conn_id = conn_id

    def _hook(self) -> SparkSubmitHook:
        return SparkSubmitHook(conn_id=self.conn_id)

    def status(self, target: RunTarget) -> RunnerView:
        if target.master and target.master.startswith("yarn") and target.application_id:
            try:
                state = self._hook().query_yarn_application_status(target.application_id)
            except Exception as exc:  # noqa: BLE001 - reported as the runner's words
                return RunnerView("unknown", f"YARN did not answer for {target.application_id}: {exc}")
            running = state not in ("SUCCEEDED", "FAILED", "KILLED")
            return RunnerView("running" if running else "ended", f"YARN says {target.application_id} is {state}")
        return RunnerView("unknown", f"the Spark provider cannot tell the state of {target.application_id} on "
                                     f"{target.master}")

    def kill(self, target: RunTarget, grace: float) -> dict[str, Any]:
        hook = self._hook()
        if target.master and target.master.startswith("yarn") and target.application_id:
            hook._kill_yarn_application(target.application_id)
            return {"method": "yarn", "killed": True, "detail": f"YARN kill sent for {target.application_id}"}
        if target.master and target.master.startswith("k8s") and target.driver_pod:
            hook._kubernetes_driver_pod = target.driver_pod
            hook._delete_driver_pod()
            return {"method": "kubernetes", "killed": True, "detail": f"driver pod {target.driver_pod} deleted"}
        return {"method": "none", "killed": False, "detail": f"no kill path for {target.master}"}


register_runner("yarn", SparkProviderRunner)
register_runner("k8s://", SparkProviderRunner)
