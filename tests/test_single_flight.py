"""At most one savepoint in flight per job; a retried request gets the first one's result."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from airflow_savepoints.core import list_savepoints, take_savepoint
from airflow_savepoints.core.lease import LOCK_FILE
from airflow_savepoints.errors import SavepointInFlightError
from airflow_savepoints.storage import Store


def test_second_trigger_fails_and_same_request_waits_for_the_first(checkpoint, tmp_path):
    root = str(tmp_path / "sp")
    planned, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def hold_after_planning(event, data):
        if event == "planned":
            planned.set()
            assert release.wait(60)

    def run(name, **kwargs):
        try:
            results[name] = take_savepoint(str(checkpoint), "job", savepoint_dir=root, **kwargs)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            results[name] = exc

    first = threading.Thread(target=run, args=("first",), kwargs={"request_id": "r1", "on_event": hold_after_planning})
    first.start()
    assert planned.wait(60)
    run("other", request_id="r2")  # a different request while r1 copies: refused, names r1
    retry = threading.Thread(target=run, args=("retry",), kwargs={"request_id": "r1"})
    retry.start()
    time.sleep(2.5)
    assert "retry" not in results  # it waits for r1 instead of failing or copying again
    release.set()
    first.join(60)
    retry.join(60)

    assert isinstance(results["other"], SavepointInFlightError)
    assert "'r1'" in str(results["other"]) and "same request id" in results["other"].hint
    assert results["retry"].pointer == results["first"].pointer
    later = take_savepoint(str(checkpoint), "job", savepoint_dir=root, request_id="r1")
    assert later.pointer == results["first"].pointer
    assert [i.pointer for i in list_savepoints(Store(root), "job")] == [results["first"].pointer]
    assert not (tmp_path / "sp" / "job" / LOCK_FILE).exists()


def test_a_dead_holders_lease_is_broken(checkpoint, tmp_path):
    lease = tmp_path / "sp" / "job" / LOCK_FILE
    lease.parent.mkdir(parents=True)
    stale = time.time() - 3600
    lease.write_text(json.dumps({"token": "dead", "request_id": "x", "savepoint_id": None, "owner": "gone:1",
                                 "started_at": stale, "heartbeat_at": stale}))
    os.utime(lease, (stale, stale))  # not renewed for an hour, on the store's clock
    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    assert info.manifest.batch_id == 5 and not lease.exists()


def test_a_live_lease_blocks(checkpoint, tmp_path):
    lease = tmp_path / "sp" / "job" / LOCK_FILE
    lease.parent.mkdir(parents=True)
    now = time.time()
    lease.write_text(json.dumps({"token": "alive", "request_id": "nightly", "savepoint_id": "savepoint-x",
                                 "owner": "worker-7:42", "started_at": now, "heartbeat_at": now}))
    with pytest.raises(SavepointInFlightError, match="worker-7:42"):
        take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    assert lease.exists() and json.loads(lease.read_text())["token"] == "alive"


def test_bad_python_api_arguments_are_clear_errors(checkpoint, tmp_path):
    from airflow_savepoints.errors import InvalidInputError

    for kwargs, words in (({"savepoint_type": "hourly"}, "unknown savepoint type"),
                          ({"max_attempts": 0}, "at least 1"), ({"parallelism": -2}, "at least 1")):
        with pytest.raises(InvalidInputError, match=words):
            take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), **kwargs)
    assert not (tmp_path / "sp").exists()
