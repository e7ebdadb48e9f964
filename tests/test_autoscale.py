"""The autoscaler acting on a real job on a local master: the demo job (RocksDB state, 2 state partitions) under
spark-submit on ``local[2]``, fed a file every second, with a policy whose target utilization its batches exceed,
so its own recorded metrics call for a scale-up (2 -> 3 cores). A local master gives the job its cores itself, so
the change carried out is the state partitions alone (2 -> 3, they bind), with no Spark conf: ``job autoscale``
acts (checked first, restored into 3 state partitions), the job runs on with them, and the sink holds every input
row once.

The rest of the end-to-end proof runs on the distributed test bed's standalone cluster
(tests/test_distributed.py, ``test_h_...``): more cores across two workers under a load step, a scale-up whose
new configuration fails its check recorded ``rolled_back`` with the job untouched, the operator (a DAG on a
Celery worker) held by the cooldown of that attempt and of the action, a scale-down after the window, exactly
once across the actions. The change of state partitions is proven here only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import airflow_savepoints.demo.app as demo
from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.core import list_savepoints
from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.jobs.description.metrics import read_decisions, read_series
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.jobs.launch.launcher import spark_submit_command
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.jobs.workflows.autoscale import evaluate
from airflow_savepoints.jobs.workflows.run import JobContext, stop_process
from airflow_savepoints.storage import Store
from tests.support.feeding import Feeder, wait_for_sink
from tests.support.spark_shapes import ROCKS_CHANGELOG

pytestmark = pytest.mark.slow
JOB = "demo-autoscale"


def write_jobs(home: Path) -> Path:
    conf = "\n".join(f'      {key}: "{value}"' for key, value in ROCKS_CHANGELOG.items())
    path = home / "jobs.yaml"
    path.write_text(f"""jobs:
  - name: {JOB}
    application: {demo.__file__}
    application_args: [{home}/input, "{{checkpoint}}", {home}/output]
    master: local[2]
    spark_conf:
      spark.sql.shuffle.partitions: "2"
      spark.ui.enabled: "false"
{conf}
    checkpoint: {home}/checkpoint
    savepoint_dir: {home}/savepoints
    sink: {{kind: file, path: {home}/output}}
    autoscale: {{max_executors: 3, min_partitions: 2, max_partitions: 3, target_utilization: 0.02,
                 utilization_band: 0.01, scale_up_after: 6, cooldown: 1, mode: act}}
""")
    return path


def context(jobs: Path) -> JobContext:
    job = load_jobs(jobs)[JOB]
    return JobContext(job, Store(job.savepoint_dir), heartbeat_interval=1.0)


def wait_for_scale_up(jobs: Path, timeout: float = 180) -> dict:
    """The recorded metrics' decision once it is a scale-up (dry runs, recorded as recommendations)."""
    deadline = time.monotonic() + timeout
    while True:
        decided = evaluate(context(jobs), dry_run=True, submit_for=lambda job: None, log_dir=Path("/nonexistent"))
        if decided["action"] == "scale_up" or time.monotonic() > deadline:
            return decided
        time.sleep(2)


def autoscale(jobs: Path, logs: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(cli_app, ["job", "autoscale", JOB, "--jobs-file", str(jobs), "--json",
                                          "--log-dir", str(logs)])
    return result.exit_code, json.loads(result.stdout)


def test_on_a_local_master_a_scale_up_rescales_the_state_of_the_running_job(tmp_path):
    jobs, logs = write_jobs(tmp_path), tmp_path / "logs"
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    ctx = context(jobs)
    lifecycle.start(ctx, submit_command=lambda checkpoint, conf: spark_submit_command(ctx.job, checkpoint, conf),
                    log_dir=logs, fresh=True, wait_timeout=240)
    first = read_run(ctx.folder)
    try:
        with Feeder(tmp_path / "input", sent, 2, every=1.0):
            decided = wait_for_scale_up(jobs)
            assert (decided["action"], decided["target"]["partitions"]) == ("scale_up", 3), decided
            code, acted = autoscale(jobs, logs)
            assert (code, acted["outcome"], acted["error"]) == (0, "acted", None), acted
            assert acted["spark_conf"] == {}  # local[2]: its cores are its master's, no conf changes them
            upgrade = acted["upgrade"]
            assert upgrade["state_partitions"] == 3 and upgrade["mode"] == "savepoint" and upgrade["check_duration_s"]
            assert upgrade["run_id"] != first.run_id and upgrade["from_version"] == upgrade["to_version"]  # same version
            assert lifecycle.status(ctx).run_id == upgrade["run_id"]
            deadline = time.monotonic() + 120  # the new run's own progress reports 3 state partitions
            while not [p for p in read_series(ctx.folder) if p.run_id == upgrade["run_id"] and p.state_partitions == 3]:
                assert time.monotonic() < deadline, read_series(ctx.folder)[-3:]
                time.sleep(1)
        outcomes = [d["outcome"] for d in read_decisions(ctx.folder)]
        assert [o for o in outcomes if o not in ("recommended", "held")] == ["acted"], outcomes
        checks = [s for s in list_savepoints(ctx.root, JOB) if s.reason == "upgrade check"]
        assert len(checks) == 1  # checked first
        assert wait_for_sink(tmp_path / "output", sorted(sent)) == sorted(sent), "every input row once"
    finally:
        for run_record in (read_run(ctx.folder), first):
            stop_process(run_record, grace=30)
