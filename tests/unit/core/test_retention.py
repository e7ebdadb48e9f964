"""Retention planning (``core/retention.py``) on savepoints of a small synthetic checkpoint, no Spark.

Retention racing triggers and restores, and applying plans on S3: tests/test_retention.py."""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime, timedelta

import pytest

from airflow_savepoints.core.lease import JobLock
from airflow_savepoints.core.retention import Action, RetentionPolicy, apply_retention, plan_retention
from airflow_savepoints.core.savepoint import take_savepoint
from airflow_savepoints.core.settings import DEFAULTS
from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.get_provider_info import get_provider_info
from airflow_savepoints.storage import Store
from tests.support.synthetic import write_checkpoint

ORPHAN = "savepoint-5d5a3b-0123456789ab"


@pytest.fixture
def root(tmp_path) -> Store:
    return Store(str(tmp_path / "sp"))


def take(tmp_path, kind: str) -> str:
    ckpt = tmp_path / "ckpt"
    if not ckpt.exists():
        write_checkpoint(ckpt)
    return take_savepoint(str(ckpt), "orders", savepoint_dir=str(tmp_path / "sp"), savepoint_type=kind).manifest.savepoint_id


def actions(plan) -> dict[str, Action]:
    return {d.savepoint_id: d.action for d in plan.decisions}


def test_defaults_are_declared_once_for_airflow_and_retention(monkeypatch):
    for name in ("AIRFLOW__SAVEPOINTS__MAX_PERIODIC_SAVEPOINTS", "AIRFLOW__SAVEPOINTS__MAX_SAVEPOINT_AGE",
                 "AIRFLOW__SAVEPOINTS__ORPHAN_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONFIG", "/nonexistent/airflow.cfg")
    declared = get_provider_info()["config"]["savepoints"]["options"]
    assert {k: v["default"] for k, v in declared.items()} == DEFAULTS
    assert RetentionPolicy.resolve() == RetentionPolicy() == RetentionPolicy(
        max_periodic=10, max_age_seconds=7 * 86400.0, orphan_timeout_seconds=3600.0)


