"""Retention and the savepoint catalog over real savepoints of a real Spark checkpoint."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core import dispose_savepoint, restore_savepoint, take_savepoint
from airflow_savepoints.core.catalog import CATALOG_FILE, Catalog, CatalogDocument, SavepointRecord, SavepointState
from airflow_savepoints.core.lease import JobLock
from airflow_savepoints.core.models import SavepointType
from airflow_savepoints.core.pointer import latest_savepoint, list_savepoints
from airflow_savepoints.core.retention import Action, RetentionPolicy, plan_retention, retain
from airflow_savepoints.errors import IncompleteSavepointError, InvalidInputError, SavepointPinnedError
from airflow_savepoints.storage import Store
from tests.conftest import tree_snapshot

JOB = "orders"
NO_AGE_LIMIT = None


def take(checkpoint: Path, root: Path, kind: str, reason: str | None = None) -> str:
    return take_savepoint(str(checkpoint), JOB, savepoint_dir=str(root), savepoint_type=kind, reason=reason).pointer


def on_disk(root: Path) -> set[str]:
    """Completed savepoints in storage, read from the _metadata files (not the catalog)."""
    return {p.parent.name for p in (root / JOB).glob("savepoint-*/_metadata")}


def policy(max_periodic: int | None = 10, max_age: float | None = NO_AGE_LIMIT, orphan_timeout: float = 3600) -> RetentionPolicy:
    return RetentionPolicy(max_periodic=max_periodic, max_age_seconds=max_age, orphan_timeout_seconds=orphan_timeout)


def test_ten_periodic_and_two_manual_with_max_three_keep_three_newest_periodic_and_both_manual(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    taken = []
    for index in range(12):
        kind = "manual" if index in (3, 8) else "periodic"
        taken.append((kind, Path(take(checkpoint, root, kind)).name))
    periodic = [name for kind, name in taken if kind == "periodic"]
    manual = [name for kind, name in taken if kind == "manual"]
    assert len(periodic) == 10 and len(manual) == 2 and on_disk(root) == {name for _, name in taken}

    before = tree_snapshot(root)
    dry = retain(Store(str(root)), JOB, policy(max_periodic=3), dry_run=True)
    assert tree_snapshot(root) == before, "a dry run changed storage"
    assert {d.savepoint_id for d in dry.plan.of(Action.DISPOSE)} == set(periodic[:7])

    report = retain(Store(str(root)), JOB, policy(max_periodic=3))
    assert sorted(report.disposed) == sorted(periodic[:7]) and not report.failed
    assert on_disk(root) == set(periodic[-3:]) | set(manual)
    assert {p.name for p in (root / JOB).iterdir() if p.name.startswith("savepoint-")} == on_disk(root)
    listed = list_savepoints(Store(str(root)), JOB)
    assert {r.savepoint_id for r in listed} == on_disk(root)
    assert all(r.state == SavepointState.COMPLETED for r in listed)
    reasons = {d.savepoint_id: d.reason for d in report.plan.decisions}
    assert all("never removed" in reasons[m] for m in manual)

    again = retain(Store(str(root)), JOB, policy(max_periodic=3))
    assert again.disposed == [] and on_disk(root) == set(periodic[-3:]) | set(manual)


def test_the_newest_completed_savepoint_survives_max_count_zero_and_max_age_zero(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    names = [Path(take(checkpoint, root, "periodic")).name for _ in range(3)]
    report = retain(Store(str(root)), JOB, policy(max_periodic=0, max_age=0))
    assert sorted(report.disposed) == sorted(names[:2])
    assert on_disk(root) == {names[-1]}
    kept = next(d for d in report.plan.decisions if d.savepoint_id == names[-1])
    assert kept.action == Action.KEEP and "newest completed" in kept.reason
    assert latest_savepoint(Store(str(root)), JOB).manifest.savepoint_id == names[-1]


def test_max_age_disposes_old_periodic_savepoints_only(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    old = [Path(take(checkpoint, root, "periodic")).name for _ in range(2)]
    manual = Path(take(checkpoint, root, "manual")).name
    newest = Path(take(checkpoint, root, "periodic")).name
    later = datetime.now(UTC) + timedelta(days=8)  # all four are now 8 days old
    plan = plan_retention(Store(str(root)), JOB, policy(max_periodic=100, max_age=7 * 86400), now=later)
    assert {d.savepoint_id for d in plan.of(Action.DISPOSE)} == set(old)
    assert all("past max_age" in d.reason for d in plan.of(Action.DISPOSE))
    assert {d.savepoint_id for d in plan.of(Action.KEEP)} == {manual, newest}
    soon = plan_retention(Store(str(root)), JOB, policy(max_periodic=100, max_age=7 * 86400))
    assert soon.of(Action.DISPOSE) == []


def test_a_pinned_savepoint_survives_retention_and_dispose(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    names = [Path(take(checkpoint, root, "periodic")).name for _ in range(3)]
    catalog = Catalog(Store(str(root / JOB)), JOB)
    pin = catalog.pin(names[0])  # what a restore in progress does

    report = retain(Store(str(root)), JOB, policy(max_periodic=1))
    assert report.disposed == [names[1]]
    assert on_disk(root) == {names[0], names[2]}
    assert "pinned by a restore" in next(d.reason for d in report.plan.decisions if d.savepoint_id == names[0])
    before = tree_snapshot(root / JOB / names[0])
    with pytest.raises(SavepointPinnedError, match="pinned by a restore"):
        dispose_savepoint(str(root / JOB / names[0]), savepoint_dir=str(root))
    assert tree_snapshot(root / JOB / names[0]) == before

    catalog.unpin(pin)
    assert retain(Store(str(root)), JOB, policy(max_periodic=1)).disposed == [names[0]]
    assert on_disk(root) == {names[2]}


def test_restore_pins_while_it_copies_and_releases_the_pin(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    pointer = take(checkpoint, root, "periodic")
    catalog = Catalog(Store(str(root / JOB)), JOB)
    seen: list[int] = []
    original = Catalog.pin

    def pin_and_look(self, savepoint_id, *args, **kwargs):
        pin_id = original(self, savepoint_id, *args, **kwargs)
        seen.append(len(self.load().active_pins(savepoint_id)))
        return pin_id

    Catalog.pin = pin_and_look
    try:
        restore_savepoint(pointer, str(tmp_path / "restored"))
    finally:
        Catalog.pin = original
    assert seen == [1], "the restore did not hold a pin"
    assert catalog.load().pins == {}
    assert (tmp_path / "restored" / "metadata").is_file()


def test_a_savepoint_whose_metadata_is_missing_is_never_restored(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    older = take(checkpoint, root, "periodic")
    newer = take(checkpoint, root, "periodic")
    (Path(newer) / "_metadata").unlink()
    record = next(r for r in list_savepoints(Store(str(root)), JOB) if r.pointer.endswith(Path(newer).name))
    assert record.state == SavepointState.COMPLETED  # the catalog still says so ...
    assert latest_savepoint(Store(str(root)), JOB).pointer.endswith(Path(older).name)  # ... but it is not offered
    with pytest.raises(IncompleteSavepointError):
        restore_savepoint(newer, str(tmp_path / "restored"))
    assert not (tmp_path / "restored").exists()
    plan = plan_retention(Store(str(root)), JOB, policy(orphan_timeout=3600))
    assert next(d for d in plan.decisions if d.savepoint_id == Path(newer).name).action == Action.KEEP
    report = retain(Store(str(root)), JOB, policy(orphan_timeout=0))
    assert report.removed_orphans == [Path(newer).name] and on_disk(root) == {Path(older).name}
    assert {r.savepoint_id for r in list_savepoints(Store(str(root)), JOB)} == {Path(older).name}


def test_orphans_are_removed_after_the_timeout_and_in_flight_locations_are_kept(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    kept = Path(take(checkpoint, root, "periodic")).name
    orphan = root / JOB / "savepoint-abcdef-0123456789ab"
    (orphan / "offsets").mkdir(parents=True)
    (orphan / "offsets" / "0").write_text("v1")
    in_flight = root / JOB / "savepoint-abcdef-ba9876543210"
    (in_flight / "commits").mkdir(parents=True)
    lock = JobLock(Store(str(root / JOB)), request_id="r1")
    assert lock.try_acquire() is None
    lock.set_savepoint(in_flight.name)
    not_a_savepoint = root / JOB / "savepoint-notes"
    not_a_savepoint.mkdir()
    killed_write = root / JOB / f"._catalog.json.{'ab' * 16}.tmp"  # a catalog update whose writer was killed
    killed_write.write_text("{")
    os.utime(killed_write, (time.time() - 600, time.time() - 600))  # killed 10 minutes ago
    live_write = root / JOB / f"._catalog.json.{'cd' * 16}.tmp"  # a writer at work: never removed (floor)
    live_write.write_text("{")
    not_ours = root / JOB / "._catalog.json.notes.tmp"
    not_ours.write_text("kept")
    try:
        young = retain(Store(str(root)), JOB, policy(orphan_timeout=3600))
        assert young.removed_orphans == [] and orphan.exists()
        report = retain(Store(str(root)), JOB, policy(orphan_timeout=0))
        assert report.removed_orphans == [orphan.name]
        assert not orphan.exists() and in_flight.exists() and not_a_savepoint.exists()
        assert report.removed_temp_files == [killed_write.name] and not killed_write.exists() and not_ours.exists()
        assert live_write.exists()
        assert young.removed_temp_files == []
        reason = next(d.reason for d in report.plan.decisions if d.savepoint_id == in_flight.name)
        assert "lease" in reason
        assert on_disk(root) == {kept}
    finally:
        lock.release()


@pytest.mark.parametrize("args", [
    {"max_periodic": -1}, {"max_periodic": "ten"}, {"max_periodic": 10**9},
    {"max_age": "-5m"}, {"max_age": "forever"}, {"max_age": "99999d"}, {"orphan_timeout": "-1s"},
])
def test_bad_retention_values_are_refused_with_a_clear_error(args):
    with pytest.raises(InvalidInputError) as caught:
        RetentionPolicy.resolve(**args)
    assert caught.value.hint


def test_defaults_come_from_the_savepoints_configuration(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__MAX_PERIODIC_SAVEPOINTS", "4")
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__MAX_SAVEPOINT_AGE", "12h")
    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__ORPHAN_TIMEOUT", raising=False)
    resolved = RetentionPolicy.resolve()
    assert (resolved.max_periodic, resolved.max_age_seconds, resolved.orphan_timeout_seconds) == (4, 43200, 3600)
    assert RetentionPolicy.resolve(max_periodic=2, max_age="none").model_dump() == {
        "max_periodic": 2, "max_age_seconds": None, "orphan_timeout_seconds": 3600.0, "max_manual": None}


def test_cli_retain_dry_run_then_apply(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    names = [Path(take(checkpoint, root, "periodic")).name for _ in range(3)]
    runner = CliRunner()
    before = tree_snapshot(root)
    dry = runner.invoke(app, ["retain", "--job", JOB, "--dir", str(root), "--max-periodic", "1", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.stdout
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True and plan["disposed"] == []
    assert [d["savepoint_id"] for d in plan["decisions"] if d["action"] == "dispose"] == names[:2]
    assert tree_snapshot(root) == before
    text = runner.invoke(app, ["retain", "--job", JOB, "--dir", str(root), "--max-periodic", "1"])
    assert text.exit_code == 0 and "removed 2 savepoints" in text.stdout
    assert on_disk(root) == {names[2]}
    bad = runner.invoke(app, ["retain", "--job", JOB, "--dir", str(root), "--max-age", "soon", "--json"])
    assert bad.exit_code == 1 and json.loads(bad.stdout)["error"]["code"] == "invalid_input"
    listed = json.loads(runner.invoke(app, ["list", "--job", JOB, "--dir", str(root), "--json"]).stdout)
    assert [(s["type"], s["state"], s["batch_id"]) for s in listed["savepoints"]] == [("periodic", "completed", 5)]
    assert listed["savepoints"][0]["pointer"] == str(root / JOB / names[2])


def test_catalog_is_rebuilt_from_metadata_files(checkpoint, tmp_path):
    root = tmp_path / "savepoints"
    names = [Path(take(checkpoint, root, kind)).name for kind in ("periodic", "manual")]
    before = [(r.savepoint_id, r.type, r.batch_id) for r in list_savepoints(Store(str(root)), JOB)]
    (root / JOB / CATALOG_FILE).unlink()
    assert [(r.savepoint_id, r.type, r.batch_id) for r in list_savepoints(Store(str(root)), JOB)] == before
    assert not (root / JOB / CATALOG_FILE).exists(), "listing must not write"
    (root / JOB / CATALOG_FILE).write_text("{not json")
    result = CliRunner().invoke(app, ["catalog", "--job", JOB, "--dir", str(root), "--rebuild", "--json"])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["records"] == 2
    assert sorted(json.loads((root / JOB / CATALOG_FILE).read_text())["records"]) == sorted(names)


class CountingFS:
    """Counts the calls that reach the filesystem (listing, reading, stat); passes everything through."""

    LOCAL_ONLY = {"invalidate_cache", "_strip_protocol", "protocol", "sep", "root_marker"}

    def __init__(self, fs):
        self._fs, self.calls = fs, []

    def __getattr__(self, name):
        value = getattr(self._fs, name)
        if callable(value) and name not in self.LOCAL_ONLY:
            def counted(*args, **kwargs):
                self.calls.append(name)
                return value(*args, **kwargs)
            return counted
        return value


@pytest.mark.parametrize("synthetic", [10, 10_000])
def test_latest_and_listing_make_the_same_number_of_storage_requests_for_10_and_10000_savepoints(
        checkpoint, tmp_path, synthetic, monkeypatch):
    root = tmp_path / "savepoints"
    real = take_savepoint(str(checkpoint), JOB, savepoint_dir=str(root), savepoint_type="periodic")
    catalog = Catalog(Store(str(root / JOB)), JOB)
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def add_synthetic(document: CatalogDocument) -> None:
        for i in range(synthetic - 1):
            sid = f"savepoint-synthe-{i:012x}"
            document.records[sid] = SavepointRecord(
                savepoint_id=sid, job=JOB, type=SavepointType.PERIODIC, state=SavepointState.COMPLETED,
                batch_id=i, bytes=1000, files=10, created_at=start + timedelta(seconds=i), updated_at=start)

    catalog.update(add_synthetic)
    store = Store(str(root))
    counting = CountingFS(store.fs)
    counted = Store(str(root), _fs=counting)
    real_read = Store.read_known_stamped

    def counted_read(self, rel, kind):  # a file of a known name is read by the local back end's own open()
        counting.calls.append("read_known")
        return real_read(self, rel, kind)

    monkeypatch.setattr(Store, "read_known_stamped", counted_read)
    latest = latest_savepoint(counted, JOB)
    latest_calls = list(counting.calls)
    counting.calls.clear()
    listed = list_savepoints(counted, JOB)
    listing_calls = list(counting.calls)
    assert latest.pointer == real.pointer and len(listed) == synthetic
    print(f"{synthetic} savepoints: latest {len(latest_calls)} requests {latest_calls}, "
          f"listing {len(listing_calls)} requests {listing_calls}")
    assert len(latest_calls) == 2  # the catalog, then the newest record's _metadata
    assert len(listing_calls) == 1  # the catalog


def test_the_catalog_keeps_a_bounded_history_of_completed_failed_and_disposed_attempts(checkpoint, tmp_path):
    from airflow_savepoints.core.catalog import HISTORY_LIMIT, HistoryEntry
    from airflow_savepoints.errors import CheckpointNotFoundError

    root = tmp_path / "savepoints"
    periodic = [Path(take(checkpoint, root, "periodic", f"round {i}")).name for i in range(3)]
    manual = Path(take(checkpoint, root, "manual", "before upgrade")).name
    with pytest.raises(CheckpointNotFoundError):
        take_savepoint(str(tmp_path / "gone"), JOB, savepoint_dir=str(root), savepoint_type="periodic")
    report = retain(Store(str(root)), JOB, policy(max_periodic=1))
    assert sorted(report.disposed) == sorted(periodic[:2])
    dispose_savepoint(str(root / JOB / manual), savepoint_dir=str(root), by="an operator", why="upgrade done")

    history = Catalog(Store(str(root / JOB)), JOB).history()
    assert [(e.savepoint_id, e.outcome) for e in history] == [  # bad input (a missing checkpoint) changes nothing
        *[(s, "completed") for s in periodic], (manual, "completed"),
        *[(s, "disposed") for s in sorted(periodic[:2], key=periodic.index)], (manual, "disposed")]
    completed = history[:4]
    assert all(e.triggered_at <= e.ended_at and e.duration_s >= 0 and e.bytes > 0 and e.files > 0 for e in completed)
    assert {e.disposed_by for e in history[4:6]} == {"retention"} and all("max_periodic" in e.reason for e in history[4:6])
    assert (history[6].disposed_by, history[6].reason, history[6].bytes) == ("an operator", "upgrade done", completed[3].bytes)

    # a catalog written before the history still loads, its records intact, with an empty history
    raw = json.loads((root / JOB / CATALOG_FILE).read_text())
    raw.pop("history")
    (root / JOB / CATALOG_FILE).write_text(json.dumps(raw))
    assert Catalog(Store(str(root / JOB)), JOB).history() == []
    assert [r.savepoint_id for r in list_savepoints(Store(str(root)), JOB)] == [periodic[2]]

    document = CatalogDocument(job=JOB)
    for index in range(HISTORY_LIMIT + 5):
        document.remember(HistoryEntry(outcome="failed", ended_at=datetime.now(UTC), error=f"attempt {index}"))
    assert len(document.history) == HISTORY_LIMIT and document.history[0].error == "attempt 5"
