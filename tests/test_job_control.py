"""Starting, watching and stopping real streaming jobs: locally and on a real Spark standalone cluster.

Cooperative stops (between two batches), signal stops, status with the application id, and a job
killed mid-run making the progress trigger fail with a reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import airflow_savepoints.demo.app as demo
from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.core import list_savepoints
from airflow_savepoints.core.state_summary import read_summary
from airflow_savepoints.jobs.description.metrics import read_series
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.jobs.driver.control import _note_batch_running, _stop_between_batches
from airflow_savepoints.jobs.launch.launcher import process_alive, start_detached, wait_for_commit
from airflow_savepoints.jobs.workflows.lifecycle import job_status
from airflow_savepoints.jobs.workflows.run import stop_process
from airflow_savepoints.operators.job import InspectJobOperator, RestoreJobOperator, StopJobWithSavepointOperator
from airflow_savepoints.storage import Store
from airflow_savepoints.triggers.savepoint import BatchCommittedTrigger

pytestmark = pytest.mark.slow


def write_jobs(tmp_path: Path, master: str = "local[2]") -> str:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n  - name: demo\n"
        f"    application: {demo.__file__}\n"
        f"    application_args: ['{tmp_path}/input', '{{checkpoint}}', '{tmp_path}/output']\n"
        f"    master: {master}\n"
        "    spark_conf: {spark.ui.enabled: 'false', spark.sql.shuffle.partitions: '2', spark.executor.memory: 512m}\n"
        f"    checkpoint: {tmp_path}/checkpoint\n"
        f"    savepoint_dir: {tmp_path}/savepoints\n")
    return str(jobs)


def committed_batches(checkpoint: str) -> tuple[list[int], list[int]]:
    def ids(folder: str) -> list[int]:
        path = Path(checkpoint, folder)
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) if path.exists() else []
    return ids("offsets"), ids("commits")


def wait_past(checkpoint: str, batch: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newest, _ = checkpoint_progress(Store(checkpoint))
        if newest is not None and newest > batch:
            return newest
        time.sleep(0.5)
    raise TimeoutError(f"no batch past {batch} in {checkpoint} within {timeout}s")


def wait_quiet(checkpoint: str, quiet: float = 3.0, timeout: float = 120) -> int:
    """The newest committed batch once no new one has come for ``quiet`` s (a file source with its input all taken)."""
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        newest, _ = checkpoint_progress(Store(checkpoint))
        if newest != last:
            last, since = newest, time.monotonic()
        elif newest is not None and time.monotonic() - since >= quiet:
            return newest
        time.sleep(0.25)
    raise TimeoutError(f"{checkpoint} kept committing batches for {timeout}s")


def test_cooperative_stop_lands_between_batches_and_status_names_the_application(tmp_path):
    for index in range(2):
        demo.write_events(tmp_path / "input", index)
    jobs = write_jobs(tmp_path)
    started = RestoreJobOperator(task_id="start", job="demo", jobs_file=jobs, fresh_start=True).execute({})
    job_folder = Store(str(tmp_path / "savepoints" / "demo"))
    try:
        deadline = time.monotonic() + 60
        while job_status("demo", job_folder).application_id is None and time.monotonic() < deadline:
            time.sleep(0.5)
        status = job_status("demo", job_folder)
        assert status.running and status.pid == started["pid"]
        assert status.application_id and status.application_id.startswith("local-")
        for index in range(2, 6):
            demo.write_events(tmp_path / "input", index)
        wait_past(started["checkpoint"], started["first_batch"])
        wait_quiet(started["checkpoint"])  # every file taken: the restart below has no new input
        result = StopJobWithSavepointOperator(task_id="stop", job="demo", jobs_file=jobs, grace=60).execute({})
    finally:
        stop_process(read_run(job_folder), grace=10)
    assert result["stop_method"] == "cooperative" and result["consistency"] == "clean"
    assert not process_alive(started["pid"])
    offsets, commits = committed_batches(started["checkpoint"])
    assert offsets[-1] == commits[-1] == result["batch_id"]  # nothing in flight when it stopped
    saved = list_savepoints(Store(str(tmp_path / "savepoints")), "demo")
    assert [(s.type.value, s.batch_id) for s in saved] == [("stop", result["batch_id"])]
    assert not job_status("demo", job_folder).running
    # issue 42: the helper recorded the run's batches in the job's metric series, up to the stop batch
    series = [p for p in read_series(job_folder) if not p.idle]
    assert series and {p.run_id for p in series} == {started["run_id"]}, series
    assert series[-1].batch_id == result["batch_id"] and all(p.cores == 2 for p in series), series[-1]
    assert all(p.trigger_interval_ms and p.duration_ms is not None and p.stateful for p in series), series[-1]

    # issue 29, item 7: a driver that dies before it is live still fails the start fast; a restart from the stop
    # savepoint with NO new input is live within a minute (its heartbeat), at the restored batch
    dying = tmp_path / "dying.yaml"
    dying.write_text(Path(jobs).read_text().replace(f"application: {demo.__file__}", f"application: {tmp_path}/gone.py"))
    start = ["job", "start", "demo", "--from", result["pointer"], "--json", "--wait-timeout", "120"]
    begun = time.monotonic()
    failed = CliRunner().invoke(cli_app, [*start, "--jobs-file", str(dying)])
    failed_in = time.monotonic() - begun
    error = json.loads(failed.stdout)["error"]
    assert failed.exit_code == 1 and error["code"] == "job_failed" and "exited before committing" in error["message"], \
        failed.output[-2000:]
    assert failed_in < 60, failed_in
    begun = time.monotonic()
    try:
        restarted = CliRunner().invoke(cli_app, [*start, "--jobs-file", jobs])
        live_in = time.monotonic() - begun
        assert restarted.exit_code == 0, restarted.output[-3000:]
        body = json.loads(restarted.stdout)
        assert body["live"] == "heartbeat" and body["first_batch"] == body["restored"]["batch_id"] == result["batch_id"]
        assert live_in < 60, live_in
        assert job_status("demo", job_folder).state == "running"
        assert committed_batches(body["checkpoint"])[1][-1] == result["batch_id"]  # no input: no new batch, and healthy
    finally:
        stop_process(read_run(job_folder), grace=10)
    print(f"dead driver failed the start in {failed_in:.1f}s; idle restart live in {live_in:.1f}s")


def in_flight(checkpoint: str) -> bool:
    """A batch is in flight: its offsets are logged, its commit is not (the checkpoint's own record)."""
    offsets, commits = committed_batches(checkpoint)
    return bool(offsets) and (not commits or offsets[-1] > commits[-1])


def test_6_stops_while_input_keeps_arriving_cut_no_batch(spark, tmp_path):
    """The demo query (300 ms trigger) fed a file every 0.4 s, faster than it keeps up with, so
    batches run back to back: each stop lands between batches or lets the running one commit. Four
    stops are asked for 0-90 ms after a batch's offsets are logged (at least 3 must find a batch in
    flight, offsets ahead of commits, when the stop is asked for), two at any point of a batch. The odd
    trials watch the query as the run's loop does before the stop (``_note_batch_running``), so a batch
    in flight counts its planning allowance from its first sight, not from the stop."""
    outcomes = []
    for trial in range(6):
        base = tmp_path / f"run{trial}"
        checkpoint = str(base / "checkpoint")
        for index in range(2):
            demo.write_events(base / "input", index)
        query = demo.build_query(spark, str(base / "input"), checkpoint, str(base / "output"), trigger_ms=300)
        feeding = threading.Event()

        def feed(base=base, feeding=feeding):
            index = 2
            while not feeding.wait(0.4):
                demo.write_events(base / "input", index)
                index += 1

        feeder = threading.Thread(target=feed)
        feeder.start()
        seen: dict | None = {} if trial % 2 else None

        def watch(seconds: float, query=query, seen=seen) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if seen is not None:
                    _note_batch_running(query, seen, query.lastProgress)
                time.sleep(0.005)

        try:
            demo.wait_for_batch(query, 3)
            if trial < 4:  # a batch in flight: 0, 30, 60, 90 ms after its offsets were logged
                deadline = time.monotonic() + 60
                while not in_flight(checkpoint) and time.monotonic() < deadline:
                    watch(0.005)
                watch(0.03 * trial)
            else:  # anywhere in a batch, or between two
                watch(0.37 * trial)
            asked_in_flight = in_flight(checkpoint)
            safe = _stop_between_batches(query, timeout=60, seen_running=seen)
        finally:
            feeding.set()
            feeder.join()
            query.stop()
        offsets, commits = committed_batches(checkpoint)
        outcomes.append((asked_in_flight, safe, offsets[-1], commits[-1]))
    print("stops (batch in flight when asked, safe moment found, newest offsets, newest commit):", outcomes)
    assert all(safe and newest_offsets == newest_commit for _, safe, newest_offsets, newest_commit in outcomes), outcomes
    assert sum(asked for asked, *_ in outcomes) >= 3, outcomes  # the stops met batches in flight


def test_a_job_that_does_not_cooperate_is_stopped_with_signals(tmp_path):
    """Started without a control folder (as another tool would): SIGTERM, crash-consistent savepoint."""
    demo.write_events(tmp_path / "input", 0)
    jobs = write_jobs(tmp_path)
    command = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false", demo.__file__,
               str(tmp_path / "input"), str(tmp_path / "checkpoint"), str(tmp_path / "output")]
    checkpoint = Store(str(tmp_path / "checkpoint"))
    run = start_detached("demo", command, checkpoint, Store(str(tmp_path / "savepoints" / "demo")), tmp_path / "logs")
    try:
        wait_for_commit(run, checkpoint, timeout=240)
        result = StopJobWithSavepointOperator(task_id="stop", job="demo", jobs_file=jobs, grace=30).execute({})
    finally:
        stop_process(run, grace=10)
    assert result["stop_method"] == "signal" and not process_alive(run.pid)
    _, commits = committed_batches(str(tmp_path / "checkpoint"))
    assert result["batch_id"] == commits[-1]


