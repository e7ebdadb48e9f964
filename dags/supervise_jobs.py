"""The watchdog: every minute, check each job of jobs.yaml and act on what it finds.

A failed or lost job whose ``restart.enabled`` is true is restarted (on its live checkpoint when it
passes the checks, else from its newest savepoint) with exponential backoff, at most
``restart.max_restarts`` times per ``restart.window``; after that it stays down and this DAG's run
fails with the reason. A job with a ``progress_timeout`` whose planned batch stays uncommitted
longer fails the run too (job, last batch, age). Decisions: ``airflow-savepoints job status JOB --json``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_savepoints.operators.supervise import SuperviseJobsOperator

JOBS_FILE = str(Path(__file__).with_name("jobs.yaml"))

with DAG(
    dag_id="supervise_jobs",
    schedule=timedelta(minutes=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one watchdog at a time: a restart may take a while
    tags=["savepoints"],
    doc_md=__doc__,
) as dag:
    SuperviseJobsOperator(task_id="supervise", jobs_file=JOBS_FILE)
