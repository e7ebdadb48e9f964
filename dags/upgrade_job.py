"""Upgrade a running streaming job to a new version; roll back automatically if it is not healthy.

Trigger manually with Params: ``job`` (a name in jobs.yaml), the new version's ``application``,
``application_args`` (a JSON list) and ``spark_conf`` (a JSON object set on top of the job's),
each empty to keep the job's, and ``mode`` (``savepoint``, ``last-state`` or ``stateless``; empty:
the job's ``upgrade_mode``). The task stops the job (with a stop savepoint), starts the new
version, and waits until it commits a batch past the stop batch; otherwise it stops the new run,
starts the previous version again from the same state, and fails with the new version's error.
Before anything stops (``check_first``; ``auto``: in savepoint mode), the new version runs one batch
on a scratch copy of the job's state with a noop sink; if Spark refuses it, the upgrade is refused
and the running version is left as it is.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_savepoints.operators.upgrade import UpgradeJobOperator

JOBS_FILE = str(Path(__file__).with_name("jobs.yaml"))

with DAG(
    dag_id="upgrade_job",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["savepoints"],
    doc_md=__doc__,
    params={
        "job": Param("demo-dedup", type="string", description="A job name from jobs.yaml"),
        "application": Param("", type="string", description="The new version's application; empty: the job's"),
        "application_args": Param("", type="string", description="Its arguments as a JSON list; empty: the job's"),
        "spark_conf": Param("", type="string", description="Spark conf to set, as a JSON object; empty: none"),
        "mode": Param("", type="string", enum=["", "savepoint", "last-state", "stateless"],
                      description="How the state is carried over; empty: the job's upgrade_mode"),
        "fallback_to_savepoint": Param(False, type="boolean",
                                       description="If last-state is refused, upgrade with the stop savepoint"),
        "allow_stateless": Param(False, type="boolean", description="Allow mode stateless (EMPTY state)"),
        "health_timeout": Param(300, type="integer", minimum=1,
                                description="Seconds for the new version to commit a batch past the stop batch"),
        "check_first": Param("auto", type="string", enum=["auto", "true", "false"],
                             description="Run the new version for one batch on a scratch copy of the state (noop "
                                         "sink) before anything stops; auto: in savepoint mode"),
        "state_partitions": Param(None, type=["null", "integer"], minimum=1,
                                  description="Restore the state with this many state partitions; empty: as saved"),
    },
) as dag:
    UpgradeJobOperator(
        task_id="upgrade",
        job="{{ params.job }}",
        jobs_file=JOBS_FILE,
        application="{{ params.application }}",
        application_args="{{ params.application_args }}",
        spark_conf="{{ params.spark_conf }}",
        mode="{{ params.mode }}",
        fallback_to_savepoint="{{ params.fallback_to_savepoint }}",
        allow_stateless="{{ params.allow_stateless }}",
        health_timeout="{{ params.health_timeout }}",
        check_first="{{ params.check_first }}",
        state_partitions="{{ params.state_partitions }}",
    )