def test_killing_the_job_makes_the_progress_trigger_fail_with_the_reason(tmp_path):
    demo.write_events(tmp_path / "input", 0)
    command = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false", demo.__file__,
               str(tmp_path / "input"), str(tmp_path / "checkpoint"), str(tmp_path / "output")]
    checkpoint = Store(str(tmp_path / "checkpoint"))
    run = start_detached("demo", command, checkpoint, Store(str(tmp_path / "savepoints" / "demo")), tmp_path / "logs")
    try:
        batch = wait_for_commit(run, checkpoint, timeout=240)
        trigger = BatchCommittedTrigger(checkpoint.url, batch + 1000, run.model_dump(mode="json"), poll_interval=0.5)

        async def wait_and_kill():
            waiting = asyncio.ensure_future(anext(trigger.run()))
            await asyncio.sleep(3)
            assert not waiting.done()  # the job is alive and has not got that far: still waiting
            os.killpg(run.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            event = await asyncio.wait_for(waiting, 30)
            return event, time.monotonic() - killed_at

        event, seconds = asyncio.run(wait_and_kill())
    finally:
        stop_process(run, grace=5)
    assert event.payload["status"] == "error" and seconds < 10
    assert f"(pid {run.pid}) is not running" in event.payload["message"]
    assert f"waiting for one past {batch + 1000}" in event.payload["message"]


def test_a_job_on_a_standalone_cluster_restarts_from_its_stop_savepoint(spark_standalone, tmp_path):
    """Master and worker from pyspark's jars (the session's); the driver runs here (client mode), executors on
    the worker."""
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    cluster = spark_standalone
    jobs = write_jobs(tmp_path, master=cluster.master_url)
    job_folder = Store(str(tmp_path / "savepoints" / "demo"))
    try:
        started = RestoreJobOperator(task_id="start", job="demo", jobs_file=jobs, fresh_start=True,
                                     wait_timeout=240).execute({})
        deadline = time.monotonic() + 60
        while job_status("demo", job_folder).application_id is None and time.monotonic() < deadline:
            time.sleep(0.5)
        app_id = job_status("demo", job_folder).application_id
        assert app_id and app_id.startswith("app-"), cluster.log_tails()
        assert app_id in cluster.app_ids("activeapps")
        for index in range(2, 4):
            sent.update(demo.write_events(tmp_path / "input", index))
        wait_past(started["checkpoint"], started["first_batch"])
        stopped = StopJobWithSavepointOperator(task_id="stop", job="demo", jobs_file=jobs).execute({})
        assert stopped["stop_method"] == "cooperative"
        deadline = time.monotonic() + 30
        while app_id not in cluster.app_ids("completedapps") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert app_id in cluster.app_ids("completedapps")

        # the stop savepoint's state, counted on the cluster by an application of the job (issue 43 item 3): one
        # deduplication key per distinct id the sink holds; stdout is the answer alone, progress on stderr
        in_sink = {row["id"] for row in demo.committed_rows(tmp_path / "output")}
        inspected = CliRunner().invoke(cli_app, ["job", "inspect", "demo", "--jobs-file", jobs, "--json"])
        assert inspected.exit_code == 0, inspected.output[-3000:]
        summary = json.loads(inspected.stdout)
        assert summary["pointer"].rstrip("/").endswith(stopped["pointer"].rstrip("/").split("/")[-1]), summary
        assert summary["batch_id"] == stopped["batch_id"] and summary["total_rows"] == len(in_sink) > 0, summary
        assert summary["application"]["application_id"] in cluster.app_ids("completedapps"), summary["application"]
        assert "as a Spark application of job demo (master spark://" in inspected.stderr
        assert not (tmp_path / "savepoints" / "demo" / "_inspect").exists() or \
            not any((tmp_path / "savepoints" / "demo" / "_inspect").iterdir())
        # the operator's way: the same application, and the summary recorded beside the savepoint for the console
        recorded = InspectJobOperator(task_id="inspect", job="demo", jobs_file=jobs, operator_id=0).execute({})
        assert recorded["application"]["application_id"] in cluster.app_ids("completedapps"), recorded["application"]
        assert recorded["application"]["application_id"] != summary["application"]["application_id"]
        assert read_summary(job_folder, recorded["savepoint_id"]).total_rows == len(in_sink)

        for index in range(4, 6):
            sent.update(demo.write_events(tmp_path / "input", index))
        restarted = RestoreJobOperator(task_id="restore", job="demo", jobs_file=jobs, wait_timeout=240).execute({})
        assert restarted["restored"]["batch_id"] == stopped["batch_id"]
        assert restarted["first_batch"] >= stopped["batch_id"]  # live by its heartbeat at the restored batch, or later
        wait_past(restarted["checkpoint"], stopped["batch_id"])
        _, commits = committed_batches(restarted["checkpoint"])
        assert commits[:2] == [stopped["batch_id"], stopped["batch_id"] + 1]  # resumed right after the savepoint
        new_app = job_status("demo", job_folder).application_id
        deadline = time.monotonic() + 60
        while (new_app is None or new_app == app_id) and time.monotonic() < deadline:
            time.sleep(0.5)
            new_app = job_status("demo", job_folder).application_id
        assert new_app != app_id and new_app in cluster.app_ids("activeapps")
    finally:
        last = read_run(job_folder)
        if last is not None:
            stop_process(last, grace=15)
