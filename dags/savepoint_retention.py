"""Savepoint cleanup: apply each job's retention policy, daily or on demand.

For every job in jobs.yaml: periodic savepoints beyond ``max_periodic`` or older than
``max_age`` are disposed, and locations without ``_metadata`` older than the orphan timeout (a
trigger that crashed) are removed. Never removed: manual, stop and retained-checkpoint
savepoints, the newest completed savepoint, pinned and in-progress ones. Trigger it with
``dry_run`` to see the plan in the task log and XCom without changing anything. It works the
same whether the job is running or stopped.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.operators.retention import ApplyRetentionOperator

JOBS = load_jobs(Path(__file__).with_name("jobs.yaml"))

with DAG(
    dag_id="savepoint_retention",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["savepoints"],
    doc_md=__doc__,
    params={
        "dry_run": Param(False, type="boolean", description="Only plan: list what would be removed"),
        "orphan_timeout": Param("", type="string", description="e.g. 1h; empty: [savepoints] orphan_timeout"),
    },
) as dag:
    for job in JOBS.values():
        ApplyRetentionOperator(
            task_id=f"retention_{job.name.replace('-', '_')}",
            job=job.name,
            savepoint_dir=job.savepoint_dir,
            max_periodic=job.retention.max_periodic,
            max_age=job.retention.max_age,
            orphan_timeout="{{ params.orphan_timeout }}",
            dry_run="{{ params.dry_run }}",
        )
