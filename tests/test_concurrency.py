"""Concurrency: simultaneous triggers, retried requests, retention while a restore runs.

The copies run against moto's S3 server through the fault proxy, which slows reads down (a slow
store), so the operations overlap for seconds, not by luck.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint
from airflow_savepoints.core.catalog import Catalog
from airflow_savepoints.core.pointer import list_savepoints
from airflow_savepoints.core.retention import RetentionPolicy, retain
from airflow_savepoints.errors import SavepointInFlightError
from airflow_savepoints.storage import Store
from tests.support.fault_proxy import FaultProxy, Rule

JOB = "orders"
TRIGGERS = 10


@pytest.fixture
def slow_s3(s3, s3_endpoint, stopped_checkpoint):
    """A bucket with the real checkpoint in it, and a proxy that delays every GET by 0.15 s."""
    direct = Store(f"s3://{s3}/checkpoint")
    direct.fs.put(str(stopped_checkpoint), direct.root, recursive=True)
    proxy = FaultProxy(s3_endpoint).start()
    proxy.set_rules(Rule(action="delay", seconds=0.15, methods={"GET"}))
    yield s3, {"endpoint_url": proxy.url}, proxy
    proxy.stop()


@pytest.mark.s3
def test_ten_simultaneous_triggers_give_exactly_one_savepoint(slow_s3):
    bucket, slow, proxy = slow_s3
    start = threading.Barrier(TRIGGERS)
    outcomes: list[object] = [None] * TRIGGERS

    def trigger(number: int) -> None:
        start.wait()
        try:
            outcomes[number] = take_savepoint(f"s3://{bucket}/checkpoint", JOB, savepoint_dir=f"s3://{bucket}/sp",
                                              request_id=f"request-{number}", storage_options=slow,
                                              checkpoint_storage_options=slow)
        except SavepointInFlightError as exc:
            outcomes[number] = exc

    threads = [threading.Thread(target=trigger, args=(n,)) for n in range(TRIGGERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    taken = [o for o in outcomes if not isinstance(o, SavepointInFlightError)]
    refused = [o for o in outcomes if isinstance(o, SavepointInFlightError)]
    print(f"{TRIGGERS} simultaneous triggers: {len(taken)} savepoint, {len(refused)} refused as in flight; "
          f"{proxy.total_requests} requests")
    assert len(taken) == 1 and len(refused) == TRIGGERS - 1
    assert all("already in progress" in e.message and e.hint for e in refused)
    listed = list_savepoints(Store(f"s3://{bucket}/sp"), JOB)
    assert [r.pointer for r in listed] == [taken[0].pointer]
    assert Store(f"s3://{bucket}/sp/{JOB}").listdir() == sorted(["_catalog.json", taken[0].manifest.savepoint_id])


@pytest.mark.s3
def test_ten_processes_retrying_one_request_get_one_savepoint(slow_s3, tmp_path):
    bucket, slow, proxy = slow_s3
    script = ("import json, sys; from airflow_savepoints.core import take_savepoint as t; o = json.loads(sys.argv[1]); "
              "i = t(sys.argv[2], 'orders', savepoint_dir=sys.argv[3], request_id='dag/run/task/-1', "
              "storage_options=o, checkpoint_storage_options=o); print(i.pointer)")
    processes = [subprocess.Popen([sys.executable, "-c", script, json.dumps(slow), f"s3://{bucket}/checkpoint",
                                   f"s3://{bucket}/sp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(TRIGGERS)]
    results = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0] * TRIGGERS, [err[-500:] for _, err in results]
    pointers = {out.strip() for out, _ in results}
    print(f"{TRIGGERS} processes with one request id: {len(pointers)} distinct savepoint(s)")
    assert len(pointers) == 1, [err[-2000:] for _, err in results]
    assert [r.pointer for r in list_savepoints(Store(f"s3://{bucket}/sp"), JOB)] == list(pointers)


@pytest.mark.s3
def test_retention_during_a_restore_keeps_the_pinned_savepoint(slow_s3, tmp_path):
    bucket, slow, proxy = slow_s3
    proxy.set_rules()  # take the savepoints at full speed
    root = f"s3://{bucket}/sp"
    names = [take_savepoint(f"s3://{bucket}/checkpoint", JOB, savepoint_dir=root, savepoint_type="periodic")
             .manifest.savepoint_id for _ in range(3)]
    proxy.set_rules(Rule(action="delay", seconds=0.2, methods={"GET"}, path=names[0]))  # restoring the oldest is slow
    result: dict[str, object] = {}

    def restore() -> None:
        try:
            result["ok"] = restore_savepoint(f"{root}/{JOB}/{names[0]}", str(tmp_path / "restored"),
                                             storage_options=slow, parallelism=2)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    catalog = Catalog(Store(f"{root}/{JOB}"), JOB)
    restoring = threading.Thread(target=restore)
    restoring.start()
    deadline = time.monotonic() + 60
    while not catalog.load().active_pins(names[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert catalog.load().active_pins(names[0]), "the restore never pinned its savepoint"
    report = retain(Store(root), JOB, RetentionPolicy(max_periodic=1, max_age_seconds=None))
    still_restoring = restoring.is_alive()
    restoring.join(120)
    print(f"retention during the restore: disposed {report.disposed}, restore still running: {still_restoring}")
    assert still_restoring, "the restore ended before retention ran: the overlap was not exercised"
    assert report.disposed == [names[1]]
    pinned = next(d for d in report.plan.decisions if d.savepoint_id == names[0])
    assert pinned.action == "keep" and "pinned by a restore" in pinned.reason
    assert "error" not in result, result.get("error")
    assert result["ok"].batch_id == 5 and (tmp_path / "restored" / "metadata").is_file()
    assert catalog.load().pins == {}
    assert retain(Store(root), JOB, RetentionPolicy(max_periodic=1, max_age_seconds=None)).disposed == [names[0]]
