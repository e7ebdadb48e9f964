"""Run a streaming job with the Spark provider's own SparkSubmitOperator, keeping every savepoint feature.

``submit_conf`` gives the conf to add: the job's folder under the savepoint directory (its run
lease and control folders) and its checkpoint. The job calls ``run_until_stopped`` (as the demo
does), so it takes the run lease itself, writes heartbeats, and stops between two batches when
asked: periodic savepoints, ``stop_job_with_savepoint``, ``airflow-savepoints job status``, the
one-run-per-job guard and restore all work for it. The task runs as long as the job does
(SparkSubmitOperator waits for spark-submit); the Spark connection ``spark_default`` says where.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

from airflow_savepoints.core.settings import resolve_savepoint_dir
from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.jobs.workflows.lifecycle import submit_conf

JOB = load_jobs(Path(__file__).with_name("jobs.yaml"))["demo-dedup"]

with DAG(
    dag_id="spark_submit_operator_job",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["savepoints"],
    doc_md=__doc__,
) as dag:
    SparkSubmitOperator(
        task_id="run_demo_dedup",
        application=JOB.application,
        name=JOB.name,
        conf={**JOB.spark_conf, **submit_conf(JOB, resolve_savepoint_dir(JOB.savepoint_dir))},
        application_args=[arg.replace("{checkpoint}", JOB.checkpoint) for arg in JOB.application_args],
        conn_id="spark_default",
    )
