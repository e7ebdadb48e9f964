"""The savepoint run object (``core/savepoint.py``): each step on a small synthetic checkpoint, no Spark.

Real queries racing the copy: tests/test_roundtrip.py, test_concurrency.py, test_faults_crash.py."""

from __future__ import annotations

import json
import os

import pytest

from airflow_savepoints.core.catalog import SavepointState
from airflow_savepoints.core.dispose import discard_incomplete
from airflow_savepoints.core.manifest import read_manifest
from airflow_savepoints.core.names import MANIFEST_FILE
from airflow_savepoints.core.savepoint import SavepointRequest, SavepointRun, run_savepoint, take_savepoint
from airflow_savepoints.errors import (
    CheckpointNotFoundError,
    CheckpointRaceError,
    InvalidInputError,
    SavepointInFlightError,
)
from airflow_savepoints.storage import Store
from tests.support.synthetic import QUERY_ID, write_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    return write_checkpoint(tmp_path / "ckpt", batches=3)


def new_run(ckpt, tmp_path, events=None, **fields) -> SavepointRun:
    request = SavepointRequest.of("take_savepoint", checkpoint=str(ckpt), job="orders",
                                  savepoint_dir=str(tmp_path / "sp"), **fields)
    return SavepointRun(request, (lambda e, d: events.append((e, d))) if events is not None else None)


def test_each_step_in_order(ckpt, tmp_path):
    events: list = []
    run = new_run(ckpt, tmp_path, events, reason="unit", request_id="r-1")
    run.plan_first()
    assert run.wait_for_lease() is None
    plan, listing = run.plan()
    assert plan.batch_id == 2 and plan.query_id == QUERY_ID

    location = run.open_location(plan)
    assert location.name.startswith("savepoint-5d5a3b-") and os.path.isdir(location.root)
    (record,) = run.catalog.records()
    assert (record.savepoint_id, record.state, record.request_id) == (location.name, SavepointState.IN_PROGRESS, "r-1")
    assert run.lease.current().savepoint_id == location.name  # retention keeps what the lease names
    assert events[0][0] == "planned" and events[0][1]["files"] == len(plan.files)

    copied = run.copy(plan, listing)
    assert set(copied) == {f.path for f in plan.files}
    assert [e for e, _ in events].count("file_done") == len(plan.files)
    run.verify(plan, copied)
    assert run.copy_secondary(plan, listing, copied) is None  # none asked
    assert not location.exists(MANIFEST_FILE)

    manifest = run.write_metadata(plan, copied, None)
    assert read_manifest(location) == manifest
    assert (manifest.reason, manifest.request_id, manifest.batch_id, manifest.spark_version) == ("unit", "r-1", 2, None)
    info = run.finish(manifest)
    assert run.catalog.records()[0].state == SavepointState.COMPLETED
    assert events[-1] == ("completed", info.summary())
    run.lease.release()
    assert run.catalog.find_request("r-1").pointer == info.pointer


