"""A start tells the truth, and a failure stays visible (issue 39, items 4 and 5), on a real Kafka topic.

One jobs.yaml job (tests/support/kafka_stream_app.py: Kafka in, a JSON file sink, the in-job helper),
driven only through the CLI, with no hand edits to the job:

1. a fresh start reads 150 records; while it idles, ``job status`` shows the checkpoint's last
   commit (an idle trigger's progress names the next batch: the heartbeat used to say that one);
   it is stopped with a savepoint;
2. 150 more records arrive and Kafka deletes 10 the savepoint resumes at (delete-records);
3. ``job start`` refuses (``kafka_offsets_gone``) before anything runs;
4. the same start with the check skipped (the job's ``kafka:`` left out) but the job not told:
   its first batch fails, and the start answers ``failed`` (exit 1) with Spark's message, not
   ``started``; ``job status`` says ``failed`` with that error and the last commit, and still
   does after ``job stop``, which refuses naming the dead run;
5. ``job start --skip-missing-input``: the helper reads Kafka with ``failOnDataLoss=false``; the run
   is live from the stop savepoint (the failed run registered none: it committed nothing), and its
   sink holds every record but the 10 deleted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.cli.main import app
from airflow_savepoints.core import list_savepoints
from airflow_savepoints.demo.app import committed_event_ids
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.jobs.launch.launcher import process_alive
from airflow_savepoints.jobs.workflows.run import stop_process
from airflow_savepoints.storage import Store
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.kafka]
PARTITIONS = 3


def produce(broker, topic: str, ids: range) -> None:
    broker.produce(topic, [(i % PARTITIONS, None, json.dumps({"id": i, "user": f"u{i % 7}"}).encode()) for i in ids])


def write_jobs(path: Path, home: Path, broker, topic: str, *, kafka_check: bool) -> str:
    from tests.support.emulators import jar_files
    from tests.support.kafka import CONNECTOR_JARS

    job = {"name": "kafka", "application": str(ROOT / "tests" / "support" / "kafka_stream_app.py"),
           "application_args": [broker.bootstrap, topic, "{checkpoint}", str(home / "output")], "master": "local[2]",
           "spark_conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                          "spark.jars": ",".join(jar_files(CONNECTOR_JARS)),
                          # an idle query's progress (naming the next batch id) 1 s after its last batch, not 10 s
                          "spark.sql.streaming.noDataProgressEventInterval": "1000"},
           "checkpoint": str(home / "checkpoint"), "savepoint_dir": str(home / "savepoints"),
           "checkpoint_retention": "RETAIN_ON_FAILURE", "sink": {"kind": "file", "path": str(home / "output")},
           "heartbeat_interval": 1}
    if kafka_check:
        job["kafka"] = {"bootstrap_servers": broker.bootstrap}
    path.write_text(yaml.safe_dump({"jobs": [job]}))
    return str(path)


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["job", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout:.0f}s")


def test_a_start_answers_failed_a_failure_stays_visible_and_skip_missing_input_reaches_the_job(
        kafka_broker, kafka_topic, tmp_path):
    home, output = tmp_path, tmp_path / "output"
    checked = write_jobs(tmp_path / "jobs.yaml", home, kafka_broker, kafka_topic, kafka_check=True)
    unchecked = write_jobs(tmp_path / "unchecked.yaml", home, kafka_broker, kafka_topic, kafka_check=False)
    job_folder, savepoints = Store(str(home / "savepoints" / "kafka")), Store(str(home / "savepoints"))
    produce(kafka_broker, kafka_topic, range(150))  # 50 per partition: 2 batches (maxOffsetsPerTrigger 100)
    try:
        code, started = cli("start", "kafka", "--fresh", "--wait-timeout", "240", "--jobs-file", checked)
        assert code == 0, started
        wait_for(lambda: committed_event_ids(output) == list(range(150)), 180, "the first 150 records in the sink")
        for _ in range(4):  # idle now: each no-data trigger's progress names the next batch id
            time.sleep(1)
            code, seen = cli("status", "kafka", "--jobs-file", checked)
            committed, _ = checkpoint_progress(Store(started["checkpoint"]))
            assert seen["state"] == "running" and seen["last_batch"] == committed, (seen, committed)
        code, stopped = cli("stop", "kafka", "--jobs-file", checked)
        assert code == 0 and stopped["consistency"] == "clean", stopped
    finally:
        stop_process(read_run(job_folder), grace=10)

    produce(kafka_broker, kafka_topic, range(150, 300))
    kafka_broker.delete_records(kafka_topic, {1: 60})  # partition 1's offsets 50..59: gone, as retention does
    deleted = [i for i in range(150, 300) if i % PARTITIONS == 1][:10]

    code, refused = cli("start", "kafka", "--jobs-file", checked)
    assert code == 1 and refused["error"]["code"] == "kafka_offsets_gone", refused
    assert read_run(job_folder).run_id == started["run_id"]  # nothing ran

    code, failed = cli("start", "kafka", "--wait-timeout", "240", "--jobs-file", unchecked)  # no check, job not told
    assert code == 1 and failed["error"]["code"] == "job_failed", failed
    message = failed["error"]["message"]
    failed_run = read_run(job_folder)
    assert failed_run.run_id != started["run_id"] and failed_run.run_id in message
    assert "failOnDataLoss" in message and "=== Streaming Query ===" not in message, message  # Spark's own words
    wait_for(lambda: not process_alive(failed_run.pid), 60, "the failed driver's exit")

    last_commit, _ = checkpoint_progress(Store(failed_run.checkpoint))
    assert last_commit == failed_run.start_batch == stopped["batch_id"]  # it committed nothing
    code, seen = cli("status", "kafka", "--jobs-file", checked)
    assert seen["state"] == "failed" and "failOnDataLoss" in seen["error"] and seen["last_batch"] == last_commit, seen
    code, stop = cli("stop", "kafka", "--jobs-file", checked)
    assert code == 1 and stop["error"]["code"] == "job_failed", stop
    assert failed_run.run_id in stop["error"]["message"] and "failOnDataLoss" in stop["error"]["message"], stop
    code, after = cli("status", "kafka", "--jobs-file", checked)
    assert (after["state"], after["error"], after["last_batch"]) == ("failed", seen["error"], last_commit), after

    try:
        code, live = cli("start", "kafka", "--skip-missing-input", "--wait-timeout", "240", "--jobs-file", checked)
        assert code == 0 and live["restored"]["pointer"] == stopped["pointer"], live
        assert [s.type.value for s in list_savepoints(savepoints, "kafka")] == ["stop"]  # none of the failed run
        assert Path(failed_run.checkpoint).is_dir()  # kept, as RETAIN_ON_FAILURE says
        expected = sorted(set(range(300)) - set(deleted))
        wait_for(lambda: committed_event_ids(output) == expected, 180, "every record but the deleted ones")
    finally:
        stop_process(read_run(job_folder), grace=10)
