"""Test bed DAGs: each job lifecycle action as a DAG of its own per worker, so a test picks the
worker ("host") that runs it: ``job_<action>_on_<worker>`` with the job's name in ``params.job``.

The jobs live in ``$TESTBED_SHARED/jobs.yaml`` (written by the test); savepoints go through the
``savepoints_default`` connection's storage options (the S3 server). ``params.state_partitions`` makes
a start rescale the restored state (the job's own Spark application, on the job's master).
``autoscale_on_<worker>`` runs the autoscaler (``AutoscaleJobsOperator``) for the job ``params.job``: it decides
and, with the job's ``mode: act``, carries the decision out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param, task

from airflow_savepoints.operators.autoscale import AutoscaleJobsOperator
from airflow_savepoints.operators.job import (
    CancelJobOperator,
    CheckJobOperator,
    RestoreJobOperator,
    StopJobWithSavepointOperator,
)
from airflow_savepoints.operators.savepoint import TriggerSavepointOperator

WORKERS = ("worker-a", "worker-b", "worker-c")
JOBS_FILE = str(Path(os.environ.get("TESTBED_SHARED", "/tmp/testbed-shared")) / "jobs.yaml")
PARAMS = {
    "job": Param("events", type="string"),
    "pointer": Param("", type="string"),
    "fresh": Param(False, type="boolean"),
    "savepoint_dir": Param("", type="string"),
    "state_partitions": Param(None, type=["null", "integer"]),  # a start rescales the state into this many
}


def job_status(job: str) -> dict:
    """``airflow-savepoints job status --json`` on this worker, with this worker's clock (no
    subprocess timeout: its sleeps fail under libfaketime's shifted clock with EINVAL). No
    ``--conn-id``: a task's subprocess cannot import Airflow (it has no metadata database URL);
    the S3 endpoint and keys come from the environment."""
    cli = Path(sys.executable).with_name("airflow-savepoints")
    done = subprocess.run([str(cli), "job", "status", job, "--jobs-file", JOBS_FILE, "--json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"job status exited {done.returncode}: {done.stdout}\n{done.stderr}")
    return {"status": json.loads(done.stdout), "clock": time.time()}


for worker in WORKERS:
    slug = worker.replace("-", "_")
    common = {"schedule": None, "start_date": datetime(2026, 1, 1), "catchup": False, "tags": ["testbed"],
              "params": PARAMS, "default_args": {"queue": worker, "retries": 0}}
    job = {"job": "{{ params.job }}", "jobs_file": JOBS_FILE}
    with DAG(dag_id=f"job_start_on_{slug}", **common):
        RestoreJobOperator(task_id="start", pointer="{{ params.pointer }}", fresh_start="{{ params.fresh }}",
                           state_partitions="{{ params.state_partitions }}", wait_timeout=240, **job)
    with DAG(dag_id=f"job_stop_on_{slug}", **common):
        StopJobWithSavepointOperator(task_id="stop", grace=20, inflight_wait=120, **job)
    with DAG(dag_id=f"job_cancel_on_{slug}", **common):
        CancelJobOperator(task_id="cancel", grace=20, **job)
    with DAG(dag_id=f"job_check_on_{slug}", **common):
        CheckJobOperator(task_id="check", **job)
    with DAG(dag_id=f"job_status_on_{slug}", **common):
        task(task_id="status")(job_status)(job="{{ params.job }}")
    with DAG(dag_id=f"job_savepoint_on_{slug}", **common):
        TriggerSavepointOperator(task_id="savepoint", job="{{ params.job }}", savepoint_dir="{{ params.savepoint_dir }}")
    with DAG(dag_id=f"autoscale_on_{slug}", **common):
        AutoscaleJobsOperator(task_id="autoscale", jobs=["{{ params.job }}"], jobs_file=JOBS_FILE)
