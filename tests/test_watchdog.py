"""The watchdog on a real job (the demo job under spark-submit) and a real Airflow (the supervise_jobs
DAG with dag.test()): a SIGKILLed job restarted last-state, then, its checkpoint damaged, from the
newest savepoint after a backoff, and left down after the maximum of restarts. Decisions show in
``job status --json``; the sink holds every event once."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import airflow_savepoints.demo.app as demo
from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.core import take_savepoint
from airflow_savepoints.core.settings import parse_duration
from airflow_savepoints.jobs import StreamingJob, load_jobs
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.jobs.launch.launcher import spark_submit_command
from airflow_savepoints.jobs.workflows import lifecycle, watchdog
from airflow_savepoints.jobs.workflows.run import JobContext, stop_process
from airflow_savepoints.jobs.workflows.upgrade import checkpoint_problem
from airflow_savepoints.storage import Store
from tests.conftest import ROOT
from tests.support.feeding import Feeder, wait_for_sink

JOB = "demo-dedup"
JOBS_FILE = str(ROOT / "dags" / "jobs.yaml")


def run_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(ROOT / "dags" / f"{dag_id}.py")).get_dag(dag_id)
    result = dag.test()
    return result.state, {t.task_id: t.state for t in result.get_task_instances()}


def kill_and_wait_failed(ctx: JobContext) -> None:
    run = read_run(ctx.folder)
    os.killpg(run.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while lifecycle.status(ctx).state != "failed":
        assert time.monotonic() < deadline, lifecycle.status(ctx)
        time.sleep(0.2)


def status_json(tmp_path: Path) -> dict:
    result = CliRunner().invoke(cli_app, ["job", "status", JOB, "--jobs-file", JOBS_FILE, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def submit(ctx: JobContext):
    return lambda checkpoint, conf: spark_submit_command(ctx.job, checkpoint, conf)


@pytest.mark.slow
def test_restarts_with_backoff_then_gives_up(airflow_db, tmp_path, monkeypatch):
    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", str(tmp_path))
    monkeypatch.setenv("SAVEPOINTS_DEMO_APP", demo.__file__)
    monkeypatch.setenv("SAVEPOINTS_DEMO_MAX_RESTARTS", "2")
    # outlasts what happens between the first restart and the backoff decision (a drain of the input
    # written before the first kill, a kill): 4.4-5.6 s at load 4-10 on 2 cores
    monkeypatch.setenv("SAVEPOINTS_DEMO_RESTART_BACKOFF", "20")
    job = load_jobs(JOBS_FILE)[JOB]
    ctx = JobContext(job, Store(job.savepoint_dir))
    live = job.checkpoint
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    try:
        with Feeder(tmp_path / "input", sent, 2, every=4) as feeder:
            lifecycle.start(ctx, submit_command=submit(ctx), log_dir=tmp_path / "logs", fresh=True, wait_timeout=240)

            # SIGKILL while input arrives: the DAG restarts it on its live checkpoint (it passes the checks),
            # nothing copied. No input meanwhile: what the restarted run drains before the next kill stays short
            kill_and_wait_failed(ctx)
            feeder.pause()
            state, tasks = run_dag("supervise_jobs")
            assert (state, tasks) == ("success", {"supervise": "success"})
            first = read_run(ctx.folder)
            assert first.checkpoint == live and first.ended is None and lifecycle.status(ctx).live
            shown = status_json(tmp_path)["watchdog"]
            assert shown["restarts"] == 1 and shown["last_decision"]["action"] == "restarted"
            assert shown["last_decision"]["mode"] == "last-state" and shown["next_retry_at"]

            # killed again, between batches (a kill mid-commit can leave the file sink a batch
            # past the checkpoint, which only last-state recovers): the next restart waits for its backoff
            assert wait_for_sink(tmp_path / "output", sorted(sent)) == sorted(sent)
            kill_and_wait_failed(ctx)
            waiting = watchdog.supervise(ctx, submit_command=submit(ctx), log_dir=tmp_path / "logs", wait_timeout=30)
            assert waiting.action == "backoff" and waiting.next_retry_at > waiting.at
            print(f"\nbackoff decision {20 - (waiting.next_retry_at - waiting.at):.1f}s into the 20s backoff")
            assert lifecycle.status(ctx).state == "failed"
            # a savepoint of its last committed batch, then the live checkpoint is damaged
            saved = take_savepoint(live, JOB, savepoint_dir=job.savepoint_dir)
            (Path(live) / "metadata").unlink()  # replaced, as Spark writes files (the savepoint hard-links them)
            (Path(live) / "metadata").write_text("not json")
            assert checkpoint_problem(ctx, live) is not None
            feeder.resume()
            time.sleep(max(0.0, waiting.next_retry_at - waiting.at) + 0.5)
            restarted = watchdog.supervise(ctx, submit_command=submit(ctx), log_dir=tmp_path / "logs",
                                           wait_timeout=240)
            assert (restarted.action, restarted.mode) == ("restarted", "savepoint"), restarted.reason
            second = read_run(ctx.folder)
            assert second.checkpoint.startswith(live + "-") and second.start_batch == saved.manifest.batch_id
        assert wait_for_sink(tmp_path / "output", sorted(sent)) == sorted(sent)  # once each, over 2 restarts

        # a third failure: the maximum (2 per window) is reached, the job stays down, the DAG run fails
        kill_and_wait_failed(ctx)
        state, tasks = run_dag("supervise_jobs")
        assert (state, tasks) == ("failed", {"supervise": "failed"})
        assert lifecycle.status(ctx).state == "failed"
        shown = status_json(tmp_path)["watchdog"]
        assert shown["last_decision"]["action"] == "gave_up" and "max_restarts 2" in shown["gave_up"]
    finally:
        stop_process(read_run(ctx.folder), grace=10)


def test_a_planned_batch_uncommitted_past_progress_timeout_is_stalled(checkpoint, tmp_path):
    """A checkpoint whose newest offsets have no commit (input waiting) for longer than progress_timeout."""
    job = StreamingJob(name="stuck", application="app.py", checkpoint=str(checkpoint), progress_timeout=1,
                       savepoint_dir=str(tmp_path / "savepoints"))
    ctx = JobContext(job, Store(job.savepoint_dir))
    newest = _newest(checkpoint, "commits")
    state = lifecycle.JobState(job="stuck", state="running", checkpoint=str(checkpoint))
    assert watchdog.stall_reason(ctx, state) is None  # everything planned is committed
    (checkpoint / "commits" / str(newest)).unlink()  # batch `newest` planned, not committed
    old = time.time() - 5
    os.utime(checkpoint / "offsets" / str(newest), (old, old))
    reason = watchdog.stall_reason(ctx, state)
    assert reason and f"batch {newest} was planned" in reason and f"last committed batch {newest - 1}" in reason


@pytest.mark.slow
def test_a_real_job_whose_batch_hangs_is_reported_stalled_within_its_progress_timeout(tmp_path):
    """The demo job under spark-submit, its next batch held (input waiting, nothing committed): the
    watchdog reports it stalled once the batch is older than progress_timeout, and leaves it running."""
    hold, inputs, output = tmp_path / "hold", tmp_path / "input", tmp_path / "output"
    job = StreamingJob(name="stalling", application=demo.__file__, master="local[2]", progress_timeout=4,
                       application_args=[str(inputs), "{checkpoint}", str(output)],
                       spark_conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                                   demo.STALL_WHILE_CONF: str(hold)},
                       checkpoint=str(tmp_path / "checkpoint"), savepoint_dir=str(tmp_path / "savepoints"))
    ctx = JobContext(job, Store(job.savepoint_dir))
    logs, sent = tmp_path / "logs", set(demo.write_events(inputs, 0))
    try:
        started = lifecycle.start(ctx, submit_command=submit(ctx), log_dir=logs, fresh=True, wait_timeout=240)
        assert watchdog.supervise(ctx, submit_command=submit(ctx), log_dir=logs).action == "healthy"
        hold.touch()
        sent.update(demo.write_events(inputs, 1))
        deadline, healthy_looks = time.monotonic() + 60, []
        while True:
            began = time.time()
            decision = watchdog.supervise(ctx, submit_command=submit(ctx), log_dir=logs)
            if decision.action != "healthy":
                break
            healthy_looks.append(began)
            assert time.monotonic() < deadline, "never reported stalled"
            time.sleep(0.5)
        assert decision.action == "stalled", decision
        held = int(re.match(r"batch (\d+) was planned", decision.reason).group(1))  # a no-data batch may come first
        planned_at = (Path(job.checkpoint) / "offsets" / str(held)).stat().st_mtime
        reported_after = time.time() - planned_at
        assert not (Path(job.checkpoint) / "commits" / str(held)).exists() and held > started["first_batch"]
        assert reported_after >= 4, reported_after  # not before its progress_timeout
        # the first look past it says so (0.1 s: file times come from the kernel's coarse clock, time.time() does not)
        late = [round(look - planned_at, 3) for look in healthy_looks if look - planned_at >= 4 + 0.1]
        assert late == [], f"looks begun past the progress_timeout said healthy: {late}"
        assert lifecycle.status(ctx).live and read_run(ctx.folder).run_id == started["run_id"]  # reported, not restarted
        hold.unlink()
        assert wait_for_sink(output, sorted(sent)) == sorted(sent)
        # the sink holds a batch's rows before Spark writes its commit, and the watermark's no-data batch
        # follows the held one: each look waits until every planned batch is committed. On a loaded machine
        # a later batch may itself outlast the 4 s; the released batch is never reported again
        deadline = time.monotonic() + 90
        while True:
            assert time.monotonic() < deadline, "the job never caught up after its batch was released"
            if _newest(job.checkpoint, "offsets") > _newest(job.checkpoint, "commits"):
                time.sleep(0.2)
                continue
            decision = watchdog.supervise(ctx, submit_command=submit(ctx), log_dir=logs)
            if decision.action == "healthy":
                break
            later = int(re.match(r"batch (\d+) was planned", decision.reason).group(1))
            assert later > held, f"batch {held} was committed and is still reported: {decision}"
    finally:
        stop_process(read_run(ctx.folder), grace=10)


def _newest(checkpoint: str | Path, log: str) -> int:
    """The newest batch in a local checkpoint's ``log`` folder (offsets, commits), -1 if none."""
    return max((int(p.name) for p in (Path(checkpoint) / log).iterdir() if p.name.isdigit()), default=-1)


