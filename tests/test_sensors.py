"""Sensors and triggers against real storage and real processes (no mocks)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_savepoints.core import take_savepoint
from airflow_savepoints.jobs.description.files import process_started
from airflow_savepoints.jobs.description.record import JobRun
from airflow_savepoints.sensors.savepoint import BatchCommittedSensor, SavepointCompletedSensor
from airflow_savepoints.storage import Store
from airflow_savepoints.triggers.savepoint import BatchCommittedTrigger, SavepointCompletedTrigger


def first_event(trigger, timeout: float):
    async def go():
        return await asyncio.wait_for(anext(trigger.run()), timeout)

    return asyncio.run(go())


def test_savepoint_trigger_waits_then_fires_and_round_trips(stopped_checkpoint, tmp_path):
    info = take_savepoint(str(stopped_checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    pending = str(tmp_path / "sp" / "job" / "savepoint-abc123-000000000000")
    trigger = SavepointCompletedTrigger(pending, poll_interval=0.2)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_savepoints.triggers.savepoint.SavepointCompletedTrigger"
    assert SavepointCompletedTrigger(**kwargs).serialize() == (classpath, kwargs)
    with pytest.raises(TimeoutError):  # nothing there yet: it keeps waiting
        first_event(trigger, 1.0)
    shutil.copytree(info.pointer, pending)
    (tmp_path / "sp" / "job" / "savepoint-abc123-000000000000" / "_metadata").unlink()
    with pytest.raises(TimeoutError):  # an incomplete location: still waiting
        first_event(trigger, 1.0)
    event = first_event(SavepointCompletedTrigger(info.pointer, poll_interval=0.2), 10)
    assert event.payload["status"] == "success" and event.payload["result"]["batch_id"] == 5


def dead_run(tmp_path, checkpoint) -> JobRun:
    process = subprocess.Popen(["true"])
    started = process_started(process.pid)  # recorded as the launcher does (a zombie still has it)
    process.wait()
    log = tmp_path / "job-20260101T000000.log"  # named as the launcher names its logs (<job>-<UTC time>.log)
    log.write_text("Exception in thread main: org.example.BadRecordException: record 42\n")
    return JobRun(job="job", pid=process.pid, host=socket.gethostname(), command=["spark-submit"],
                  log_file=str(log), checkpoint=str(checkpoint), started_at=datetime.now(UTC),
                  pid_started=started)


def test_batch_trigger_fires_when_past_and_fails_fast_when_the_job_died(stopped_checkpoint, tmp_path):
    event = first_event(BatchCommittedTrigger(str(stopped_checkpoint), 3, poll_interval=0.2), 10)
    assert event.payload == {"status": "success", "result": {"batch_id": 5}}
    run = dead_run(tmp_path, stopped_checkpoint)
    trigger = BatchCommittedTrigger(str(stopped_checkpoint), 5, run.model_dump(mode="json"), poll_interval=0.2)
    event = first_event(trigger, 10)
    assert event.payload["status"] == "error"
    assert "is not running" in event.payload["message"] and "BadRecordException" in event.payload["message"]


def test_triggers_end_at_their_own_deadline(stopped_checkpoint, tmp_path):
    """A wait that can never finish (no batch past 5 will come; no such savepoint) ends with a timeout
    error at the sensor's deadline, also where nothing else enforces it (dag.test)."""
    import time

    started = time.monotonic()
    event = first_event(BatchCommittedTrigger(str(stopped_checkpoint), 5, poll_interval=0.2, end_at=time.time() + 1.5), 10)
    assert event.payload["status"] == "error" and "timed out waiting for a batch past 5" in event.payload["message"]
    missing = str(tmp_path / "sp" / "job" / "savepoint-abc123-000000000000")
    event = first_event(SavepointCompletedTrigger(missing, poll_interval=0.2, end_at=time.time() + 1.0), 10)
    assert event.payload["status"] == "error" and "timed out" in event.payload["message"]
    assert time.monotonic() - started >= 2.0  # each at its own deadline, not before (first_event bounds each wait)
    sensor = BatchCommittedSensor(task_id="wait", job="job", checkpoint=str(stopped_checkpoint), after_batch=5,
                                  savepoint_dir=str(tmp_path / "sp"), timeout=120)
    assert 110 < sensor._trigger().end_at - time.time() <= 120


def test_sensors_in_poke_mode(stopped_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR", str(tmp_path / "sp"))
    info = take_savepoint(str(stopped_checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    sensor = SavepointCompletedSensor(task_id="s", pointer=info.pointer, deferrable=False)
    done = sensor.poke({})
    assert done.is_done and done.xcom_value["pointer"] == info.pointer
    assert not SavepointCompletedSensor(task_id="t", pointer=str(tmp_path / "nothing"), deferrable=False).poke({}).is_done

    sensor = BatchCommittedSensor(task_id="b", job="job", checkpoint=str(stopped_checkpoint), after_batch=5,
                                  deferrable=False)
    assert not sensor.poke({}).is_done  # alive or unknown job, no new batch: keep waiting
    Store(str(tmp_path / "sp" / "job")).write_bytes_atomic(
        "_run.json", dead_run(tmp_path, stopped_checkpoint).model_dump_json().encode())
    with pytest.raises(AirflowFailException, match="is not running"):
        BatchCommittedSensor(task_id="c", job="job", after_batch=5, deferrable=False).poke({})


def test_restore_refuses_while_the_job_is_still_running(tmp_path):
    """Two runs of one job would write its sink twice: restore refuses and changes nothing."""
    from airflow_savepoints.errors import InvalidInputError
    from airflow_savepoints.operators.job import RestoreJobOperator

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - {{name: j, application: /app.py, checkpoint: {tmp_path}/ck, "
                    f"savepoint_dir: {tmp_path}/sp}}\n")
    alive = subprocess.Popen(["sleep", "60"])
    try:
        run = JobRun(job="j", pid=alive.pid, host=socket.gethostname(), command=["sleep"], log_file="/dev/null",
                     checkpoint=str(tmp_path / "ck"), started_at=datetime.now(UTC),
                     pid_started=process_started(alive.pid))
        Store(str(tmp_path / "sp" / "j")).write_bytes_atomic("_run.json", run.model_dump_json().encode())
        operator = RestoreJobOperator(task_id="r", job="j", jobs_file=str(jobs), fresh_start=True)
        with pytest.raises(InvalidInputError, match=f"already running as pid {alive.pid}"):
            operator.execute({})
        assert not (tmp_path / "ck").exists()
    finally:
        alive.kill()
        alive.wait()
