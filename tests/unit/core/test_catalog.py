"""The per-job catalog (``core/catalog.py``): records, settling, pins and disposal marks, on a local store."""

from __future__ import annotations

import json
import threading
import time

import pytest

import airflow_savepoints.core.catalog as catalog_module
from airflow_savepoints.core.catalog import Catalog, CatalogDocument, SavepointState
from airflow_savepoints.core.lease import JobLock
from airflow_savepoints.core.models import SavepointType
from airflow_savepoints.core.names import CATALOG_FILE, MANIFEST_FILE
from airflow_savepoints.core.retention import Action, RetentionPolicy, plan_retention
from airflow_savepoints.core.savepoint import take_savepoint
from airflow_savepoints.errors import SavepointNotFoundError, SavepointPinnedError, StoragePermissionError
from airflow_savepoints.storage import Store
from tests.support.synthetic import write_checkpoint

SP = "savepoint-abc123-0123456789ab"


@pytest.fixture
def job(tmp_path) -> Catalog:
    return Catalog(Store(str(tmp_path / "sp" / "orders")), "orders")


@pytest.fixture
def taken(tmp_path):
    """A real completed savepoint of a small synthetic checkpoint, and its job's catalog."""
    info = take_savepoint(str(write_checkpoint(tmp_path / "ckpt")), "orders", savepoint_dir=str(tmp_path / "sp"))
    return info, Catalog(Store(str(tmp_path / "sp" / "orders")), "orders")


def test_begin_fail_forget(job):
    job.begin(SP, SavepointType.MANUAL, "why", "req-1")
    (record,) = job.records()
    assert (record.state, record.reason, record.request_id, record.pointer) == (
        SavepointState.IN_PROGRESS, "why", "req-1", job.store.child(SP).url)
    job.mark_failed(SP)
    assert job.records()[0].state == SavepointState.FAILED
    assert job.records({SavepointState.COMPLETED}) == []
    job.forget(SP)
    assert job.records() == []
    stored = json.loads(job.store.read_bytes(CATALOG_FILE))
    assert stored["format"] == "airflow-savepoints/catalog" and stored["records"] == {}


def test_completed_latest_and_request_are_confirmed_by_metadata(taken):
    info, catalog = taken
    assert [r.savepoint_id for r in catalog.completed()] == [info.manifest.savepoint_id]
    assert catalog.latest().pointer == info.pointer
    assert catalog.find_request("nope") is None
    catalog.store.child(info.manifest.savepoint_id).remove_file(MANIFEST_FILE)
    assert catalog.latest() is None  # a record alone is never enough


def test_an_in_progress_record_with_metadata_reads_completed_and_reconcile_stores_it(taken):
    info, catalog = taken
    sid = info.manifest.savepoint_id
    catalog.update(lambda d: d.records.__setitem__(sid, d.records[sid].model_copy(
        update={"state": SavepointState.IN_PROGRESS})))
    assert catalog.records()[0].state == SavepointState.COMPLETED
    assert catalog.reconcile(in_flight=None) == [sid]
    assert catalog._read().records[sid].state == SavepointState.COMPLETED


def test_reconcile_fails_a_location_without_metadata_and_drops_a_vanished_one(job):
    job.begin(SP, SavepointType.MANUAL, None, None)
    job.begin("savepoint-abc123-ffffffffffff", SavepointType.MANUAL, None, None)
    job.store.child(SP).makedirs()
    assert sorted(job.reconcile(in_flight=None)) == [SP, "savepoint-abc123-ffffffffffff"]
    assert {r.savepoint_id: r.state for r in job.records()} == {SP: SavepointState.FAILED}


