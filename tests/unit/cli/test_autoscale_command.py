"""``airflow-savepoints job autoscale``: reads the job's series and decision history, prints the decision and
its evidence, records it (bounded); refuses to run without a policy. A job "runs" as a driver's side of a run
(its lease and heartbeats, ``tests/test_lifecycle.py``'s ``running_run``): no Spark, no patched status."""

from __future__ import annotations

import json
import os
import time

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core.names import AUTOSCALE_FILE
from airflow_savepoints.jobs.description.metrics import write_series
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.storage import Store
from tests.unit.jobs.test_autoscale import batches
from tests.unit.test_docs_drift import json_keys, prose


@pytest.fixture
def job(tmp_path):
    def make(autoscale: str | None = "      max_executors: 4\n", series=None, master: str = "spark://m:7077"):
        path = tmp_path / "jobs.yaml"
        block = f"    autoscale:\n{autoscale}" if autoscale is not None else ""
        path.write_text(f"jobs:\n  - name: orders\n    application: app.py\n    checkpoint: {tmp_path}/ckpt\n"
                        f"    master: {master}\n    savepoint_dir: {tmp_path}/sp\n{block}")
        folder = Store(str(tmp_path / "sp" / "orders"))
        if series is not None:
            write_series(folder, series)
        return path, tmp_path / "sp" / "orders"
    return make


def running(path, state: str = "running") -> None:
    """The job of jobs file ``path`` in ``state``: its lease taken as a start takes it (``starting``), then its
    driver's claim and first heartbeat (``running``)."""
    from airflow_savepoints.jobs import load_jobs
    from airflow_savepoints.jobs.workflows.run import JobContext
    from tests.test_lifecycle import running_run

    job = load_jobs(str(path))["orders"]
    ctx = JobContext(job, Store(job.savepoint_dir))
    if state == "running":
        running_run(ctx)
    else:
        assert ctx.lease.acquire("r1", {"host": "worker-a", "timeout_s": 30}) is None
    assert lifecycle.status(ctx).state == state


def invoke(*args: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__SAVEPOINTS", "AIRFLOW_CONN_", "SAVEPOINTS_"))}
    result = CliRunner().invoke(app, ["job", "autoscale", *args, "--json"], env=env)
    return result.exit_code, json.loads(result.stdout)


def step_up_ending_now():
    series = batches([(1200, 120), (360, 190)], cores=2)
    shift = time.time() - 1 - series[-1].time
    return [p.model_copy(update={"time": p.time + shift}) for p in series]


def test_a_step_up_is_recommended_with_its_evidence_and_recorded(job):
    path, folder = job(series=step_up_ending_now())
    running(path)
    code, out = invoke("orders", "--jobs-file", str(path), "--dry-run")
    assert code == 0, out
    assert (out["action"], out["outcome"], out["dry_run"]) == ("scale_up", "recommended", True)
    assert out["current"] == {"executors": 2, "cores": 2, "partitions": None}
    assert out["target"] == {"executors": 3, "cores": 3, "partitions": None}
    assert out["spark_conf"] == {"spark.cores.max": "3", "spark.executor.cores": "1"}
    assert out["evidence"]["required_cores"] == pytest.approx(190 / 70, abs=0.01)
    assert sorted(json_keys(prose("job autoscale"))) == sorted(out), "docs/cli.md ## job autoscale's JSON keys"
    recorded = json.loads((folder / AUTOSCALE_FILE).read_text())["decisions"]
    assert [(d["action"], d["outcome"]) for d in recorded] == [("scale_up", "recommended")]
    # mode recommend (the default) reports without --dry-run too
    code, again = invoke("orders", "--jobs-file", str(path))
    assert (code, again["outcome"], again["dry_run"]) == (0, "recommended", False)


def test_a_job_that_is_not_running_is_held_and_so_recorded(job):
    path, folder = job(series=step_up_ending_now())
    code, out = invoke("orders", "--jobs-file", str(path), "--dry-run")
    assert (code, out["action"], out["reason"], out["outcome"]) == (0, "hold", "not_running", "held")
    assert "not_started" in out["message"]
    assert json.loads((folder / AUTOSCALE_FILE).read_text())["decisions"][-1]["outcome"] == "held"


def test_an_action_within_the_cooldown_holds(job):
    path, folder = job(series=step_up_ending_now())
    running(path)
    folder.joinpath(AUTOSCALE_FILE).write_text(json.dumps({"decisions": [{"at_epoch": time.time() - 60, "outcome": "acted"}]}))
    code, out = invoke("orders", "--jobs-file", str(path), "--dry-run")
    assert (code, out["reason"], out["outcome"]) == (0, "cooldown", "held")


def test_a_start_in_flight_holds(job):
    path, _ = job(series=step_up_ending_now())
    running(path, "starting")
    code, out = invoke("orders", "--jobs-file", str(path), "--dry-run")
    assert (code, out["reason"]) == (0, "in_flight")


def test_mode_act_with_dry_run_only_reports(job):
    """``--dry-run`` under ``mode: act`` reports the decision and changes nothing (acting: tests/unit/jobs/test_autoscale_act.py)."""
    path, folder = job("      mode: act\n", series=step_up_ending_now())
    running(path)
    code, out = invoke("orders", "--jobs-file", str(path), "--dry-run")
    assert (code, out["action"], out["mode"], out["outcome"]) == (0, "scale_up", "act", "recommended"), out
    assert not (folder / "_check").exists() and not (folder / "_rescale").exists()


def test_a_job_without_a_policy_is_refused(job):
    path, _ = job(None)
    code, out = invoke("orders", "--jobs-file", str(path), "--dry-run")
    assert code == 1 and out["error"]["code"] == "autoscale_not_configured", out
