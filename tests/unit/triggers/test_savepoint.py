"""Triggers: what they serialize (the connection id and plain parameters, never credentials) and that the
triggerer's rebuild from those kwargs reaches the same storage through the connection."""

from __future__ import annotations

import asyncio
import importlib
import json
from datetime import UTC, datetime

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_savepoints.jobs.description.record import JobRun
from airflow_savepoints.operators.savepoint import TriggerSavepointOperator
from airflow_savepoints.storage import Store
from airflow_savepoints.triggers.savepoint import BatchCommittedTrigger, SavepointCompletedTrigger
from tests.support.connections import bucket_reached_only_with, stored_connection
from tests.support.synthetic import write_checkpoint

KEY, SECRET, TOKEN = "AKIAUNITTRIGGERKEY01", "unit-trigger-secret-Hv3", "unit-trigger-token-Lp8"
CONF_SECRET = "spark-conf-secret-Yt5"


def first_event(trigger, timeout: float = 30):
    async def go():
        return await asyncio.wait_for(anext(trigger.run()), timeout)

    return asyncio.run(go())


def rebuilt(trigger):
    """What the triggerer runs: the class imported from the classpath, called with the serialized kwargs
    after a trip through JSON (the trigger row in the metadata database)."""
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))


def triggers(conn_id: str, pointer: str, checkpoint: str) -> list:
    run = JobRun(job="orders", pid=1, host="h", checkpoint=checkpoint, started_at=datetime.now(UTC),
                 command=["spark-submit", "--conf", f"spark.hadoop.fs.s3a.secret.key={CONF_SECRET}", "app.py"])
    return [SavepointCompletedTrigger(pointer, savepoints_conn_id=conn_id, poll_interval=0.1, end_at=2e9),
            BatchCommittedTrigger(checkpoint, 1, run.model_dump(mode="json"), savepoints_conn_id=conn_id,
                                  poll_interval=0.1, end_at=2e9)]


@pytest.mark.s3
def test_triggers_carry_the_connection_id_never_its_secrets_and_rebuild_to_the_same_storage(
        airflow_db, s3_endpoint, monkeypatch, tmp_path):
    bucket = bucket_reached_only_with(monkeypatch, s3_endpoint, KEY, SECRET)
    conn_id = stored_connection(monkeypatch, host=f"s3://{bucket}/savepoints", login=KEY, password=SECRET,
                                extra={"token": TOKEN, "client_kwargs": {"endpoint_url": s3_endpoint}})
    summary = TriggerSavepointOperator(task_id="t", job="orders", checkpoint=str(write_checkpoint(tmp_path / "ck")),
                                       savepoints_conn_id=conn_id).execute({})
    checkpoint = Store(f"s3://{bucket}/checkpoints/orders", {"key": KEY, "secret": SECRET,
                                                            "client_kwargs": {"endpoint_url": s3_endpoint}})
    for name in ("0", "1", "2"):
        checkpoint.child("commits").write_bytes_atomic(name, b'v1\n{"nextBatchWatermarkMs":0}')

    for trigger in triggers(conn_id, summary["pointer"], checkpoint.url):
        classpath, kwargs = trigger.serialize()
        text = json.dumps(kwargs)
        assert not [s for s in (KEY, SECRET, TOKEN, CONF_SECRET, s3_endpoint) if s in text], text
        assert "storage_options" not in kwargs and kwargs["savepoints_conn_id"] == conn_id
        again = rebuilt(trigger)
        assert again.serialize() == (classpath, kwargs)
        assert again.storage_options() == {"token": TOKEN, "client_kwargs": {"endpoint_url": s3_endpoint},
                                           "key": KEY, "secret": SECRET}  # from the connection, in the triggerer
        event = first_event(again)
        assert event.payload["status"] == "success", event.payload
    assert first_event(rebuilt(triggers(conn_id, summary["pointer"], checkpoint.url)[0])).payload["result"] == summary
    assert first_event(rebuilt(triggers(conn_id, summary["pointer"], checkpoint.url)[1])).payload["result"] == {
        "batch_id": 2}


def test_a_missing_connection_ends_the_wait_with_an_error_event(airflow_db, tmp_path):
    for trigger in triggers("savepoints_unit_missing", str(tmp_path / "sp"), str(tmp_path / "ck")):
        event = first_event(rebuilt(trigger))
        assert event.payload["status"] == "error" and "savepoints_unit_missing" in event.payload["message"]


def test_storage_options_given_directly_still_work_but_are_deprecated_and_never_serialized(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "ck")
    with pytest.warns(AirflowProviderDeprecationWarning, match="pass savepoints_conn_id"):
        trigger = BatchCommittedTrigger(str(checkpoint), 1, None, {"auto_mkdir": True}, poll_interval=0.1)
    assert trigger.storage_options() == {"auto_mkdir": True}
    assert "storage_options" not in trigger.serialize()[1]
    assert first_event(trigger).payload == {"status": "success", "result": {"batch_id": 2}}


def test_serialized_kwargs_round_trip_with_their_defaults(tmp_path):
    trigger = SavepointCompletedTrigger(str(tmp_path / "sp" / "x"))
    assert trigger.serialize() == ("airflow_savepoints.triggers.savepoint.SavepointCompletedTrigger", {
        "pointer": str(tmp_path / "sp" / "x"), "savepoints_conn_id": "savepoints_default", "poll_interval": 10,
        "end_at": None})
    trigger = BatchCommittedTrigger("/ck", 4, {"job": "j", "command": ["x"], "termination": {"a": 1}, "pid": 7})
    assert trigger.serialize()[1] == {"checkpoint": "/ck", "after_batch": 4, "run": {"job": "j", "pid": 7},
                                      "savepoints_conn_id": "savepoints_default", "poll_interval": 10, "end_at": None}