def test_reconcile_as_last_read_settles_what_that_read_showed_and_skips_what_changed_since(job):
    job.begin(SP, SavepointType.MANUAL, None, None)
    job.begin("savepoint-abc123-ffffffffffff", SavepointType.MANUAL, None, None)
    fresh = Catalog(job.store, "orders")
    assert fresh.reconcile(in_flight=None, as_last_read=True) == [SP, "savepoint-abc123-ffffffffffff"]  # never read: reads
    job.begin("savepoint-abc123-eeeeeeeeeeee", SavepointType.MANUAL, None, None)
    assert len(fresh.load().records) == 1 and fresh.reconcile(in_flight=None, as_last_read=True) == \
        ["savepoint-abc123-eeeeeeeeeeee"]  # the load() just before showed only that one in progress
    job.begin("savepoint-abc123-dddddddddddd", SavepointType.MANUAL, None, None)
    fresh.load()
    job.forget("savepoint-abc123-dddddddddddd")  # settled by someone else after our read
    assert fresh.reconcile(in_flight=None, as_last_read=True) == ["savepoint-abc123-dddddddddddd"]
    assert fresh.load().records == {}  # nothing resurrected


def test_a_record_keyed_by_anything_but_its_folder_name_is_ignored(job):
    doc = CatalogDocument(job="orders")
    job.store.write_bytes_atomic(CATALOG_FILE, doc.model_dump_json().encode())
    raw = json.loads(job.store.read_bytes(CATALOG_FILE))
    raw["records"]["../../etc"] = {"savepoint_id": "../../etc", "job": "orders", "type": "manual", "state": "completed",
                                   "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}
    job.store.write_bytes_atomic(CATALOG_FILE, json.dumps(raw).encode())
    assert job.records() == []


def test_an_unreadable_catalog_is_rebuilt_from_the_metadata_files(taken):
    info, catalog = taken
    catalog.store.write_bytes_atomic(CATALOG_FILE, b"{garbage")
    assert [r.savepoint_id for r in catalog.records()] == [info.manifest.savepoint_id]
    catalog.rebuild()
    assert CatalogDocument.model_validate_json(catalog.store.read_bytes(CATALOG_FILE)).records


def test_a_pin_blocks_disposal_until_released(taken):
    info, catalog = taken
    sid = info.manifest.savepoint_id
    with catalog.held(sid, "restore"):
        assert catalog.load().active_pins(sid)
        with pytest.raises(SavepointPinnedError, match="pinned by a restore"):
            catalog.begin_dispose(sid)
    assert not catalog.load().active_pins(sid)
    catalog.begin_dispose(sid)
    assert catalog.records()[0].state == SavepointState.DISPOSING
    with pytest.raises(SavepointNotFoundError, match="being disposed"):
        catalog.pin(sid)


def test_an_incremental_savepoint_pins_the_savepoint_it_copies_from_until_it_completes(taken, tmp_path):
    """Its pin lives with the job's lease (no heartbeat): dispose and retention, tried while it
    copies, both keep the savepoint it takes files from; the pin is gone once it has completed."""
    info, catalog = taken
    lender = info.manifest.savepoint_id
    seen: dict = {}

    def while_copying(event, data):
        if event != "planned":
            return
        (pin,) = catalog.load().active_pins(lender)
        seen["pin"] = pin
        with pytest.raises(SavepointPinnedError, match="while savepoint-.* holds the job's savepoint lease"):
            catalog.begin_dispose(lender)
        plan = plan_retention(catalog.store.parent(), "orders", RetentionPolicy(max_periodic=0, max_manual=0))
        seen["retention"] = {d.savepoint_id: (d.action, d.reason) for d in plan.decisions}[lender]

    second = take_savepoint(str(tmp_path / "ckpt"), "orders", savepoint_dir=str(tmp_path / "sp"),
                            on_event=while_copying)
    assert any(e.reused_from == lender for e in second.manifest.files)
    assert seen["pin"].in_flight == second.manifest.savepoint_id and seen["pin"].purpose == "incremental savepoint"
    assert seen["retention"] == (Action.KEEP, f"pinned by an incremental savepoint in progress ({seen['pin'].owner})")
    assert catalog.load().pins == {}
    catalog.begin_dispose(lender)  # now it may go


def test_the_pin_of_an_incremental_savepoint_lapses_with_its_lease(taken):
    """A holder killed mid-copy leaves its pin behind: it holds while the job's lease names its
    location, not a moment after that lease is released or taken by another run."""
    info, catalog = taken
    sid, ours = info.manifest.savepoint_id, "savepoint-abc123-0000000000aa"
    lock = JobLock(catalog.store, request_id=None)
    lock.set_savepoint(ours)
    assert lock.try_acquire() is None
    try:
        catalog.pin(sid, purpose="incremental savepoint", in_flight=ours)  # the holder then dies: never released
        with pytest.raises(SavepointPinnedError):
            catalog.begin_dispose(sid)
    finally:
        lock.lease.stop_heartbeat()
        lock.release()
    other = JobLock(catalog.store, request_id=None)
    other.set_savepoint("savepoint-abc123-0000000000bb")
    assert other.try_acquire() is None  # the next run holds the lease: the dead pin no longer holds
    try:
        assert catalog.load().active_pins(sid)  # without asking the lease it counts as live
        assert not catalog.load().active_pins(sid, lease_names=JobLock(catalog.store, request_id=None).live_savepoint)
        catalog.pin(sid, purpose="incremental savepoint", in_flight="savepoint-abc123-0000000000bb")
        assert [p.in_flight for p in catalog.load().pins.values()] == ["savepoint-abc123-0000000000bb"]  # pruned
    finally:
        other.lease.stop_heartbeat()
        other.release()
    catalog.begin_dispose(sid)
    assert catalog.records()[0].state == SavepointState.DISPOSING


def test_pinned_yields_whether_it_holds_and_tolerates_only_the_named_errors(taken, monkeypatch):
    info, catalog = taken
    sid = info.manifest.savepoint_id
    with catalog.pinned(sid, "restore") as held:
        assert held and catalog.load().active_pins(sid)
    assert not catalog.load().active_pins(sid)

    def refuse(*args, **kwargs):
        raise StoragePermissionError("read-only bucket", "grant write access")

    monkeypatch.setattr(catalog, "pin", refuse)  # a store the restore may not write to
    with catalog.pinned(sid, "restore", unless=(StoragePermissionError,)) as held:
        assert held is False
    with pytest.raises(StoragePermissionError), catalog.pinned(sid, "restore"):
        pass


def test_a_pin_can_go_with_other_changes_in_the_same_updates(taken, monkeypatch):
    info, catalog = taken
    sid, other = info.manifest.savepoint_id, "savepoint-abc123-00000000beef"
    updates = []
    real_update = catalog.update
    monkeypatch.setattr(catalog, "update", lambda change, then=None: updates.append(change) or real_update(change, then))
    with catalog.held(sid, "incremental savepoint", also=catalog.record_begun(other, SavepointType.MANUAL, None, None)) \
            as hold:
        document = catalog.load()
        assert document.active_pins(sid) and document.records[other].state == SavepointState.IN_PROGRESS
        hold.release(also=lambda d: d.records.pop(other))
        assert not catalog.load().active_pins(sid) and other not in catalog.load().records
    assert len(updates) == 2  # pin + record, then unpin + change: the block's end adds none


def test_a_lock_taken_ahead_and_held_past_half_its_stale_time_is_taken_afresh(job, monkeypatch):
    """An update never writes under a lock taken ahead that another writer may have broken as stale meanwhile:
    held longer than half its stale time, it is taken again and the catalog read again. No update is lost."""
    monkeypatch.setattr(catalog_module, "LOCK_STALE_AFTER", 0.4)
    ahead = Catalog(job.store, "orders", overlap_lock=True)
    ahead.lock_ahead()
    time.sleep(0.6)  # stale by then: another writer breaks it and writes
    job.begin("savepoint-abc123-000000000001", SavepointType.PERIODIC, None, None)
    ahead.begin("savepoint-abc123-000000000002", SavepointType.PERIODIC, None, None)
    ahead.settle()
    assert sorted(job.load().records) == ["savepoint-abc123-000000000001", "savepoint-abc123-000000000002"]
    assert not job.store.exists("_catalog.lock")


def test_concurrent_updates_are_never_lost(job):
    def add(i: int) -> None:
        job.begin(f"savepoint-abc123-{i:012x}", SavepointType.PERIODIC, None, None)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(job.records()) == 8
