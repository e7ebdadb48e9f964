"""Periodic savepoints of every job in jobs.yaml.

Per job, three tasks:
1. ``check_<job>`` looks at the job's recorded run. A job that failed (its query raised, or its
   process exited without being stopped) gets its ``checkpoint_retention`` policy applied once
   and the run fails with the reason; a job stopped on purpose skips the rest.
2. ``savepoint_<job>`` takes a ``periodic`` savepoint of the job's live checkpoint and announces
   it as an event of the asset ``savepoints/<job>``.
3. ``retention_<job>`` applies the job's retention policy (``retention`` in jobs.yaml, else
   ``[savepoints]``): the oldest periodic savepoints beyond ``max_periodic`` go; manual and stop
   savepoints always stay.

The interval is 15 minutes, or ``SAVEPOINTS_PERIODIC_INTERVAL`` (``30s``, ``5m``, ``1h``) from the
environment at parse time.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_savepoints.core.settings import parse_duration
from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.operators.job import CheckJobOperator
from airflow_savepoints.operators.retention import ApplyRetentionOperator
from airflow_savepoints.operators.savepoint import TriggerSavepointOperator

JOBS_FILE = Path(__file__).with_name("jobs.yaml")
JOBS = load_jobs(JOBS_FILE)
INTERVAL = timedelta(seconds=parse_duration(os.environ.get("SAVEPOINTS_PERIODIC_INTERVAL") or "15m"))

with DAG(
    dag_id="periodic_savepoints",
    schedule=INTERVAL,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # never two savepoint rounds at once
    tags=["savepoints"],
    doc_md=__doc__,
) as dag:
    # [START howto_periodic_savepoints]
    for job in JOBS.values():
        task = job.name.replace("-", "_")
        CheckJobOperator(task_id=f"check_{task}", job=job.name, jobs_file=str(JOBS_FILE)) >> TriggerSavepointOperator(
            task_id=f"savepoint_{task}",
            job=job.name,
            fallback_checkpoint=job.checkpoint,  # used until RestoreJobOperator records a run
            savepoint_dir=job.savepoint_dir,
            savepoint_type="periodic",
            retries=2,
            retry_delay=timedelta(seconds=30),
        ) >> ApplyRetentionOperator(
            task_id=f"retention_{task}",
            job=job.name,
            savepoint_dir=job.savepoint_dir,
            max_periodic=job.retention.max_periodic,
            max_age=job.retention.max_age,
        )
    # [END howto_periodic_savepoints]