def test_decisions_without_spark(tmp_path):
    """down without restarts, gave_up at the maximum (kept while down), a fresh count once it runs again;
    each decision in _watchdog.json and job status --json's shape."""
    from tests.test_lifecycle import driver, running_run

    job = StreamingJob(name="orders", application="app.py", checkpoint=str(tmp_path / "checkpoint"),
                       savepoint_dir=str(tmp_path / "savepoints"), lease_timeout=30)
    ctx = JobContext(job, Store(job.savepoint_dir))
    never = lambda checkpoint, conf: pytest.fail("no restart expected")  # noqa: E731
    assert watchdog.supervise(ctx, submit_command=never, log_dir=tmp_path).action == "not_running"
    run = running_run(ctx, last_batch=3)
    assert watchdog.supervise(ctx, submit_command=never, log_dir=tmp_path).action == "healthy"
    run.control.report_failure(RuntimeError("bad record"))
    down = watchdog.supervise(ctx, submit_command=never, log_dir=tmp_path)
    assert down.action == "down" and "bad record" in down.reason and watchdog.alerts([down]) is not None

    ctx.job = job.model_copy(update={"restart": job.restart.model_copy(update={"enabled": True, "max_restarts": 1})})
    memory = watchdog.read_state(ctx)
    window = parse_duration(ctx.job.restart.window)
    memory.restarts = [down.at - window - 60, down.at - 5]  # one restart before the window, one in it
    ctx.folder.write_bytes_atomic(watchdog.WATCHDOG_FILE, memory.model_dump_json().encode())
    given_up = watchdog.supervise(ctx, submit_command=never, log_dir=tmp_path)
    assert given_up.action == "gave_up" and "max_restarts 1" in given_up.reason
    assert "gave_up" in str(watchdog.alerts([given_up]))
    view = watchdog.read_state(ctx).view()
    assert view["gave_up"] and view["restarts"] == 1 and view["last_decision"]["action"] == "gave_up"  # the old one pruned

    ctx.lease.release("r1")  # as the failed driver does on its way out
    assert ctx.lease.acquire("r2", {"host": "worker-b", "timeout_s": 30}) is None  # someone started it again
    again = driver(ctx, "r2")
    again.claim()
    again.beat(last_committed_batch=4)
    assert watchdog.supervise(ctx, submit_command=never, log_dir=tmp_path).action == "healthy"
    view = watchdog.read_state(ctx).view()
    assert view["gave_up"] is None and view["restarts"] == 0
    assert [d.action for d in watchdog.read_state(ctx).history] == ["not_running", "healthy", "down", "gave_up", "healthy"]