def test_bad_input_fails_before_anything_is_written(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        take_savepoint(str(tmp_path / "missing"), "orders", savepoint_dir=str(tmp_path / "sp"))
    with pytest.raises(InvalidInputError, match="overlap"):
        take_savepoint(str(tmp_path / "c"), "orders", savepoint_dir=str(tmp_path / "c" / "sp"))
    assert not (tmp_path / "sp").exists() and not (tmp_path / "c" / "sp").exists()


def test_a_file_replaced_after_planning_is_a_race(ckpt, tmp_path):
    run = new_run(ckpt, tmp_path, copy_mode="stream")
    run.plan_first()
    plan, listing = run.plan()
    run.open_location(plan)
    offsets = next(f.path for f in plan.files if f.path.startswith("offsets/"))
    (ckpt / "replacement").write_bytes((ckpt / offsets).read_bytes())
    os.replace(ckpt / "replacement", ckpt / offsets)  # Spark rewrote it (a new file renamed over it) meanwhile
    with pytest.raises(CheckpointRaceError, match="replaced"):
        run.verify(plan, run.copy(plan, listing))


def test_verify_checks_sizes_and_sparks_checksums(ckpt, tmp_path):
    run = new_run(ckpt, tmp_path)
    run.plan_first()
    plan, listing = run.plan()
    run.open_location(plan)
    copied = run.copy(plan, listing)
    run.verify(plan, copied)
    path = plan.files[0].path
    copied[path] = copied[path]._replace(size=copied[path].size + 1)
    with pytest.raises(CheckpointRaceError, match="changed size"):
        run.verify(plan, copied)


def test_a_retry_reuses_the_location_emptied(ckpt, tmp_path):
    run = new_run(ckpt, tmp_path)
    run.plan_first()
    plan, listing = run.plan()
    first = run.open_location(plan)
    run.copy(plan, listing)
    again = run.open_location(run.plan()[0])  # the plan made before the lease is used once; then a fresh one
    assert again.url == first.url and os.listdir(again.root) == []
    assert len(run.catalog.records()) == 1


def test_writing_metadata_needs_the_lease(ckpt, tmp_path):
    run = new_run(ckpt, tmp_path)
    run.plan_first()
    assert run.wait_for_lease() is None
    plan, listing = run.plan()
    run.open_location(plan)
    copied = run.copy(plan, listing)
    run.lease.lease.stop_heartbeat()
    os.remove(tmp_path / "sp" / "orders" / "_inflight.json")  # taken over by a trigger that judged us dead
    with pytest.raises(SavepointInFlightError, match="taken over"):
        run.write_metadata(plan, copied, None)


def test_a_failed_run_discards_its_location_but_never_a_completed_savepoint(ckpt, tmp_path):
    run = new_run(ckpt, tmp_path)
    run.plan_first()
    plan, listing = run.plan()
    location = run.open_location(plan)
    run.discard()
    assert not os.path.exists(location.root) and run.catalog.records() == []
    info = take_savepoint(str(ckpt), "orders", savepoint_dir=str(tmp_path / "sp"))
    done = Store(info.pointer)
    assert not discard_incomplete(done) and done.exists(MANIFEST_FILE)


def test_the_same_request_returns_the_savepoint_already_taken(ckpt, tmp_path):
    events: list = []
    first = take_savepoint(str(ckpt), "orders", savepoint_dir=str(tmp_path / "sp"), request_id="once")
    again = run_savepoint(new_run(ckpt, tmp_path, request_id="once").request, lambda e, d: events.append(e))
    assert again.pointer == first.pointer and events == ["reused"]


def test_a_second_savepoint_reuses_the_unchanged_files_of_the_first(ckpt, tmp_path):
    first = take_savepoint(str(ckpt), "orders", savepoint_dir=str(tmp_path / "sp"))
    second = take_savepoint(str(ckpt), "orders", savepoint_dir=str(tmp_path / "sp"))
    reused = {e.path for e in second.manifest.files if e.reused_from == first.manifest.savepoint_id}
    assert reused and reused <= {e.path for e in first.manifest.files}
    assert {e.path: e.checksum for e in second.manifest.files} == {e.path: e.checksum for e in first.manifest.files}
    assert not Store(str(tmp_path / "sp" / "orders")).child(first.manifest.savepoint_id).exists(".pins")
    catalog = json.loads((tmp_path / "sp" / "orders" / "_catalog.json").read_text())
    assert catalog["pins"] == {}  # the previous savepoint was pinned only during the copy


def test_a_secondary_copy_matches_the_primary(ckpt, tmp_path):
    info = take_savepoint(str(ckpt), "orders", savepoint_dir=str(tmp_path / "sp"), secondary_dir=str(tmp_path / "local"))
    secondary = tmp_path / "local" / "orders" / info.manifest.savepoint_id
    assert info.manifest.secondary == Store(str(secondary)).url
    assert read_manifest(Store(str(secondary))) == info.manifest
