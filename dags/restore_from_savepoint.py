"""Start a streaming job from its latest savepoint (or a given one) in a fresh checkpoint location.

Trigger manually with Params: ``job`` (a name in jobs.yaml), ``pointer`` (optional: a savepoint
directory or its _metadata), ``fresh_start`` (start with EMPTY state; only when asked for),
``max_age`` (refuse an older savepoint), ``skip_missing_input`` (start even if input files a
file source will read again are gone; refused by default, naming them) and ``state_partitions``
(rescale the state on the way; Spark 4.2, RocksDB state; empty: keep them).
``restore_and_start`` ends once the job has committed its first batch; the job keeps running
detached. ``wait_for_progress`` then waits in the triggerer (up to 10 minutes) for a batch after
that first one, so it ends once new input has arrived and been committed; it fails at once if the
job dies.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_savepoints.operators.job import RestoreJobOperator
from airflow_savepoints.sensors.savepoint import BatchCommittedSensor

JOBS_FILE = str(Path(__file__).with_name("jobs.yaml"))

with DAG(
    dag_id="restore_from_savepoint",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["savepoints"],
    doc_md=__doc__,
    params={
        "job": Param("demo-dedup", type="string", description="A job name from jobs.yaml"),
        "pointer": Param("", type="string", description="A savepoint to restore; empty for the latest"),
        "fresh_start": Param(False, type="boolean", description="Start with EMPTY state instead"),
        "max_age": Param("", type="string", description="Refuse an older savepoint (e.g. 7d); empty: no limit"),
        "skip_missing_input": Param(False, type="boolean",
                                    description="Start even if input files a file source will read again are gone"),
        "state_partitions": Param(None, type=["null", "integer"], minimum=1,
                                  description="Rescale the state into this many partitions; empty: keep them"),
        "allow_repeats": Param(False, type="boolean",
                               description="Start though the job's at-least-once sink (Kafka) gets the batches after "
                                           "the savepoint again"),
    },
) as dag:
    started = RestoreJobOperator(
        task_id="restore_and_start",
        job="{{ params.job }}",
        jobs_file=JOBS_FILE,
        pointer="{{ params.pointer }}",
        max_age="{{ params.max_age }}",
        skip_missing_input="{{ params.skip_missing_input }}",
        fresh_start="{{ params.fresh_start }}",
        state_partitions="{{ params.state_partitions }}",
        allow_repeats="{{ params.allow_repeats }}",
    )
    # deferrable: the wait runs in the triggerer and fails fast if the job dies
    started >> BatchCommittedSensor(
        task_id="wait_for_progress",
        deferrable=True,
        job="{{ params.job }}",
        after_batch="{{ ti.xcom_pull(task_ids='restore_and_start')['first_batch'] }}",
        savepoint_dir="{{ ti.xcom_pull(task_ids='restore_and_start')['savepoint_dir'] }}",
        poke_interval=2,
        timeout=600,
    )