def test_given_values_beat_configuration(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__MAX_PERIODIC_SAVEPOINTS", "3")
    assert RetentionPolicy.resolve().max_periodic == 3
    assert RetentionPolicy.resolve(max_periodic=1, max_age="none", orphan_timeout="90s") == RetentionPolicy(
        max_periodic=1, max_age_seconds=None, orphan_timeout_seconds=90.0)
    with pytest.raises(InvalidInputError, match="max_periodic"):
        RetentionPolicy.resolve(max_periodic="lots")
    with pytest.raises(InvalidInputError, match="negative duration"):
        RetentionPolicy.resolve(orphan_timeout="-5")
    with pytest.raises(InvalidInputError, match="max_periodic"):
        RetentionPolicy.resolve(max_periodic=-1)


def test_periodic_beyond_the_count_go_protected_kinds_and_the_newest_stay(tmp_path, root):
    old_periodic = [take(tmp_path, "periodic") for _ in range(3)]
    manual = take(tmp_path, "manual")
    newest = take(tmp_path, "periodic")
    plan = plan_retention(root, "orders", RetentionPolicy(max_periodic=2))
    assert actions(plan) == {old_periodic[0]: Action.DISPOSE, old_periodic[1]: Action.DISPOSE,
                             old_periodic[2]: Action.KEEP, manual: Action.KEEP, newest: Action.KEEP}
    assert [d.savepoint_id for d in plan.decisions] == [*old_periodic, manual, newest]  # oldest first
    reasons = {d.savepoint_id: d.reason for d in plan.decisions}
    assert "beyond max_periodic=2" in reasons[old_periodic[0]] and "never removed" in reasons[manual]
    assert reasons[newest] == "the newest completed savepoint of the job"


def test_age_counts_only_for_periodic_savepoints(tmp_path, root):
    periodic, manual = take(tmp_path, "periodic"), take(tmp_path, "manual")
    later = datetime.now(UTC) + timedelta(days=30)
    plan = plan_retention(root, "orders", RetentionPolicy(max_periodic=None, max_age_seconds=86400.0), now=later)
    assert actions(plan) == {periodic: Action.DISPOSE, manual: Action.KEEP}
    assert "past max_age=1.0d" in plan.decisions[0].reason


def test_an_incomplete_location_is_an_orphan_after_the_timeout_unless_the_lease_names_it(tmp_path, root):
    take(tmp_path, "periodic")
    folder = tmp_path / "sp" / "orders" / ORPHAN
    folder.mkdir()
    (folder / "metadata").write_text("{}")
    policy = RetentionPolicy(orphan_timeout_seconds=600)
    assert actions(plan_retention(root, "orders", policy))[ORPHAN] == Action.KEEP  # may still be written
    then = time.time() - 3600
    os.utime(folder / "metadata", (then, then))
    assert actions(plan_retention(root, "orders", policy))[ORPHAN] == Action.REMOVE_ORPHAN
    lock = JobLock(root.child("orders"), request_id=None)
    assert lock.try_acquire() is None
    lock.set_savepoint(ORPHAN)
    try:
        decision = next(d for d in plan_retention(root, "orders", policy).decisions if d.savepoint_id == ORPHAN)
        assert (decision.action, decision.reason) == (Action.KEEP, "in progress: holds the job's savepoint lease")
    finally:
        lock.release()


def test_a_copied_savepoint_folder_is_a_conflict_kept_for_a_person(tmp_path, root):
    original = take(tmp_path, "periodic")
    take(tmp_path, "periodic")
    shutil.copytree(tmp_path / "sp" / "orders" / original, tmp_path / "sp" / "orders" / ORPHAN)
    plan = plan_retention(root, "orders", RetentionPolicy(max_periodic=0))
    copy = next(d for d in plan.decisions if d.savepoint_id == ORPHAN)
    assert copy.action == Action.KEEP and "holds a _metadata of savepoint" in copy.conflict
    assert plan.settle[ORPHAN].conflict == copy.conflict


def test_applying_a_plan_disposes_and_removes_orphans_only(tmp_path, root):
    gone = take(tmp_path, "periodic")
    kept = take(tmp_path, "periodic")
    folder = tmp_path / "sp" / "orders" / ORPHAN
    folder.mkdir()
    then = time.time() - 3600
    os.utime(folder, (then, then))  # left by a trigger killed an hour ago
    report = apply_retention(root, plan_retention(root, "orders", RetentionPolicy(max_periodic=1, orphan_timeout_seconds=600)))
    assert (report.disposed, report.removed_orphans, report.failed) == ([gone], [ORPHAN], [])
    assert sorted(p.name for p in (tmp_path / "sp" / "orders").iterdir() if p.name.startswith("savepoint-")) == [kept]



def test_an_orphan_named_by_a_stale_lease_is_removed_only_after_the_lease_is_broken(tmp_path, root):
    """A writer late with its heartbeat (its lease stale, never taken over) must not complete a location
    retention removes: retention breaks the stale lease first, so the writer's check before ``_metadata`` fails."""
    take(tmp_path, "periodic")
    folder = tmp_path / "sp" / "orders" / ORPHAN
    folder.mkdir()
    (folder / "metadata").write_text("{}")
    writer = JobLock(root.child("orders"), request_id="late", stale_after=0.2)
    assert writer.try_acquire() is None
    writer.set_savepoint(ORPHAN)
    writer.lease.stop_heartbeat()  # late: no renewal from here on
    try:
        time.sleep(0.5)
        assert writer.still_held()  # stale, but nobody broke it: the writer would still write its _metadata
        report = apply_retention(root, plan_retention(root, "orders", RetentionPolicy(orphan_timeout_seconds=0)))
        assert report.removed_orphans == [ORPHAN] and not folder.exists()
        assert not writer.still_held()  # so write_metadata refuses: no completed savepoint without its files
    finally:
        writer.release()

def test_max_manual_caps_manual_stop_and_retained_savepoints_together(tmp_path, root):
    protected = [take(tmp_path, kind) for kind in ("manual", "stop", "retained_checkpoint", "manual")]
    periodic = take(tmp_path, "periodic")
    newest_manual = take(tmp_path, "manual")
    assert set(actions(plan_retention(root, "orders", RetentionPolicy(max_periodic=5))).values()) == {Action.KEEP}

    plan = plan_retention(root, "orders", RetentionPolicy(max_periodic=5, max_manual=2))
    assert actions(plan) == {protected[0]: Action.DISPOSE, protected[1]: Action.DISPOSE,
                             protected[2]: Action.DISPOSE, protected[3]: Action.KEEP,
                             periodic: Action.KEEP, newest_manual: Action.KEEP}
    reasons = {d.savepoint_id: d.reason for d in plan.decisions}
    assert reasons[protected[1]] == "stop #4 from the newest manual/stop/retained, beyond max_manual=2"
    assert "within max_manual=2" in reasons[protected[3]]

    report = apply_retention(root, plan)
    assert sorted(report.disposed) == sorted(protected[:3]) and report.failed == []
    left = sorted(p.name for p in (tmp_path / "sp" / "orders").iterdir() if p.name.startswith("savepoint-"))
    assert left == sorted([protected[3], periodic, newest_manual])


def test_max_manual_never_removes_the_newest_completed_or_a_pinned_savepoint(tmp_path, root):
    from airflow_savepoints.core.catalog import Catalog
    from airflow_savepoints.core.manifest import read_manifest

    old_stop = take(tmp_path, "stop")
    newest = take(tmp_path, "manual")
    plan = plan_retention(root, "orders", RetentionPolicy(max_manual=0))
    assert actions(plan) == {old_stop: Action.DISPOSE, newest: Action.KEEP}
    assert next(d.reason for d in plan.decisions if d.savepoint_id == newest) == \
        "the newest completed savepoint of the job"

    job = root.child("orders")
    with Catalog(job, "orders").pinned(old_stop, "restore", read_manifest(job.child(old_stop))):
        pinned = plan_retention(root, "orders", RetentionPolicy(max_manual=0))
        assert actions(pinned) == {old_stop: Action.KEEP, newest: Action.KEEP}
        assert apply_retention(root, plan).disposed == []  # the pin taken after planning is honoured too
    assert (tmp_path / "sp" / "orders" / old_stop).exists()


def test_max_manual_resolves_from_configuration_and_refuses_bad_values(monkeypatch):
    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__MAX_MANUAL_SAVEPOINTS", raising=False)
    monkeypatch.setenv("AIRFLOW_CONFIG", "/nonexistent/airflow.cfg")
    assert RetentionPolicy.resolve().max_manual is None  # default: no limit
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__MAX_MANUAL_SAVEPOINTS", "3")
    assert RetentionPolicy.resolve().max_manual == 3
    assert RetentionPolicy.resolve(max_manual="none").max_manual is None
    assert RetentionPolicy.resolve(max_manual=7).max_manual == 7
    with pytest.raises(InvalidInputError, match="max_manual"):
        RetentionPolicy.resolve(max_manual="lots")
    with pytest.raises(InvalidInputError, match="max_manual"):
        RetentionPolicy.resolve(max_manual=-1)
