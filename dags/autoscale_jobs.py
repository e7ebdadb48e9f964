"""The autoscaler: every 5 minutes, decide for each job of jobs.yaml with an ``autoscale:`` block.

Each decision (scale up, scale down or hold, with its evidence) is recorded in the job's decision
history. A job whose policy says ``mode: act`` is changed through a savepoint-mode upgrade to the same
version with the new executors (and state partitions when they bind), checked first and rolled back
on failure; this DAG's run then fails naming the job. ``mode: recommend`` only records. Decisions:
``airflow-savepoints job autoscale JOB --dry-run --json``; docs/autoscale.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_savepoints.operators.autoscale import AutoscaleJobsOperator

JOBS_FILE = str(Path(__file__).with_name("jobs.yaml"))

with DAG(
    dag_id="autoscale_jobs",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one autoscaler at a time: an action (an upgrade) may take minutes
    tags=["savepoints"],
    doc_md=__doc__,
) as dag:
    AutoscaleJobsOperator(task_id="autoscale", jobs_file=JOBS_FILE)
