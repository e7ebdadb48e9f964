"""The autoscaler acting on a real job on a local master: a de-duplicating job (RocksDB state, 2 state partitions,
``tests/support/autoscale_stream_app.py`` with no sleep) under spark-submit on ``local[2]``, fed a file every
second, with a policy whose target utilization its batches exceed, so its own recorded metrics call for a
scale-up (2 -> 3 cores). A local master gives the job its cores itself, so the change carried out is the state
partitions alone (2 -> 3, they bind), with no Spark conf.

The first scale-up passes its check (3 state partitions on a copy of the state), then fails after its restart:
once the stop savepoint is taken, the app's ``partitionsAllowedFile`` says 2, and a row of its stateful stage in
partition 2 fails its task. The rescale had written its repartition batch into the file sink's log, so a restart
from the stop savepoint would be refused ``sink_ahead``: the rollback restores the old configuration from the
new run's progress instead (a ``rollback`` savepoint of its checkpoint, rescaled back to 2 partitions), recorded
``rolled_back``, and the job runs on with 2 partitions, every row once. Then (the file gone, the cooldown out) a
second scale-up is carried out (checked first, restored into 3 state partitions), the job runs on with them,
and the sink holds every input row once.

The rest of the end-to-end proof runs on the distributed test bed's standalone cluster
(tests/test_distributed.py, ``test_h_...``): more cores across two workers under a load step, a scale-up whose
new configuration fails its check recorded ``rolled_back`` with the job untouched, the operator (a DAG on a
Celery worker) held by the cooldown of that attempt and of the action, a scale-down after the window, exactly
once across the actions. The change of state partitions is proven here only.
"""

from __future__ import annotations

import json
import threading
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
from tests.support import autoscale_stream_app as app
from tests.support.feeding import Feeder, wait_for_sink
from tests.support.spark_shapes import ROCKS_CHANGELOG

pytestmark = pytest.mark.slow
JOB = "demo-autoscale"
APP_CONF = {app.SLEEP_CONF: "0", app.TRIGGER_CONF: "500", app.MAX_FILES_CONF: "10"}


