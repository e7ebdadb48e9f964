"""A Kubernetes kill deletes only the job's own driver pod (issue 40): the run files' pod name counts only
if spark-submit would name a driver pod so for this job, and a configured pod name is the configuration's.
No cluster here: the kill path itself (the Spark provider's) is unchecked; what it is given is checked."""

from __future__ import annotations

import pytest

from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.launch.runners import is_driver_pod_of
from airflow_savepoints.jobs.workflows.run import JobContext, Run
from airflow_savepoints.storage import Store

K8S = "k8s://https://127.0.0.1:9"  # nothing listens: no call may need it


@pytest.mark.parametrize("pod, app, theirs", [
    ("orders-9f1c2a7b3d4e5f60-driver", "orders", True),
    ("daily-orders-v2-1a2b3c4d-driver", "Daily_Orders.v2", True),
    ("orders-driver", "orders", False),  # no id
    ("payments-9f1c2a7b3d4e5f60-driver", "orders", False),
    ("orders-9f1c2a7b3d4e5f60-exec-1", "orders", False),
    ("coredns-5d78c9869d-x2x7q", "orders", False),
])
def test_a_driver_pod_is_the_jobs_only_as_spark_submit_names_it(pod, app, theirs):
    assert is_driver_pod_of(pod, app) is theirs


def run_naming(tmp_path, pod: str, **job) -> tuple[Run, JobContext]:
    spec = StreamingJob(name="orders", application="app.py", master=K8S, checkpoint=str(tmp_path / "cp"),
                        savepoint_dir=str(tmp_path / "sp"), deploy_mode="cluster", **job)
    ctx = JobContext(spec, Store(spec.savepoint_dir))
    assert ctx.lease.acquire("r1", {"host": "h", "timeout_s": 30, "driver_pod": pod}) is None  # the run's facts, forgeable
    return Run.read(ctx), ctx


def test_the_run_files_pod_is_kept_only_when_it_is_the_jobs(tmp_path):
    run, _ = run_naming(tmp_path / "a", "orders-9f1c2a7b3d4e5f60-driver")
    assert run.target().driver_pod == "orders-9f1c2a7b3d4e5f60-driver" and not run.warnings

    run, _ = run_naming(tmp_path / "b", "coredns-5d78c9869d-x2x7q")  # another workload's pod
    assert run.target().driver_pod is None
    assert any("coredns-5d78c9869d-x2x7q" in w and "never deleted" in w for w in run.warnings), run.warnings


def test_a_configured_driver_pod_name_is_the_one_deleted(tmp_path):
    run, _ = run_naming(tmp_path, "coredns-5d78c9869d-x2x7q",
                        spark_conf={"spark.kubernetes.driver.pod.name": "orders-main-driver"})
    assert run.target().driver_pod == "orders-main-driver"
