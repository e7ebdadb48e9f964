"""The autoscaler acting on a real job: the demo job (RocksDB state, 2 state partitions) under spark-submit on
``local[2]``, fed a file every second, with a policy whose target utilization its batches exceed, so its own
recorded metrics call for a scale-up (2 -> 3 cores; on a local master the cores are its own, so the action is
the state partitions, 2 -> 3, which bind).

One job across the steps: a scale-up whose new configuration fails its check (the environment turns on the
demo's failEveryBatch for versions loaded from then on) is recorded ``rolled_back`` with the job untouched, and
the next ``job autoscale`` is held by the cooldown; with the environment fixed and the cooldown over,
``job autoscale`` acts (checked first, restored into 3 state partitions) and the job runs on with them; the
operator then answers held under ``dag.test()``. The sink holds every input row once.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
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
from tests.conftest import dag_bag_of_own_bundle
from tests.support.feeding import Feeder, wait_for_sink
from tests.support.spark_shapes import ROCKS_CHANGELOG

pytestmark = pytest.mark.slow
JOB = "demo-autoscale"
FAIL_ENV = "SAVEPOINTS_AUTOSCALE_TEST_FAIL"


def write_jobs(home: Path, cooldown: int) -> Path:
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
      {demo.FAIL_EVERY_BATCH_CONF}: "${{{FAIL_ENV}:-false}}"
    checkpoint: {home}/checkpoint
    savepoint_dir: {home}/savepoints
    sink: {{kind: file, path: {home}/output}}
    autoscale: {{max_executors: 3, min_partitions: 2, max_partitions: 3, target_utilization: 0.02,
                 utilization_band: 0.01, scale_up_after: 6, cooldown: {cooldown}, mode: act}}
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


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def test_a_rolled_back_scale_up_holds_the_cooldown_then_a_scale_up_rescales_the_running_job(airflow_db, tmp_path,
                                                                                          monkeypatch):
    jobs, logs = write_jobs(tmp_path, cooldown=3600), tmp_path / "logs"
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    ctx = context(jobs)
    lifecycle.start(ctx, submit_command=lambda checkpoint, conf: spark_submit_command(ctx.job, checkpoint, conf),
                    log_dir=logs, fresh=True, wait_timeout=240)
    first = read_run(ctx.folder)
    try:
        with Feeder(tmp_path / "input", sent, 2, every=1.0):
            # a new configuration that fails its check: rolled back (the run untouched), then held by the cooldown
            decided = wait_for_scale_up(jobs)
            assert (decided["action"], decided["target"]["partitions"]) == ("scale_up", 3), decided
            monkeypatch.setenv(FAIL_ENV, "true")
            code, failed = autoscale(jobs, logs)
            assert (code, failed["outcome"], failed["error"]["code"]) == (1, "rolled_back", "autoscale_rolled_back"), failed
            assert "failed its check" in failed["error"]["message"], failed["error"]
            assert "this version fails on every batch" in failed["error"]["message"], failed["error"]
            state = lifecycle.status(ctx)
            assert (state.state, state.run_id) == ("running", first.run_id)  # nothing was stopped
            rolled = read_decisions(ctx.folder)[-1]
            assert rolled["outcome"] == "rolled_back" and rolled["target"]["partitions"] == 3
            code, held = autoscale(jobs, logs)
            assert (code, held["outcome"], held["reason"]) == (0, "held", "cooldown"), held
            assert held["evidence"]["last_action_at"] == iso(rolled["at_epoch"])  # counted from the rolled-back one

            # the environment fixed and the cooldown shortened (over): the scale-up acts, checked first
            monkeypatch.delenv(FAIL_ENV)
            jobs = write_jobs(tmp_path, cooldown=1)
            assert wait_for_scale_up(jobs)["action"] == "scale_up"
            code, acted = autoscale(jobs, logs)
            assert (code, acted["outcome"], acted["error"]) == (0, "acted", None), acted
            upgrade = acted["upgrade"]
            assert upgrade["state_partitions"] == 3 and upgrade["mode"] == "savepoint" and upgrade["check_duration_s"]
            assert upgrade["run_id"] != first.run_id and upgrade["from_version"] == upgrade["to_version"]  # same version
            assert lifecycle.status(ctx).run_id == upgrade["run_id"]
            deadline = time.monotonic() + 120  # the new run's own progress reports 3 state partitions
            while not [p for p in read_series(ctx.folder) if p.run_id == upgrade["run_id"] and p.state_partitions == 3]:
                assert time.monotonic() < deadline, read_series(ctx.folder)[-3:]
                time.sleep(1)

            # the operator, under dag.test(): within the cooldown of that action, held
            jobs = write_jobs(tmp_path, cooldown=3600)
            bag = dag_bag_of_own_bundle(monkeypatch, tmp_path / "dags", "autoscale_test", {"autoscale_test.py": (
                "from datetime import datetime\nfrom airflow.sdk import DAG\n"
                "from airflow_savepoints.operators.autoscale import AutoscaleJobsOperator\n"
                "with DAG(dag_id='autoscale_test', schedule=None, start_date=datetime(2026, 1, 1)):\n"
                f"    AutoscaleJobsOperator(task_id='autoscale', jobs_file={str(jobs)!r})\n")})
            run = bag.get_dag("autoscale_test").test()
            assert run.state == "success", {t.task_id: t.state for t in run.get_task_instances()}
            last = read_decisions(ctx.folder)[-1]
            assert (last["outcome"], last["reason"]) == ("held", "cooldown"), last
            assert last["evidence"]["last_action_at"] == iso(next(
                d["at_epoch"] for d in read_decisions(ctx.folder) if d["outcome"] == "acted"))
        outcomes = [d["outcome"] for d in read_decisions(ctx.folder)]
        assert [o for o in outcomes if o not in ("recommended", "held")] == ["rolled_back", "acted"], outcomes
        checks = [s for s in list_savepoints(ctx.root, JOB) if s.reason == "upgrade check"]
        assert len(checks) == 2  # each action checked first
        assert wait_for_sink(tmp_path / "output", sorted(sent)) == sorted(sent), "every input row once"
    finally:
        for run_record in (read_run(ctx.folder), first):
            stop_process(run_record, grace=30)