def write_jobs(home: Path) -> Path:
    settings = {**ROCKS_CHANGELOG, **APP_CONF, app.PARTITIONS_ALLOWED_CONF: str(home / "partitions-allowed")}
    conf = "\n".join(f'      {key}: "{value}"' for key, value in settings.items())
    path = home / "jobs.yaml"
    path.write_text(f"""jobs:
  - name: {JOB}
    application: {app.__file__}
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


def act_on_scale_up(jobs: Path, logs: Path, timeout: float = 240) -> tuple[dict, int, dict]:
    """A dry run's scale-up, then `job autoscale` acting: again when the act held because the metrics moved in
    between (a batch back within the band, on a loaded machine). (the dry run's decision, exit code, the act's.)"""
    deadline = time.monotonic() + timeout
    while True:
        decided = wait_for_scale_up(jobs)
        assert (decided["action"], decided["target"]["partitions"]) == ("scale_up", 3), decided
        code, result = autoscale(jobs, logs)
        if result["outcome"] != "held" or time.monotonic() > deadline:
            return decided, code, result


def allow_partitions_once_stopped(ctx: JobContext, marker: Path, allowed: int, done: threading.Event) -> threading.Thread:
    """Write ``allowed`` into the app's partitionsAllowedFile once a stop savepoint of the job exists (after the
    check of the action, before its new run's first batch)."""
    def watch() -> None:
        while not done.wait(0.2):
            if any(s.reason == "stop" for s in list_savepoints(ctx.root, JOB)):
                marker.write_text(str(allowed))
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def partitions_of_run(ctx: JobContext, run_id: str, partitions: int, timeout: float = 120) -> None:
    """Wait until the run's own progress reports ``partitions`` state partitions."""
    deadline = time.monotonic() + timeout
    while not [p for p in read_series(ctx.folder) if p.run_id == run_id and p.state_partitions == partitions]:
        assert time.monotonic() < deadline, read_series(ctx.folder)[-3:]
        time.sleep(1)


def every_row_once(feeder: Feeder, output: Path, sent: set[int]) -> None:
    feeder.pause()
    try:
        assert wait_for_sink(output, sorted(sent)) == sorted(sent), "every input row once"
    finally:
        feeder.resume()


def test_on_a_local_master_a_scale_up_that_fails_after_its_restart_rolls_back_on_its_progress_then_one_rescales(tmp_path):
    jobs, logs, marker = write_jobs(tmp_path), tmp_path / "logs", tmp_path / "partitions-allowed"
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    ctx = context(jobs)
    lifecycle.start(ctx, submit_command=lambda checkpoint, conf: spark_submit_command(ctx.job, checkpoint, conf),
                    log_dir=logs, fresh=True, wait_timeout=240)
    first = read_run(ctx.folder)
    runs = [first]
    done = threading.Event()
    try:
        with Feeder(tmp_path / "input", sent, 2, every=1.0) as feeder:
            # 1. checked, restarted with 3 partitions, failed after the restart: rolled back on the new run's progress
            allow_partitions_once_stopped(ctx, marker, 2, done)
            _, code, rolled = act_on_scale_up(jobs, logs)
            runs.append(read_run(ctx.folder))
            assert (code, rolled["outcome"], rolled["upgrade"]) == (1, "rolled_back", None), rolled
            assert marker.exists()  # the check passed before it was written: the restart failed
            on = rolled["rollback"]["rolled_back_on"]
            assert (on["from"], on["state_partitions"]) == ("progress", 2), rolled["rollback"]
            assert f"on the new run's progress (savepoint {on['savepoint_id']}, batch {on['batch_id']})" \
                in rolled["error"]["message"], rolled["error"]
            [taken] = [s for s in list_savepoints(ctx.root, JOB) if s.reason == "rollback"]
            [stop] = [s for s in list_savepoints(ctx.root, JOB) if s.reason == "stop"]
            assert taken.savepoint_id == on["savepoint_id"] and taken.batch_id == on["batch_id"] > stop.batch_id
            assert lifecycle.status(ctx).run_id == on["run_id"] != on["failed_run_id"] != first.run_id
            partitions_of_run(ctx, on["run_id"], 2)  # the old configuration, running on
            every_row_once(feeder, tmp_path / "output", sent)
            # 2. the same scale-up once the new configuration is sound: carried out
            marker.unlink()
            _, code, acted = act_on_scale_up(jobs, logs)
            runs.append(read_run(ctx.folder))
            assert (code, acted["outcome"], acted["error"], acted["rollback"]) == (0, "acted", None, None), acted
            assert acted["spark_conf"] == {}  # local[2]: its cores are its master's, no conf changes them
            upgrade = acted["upgrade"]
            assert upgrade["state_partitions"] == 3 and upgrade["mode"] == "savepoint" and upgrade["check_duration_s"]
            assert upgrade["run_id"] != on["run_id"] and upgrade["from_version"] == upgrade["to_version"]  # same version
            standby = upgrade["rescale_standby"]  # started and ready before the stop; it rescaled the stop savepoint
            assert standby["used"] and standby["ready_after_s"] > 0 and standby["application_id"], standby
            assert lifecycle.status(ctx).run_id == upgrade["run_id"]
            partitions_of_run(ctx, upgrade["run_id"], 3)
        outcomes = [d["outcome"] for d in read_decisions(ctx.folder)]
        assert [o for o in outcomes if o not in ("recommended", "held")] == ["rolled_back", "acted"], outcomes
        checks = [s for s in list_savepoints(ctx.root, JOB) if s.reason == "upgrade check"]
        assert len(checks) == 2  # each checked first
        assert wait_for_sink(tmp_path / "output", sorted(sent)) == sorted(sent), "every input row once"
    finally:
        done.set()
        for run_record in {r.run_id: r for r in [read_run(ctx.folder), *runs] if r}.values():
            stop_process(run_record, grace=30)
