"""Stop a running streaming job and take a final ``stop`` savepoint (e.g. before an upgrade).

Trigger manually with the Param ``job`` (a name in jobs.yaml). Restart it later with
``restore_from_savepoint``, which restores the newest savepoint: this one.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_savepoints.operators.job import StopJobWithSavepointOperator

with DAG(
    dag_id="stop_job_with_savepoint",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["savepoints"],
    doc_md=__doc__,
    params={"job": Param("demo-dedup", type="string", description="A job name from jobs.yaml")},
) as dag:
    StopJobWithSavepointOperator(
        task_id="stop_with_savepoint",
        job="{{ params.job }}",
        jobs_file=str(Path(__file__).with_name("jobs.yaml")),
    )
