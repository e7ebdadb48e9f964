"""Retention: which savepoints of a job to keep, and the disposal of the rest.

Never removed: manual, stop and retained-checkpoint savepoints; the newest completed savepoint of
the job; a savepoint pinned by a restore in progress; anything still in progress. Periodic
savepoints beyond the ``max_periodic`` newest, or older than ``max_age``, are disposed. Locations
without ``_metadata`` older than ``orphan_timeout`` (a trigger that crashed) are removed. Every
removal re-checks its grounds right before it deletes; a dry run only returns the plan.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airflow_savepoints.core.catalog import Catalog, SavepointRecord, SavepointState
from airflow_savepoints.core.dispose import check_no_link, check_under_root, dispose_location
from airflow_savepoints.core.lease import JobLock, store_now
from airflow_savepoints.core.models import MANIFEST_FILE, SavepointManifest, SavepointType, validate_job_name
from airflow_savepoints.core.pointer import SAVEPOINT_NAME, read_manifest
from airflow_savepoints.core.settings import configured_option, parse_duration
from airflow_savepoints.errors import (
    IncompleteSavepointError,
    InvalidInputError,
    ManifestCorruptError,
    ManifestVersionError,
    SavepointError,
    SavepointNotFoundError,
)
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

DEFAULT_MAX_PERIODIC = 10
DEFAULT_MAX_AGE = "7d"
DEFAULT_ORPHAN_TIMEOUT = "1h"
PROTECTED_TYPES = {SavepointType.MANUAL, SavepointType.STOP, SavepointType.RETAINED_CHECKPOINT}
_TEN_YEARS = 10 * 365 * 86400.0


class RetentionPolicy(BaseModel):
    """Bounds for a job's periodic savepoints. ``None``: no bound of that kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_periodic: int | None = Field(default=DEFAULT_MAX_PERIODIC, ge=0, le=100_000)
    max_age_seconds: float | None = Field(default=7 * 86400.0, ge=0, le=_TEN_YEARS)
    orphan_timeout_seconds: float = Field(default=3600.0, ge=0, le=_TEN_YEARS)

    @classmethod
    def resolve(cls, max_periodic: int | str | None = None, max_age: str | float | None = None,
                orphan_timeout: str | float | None = None) -> RetentionPolicy:
        """Given values beat ``[savepoints]`` configuration, which beats the defaults (10, 7d, 1h).

        A ``max_age`` of "none" means no age limit."""
        periodic = max_periodic if max_periodic not in (None, "") else (
            configured_option("max_periodic_savepoints") or DEFAULT_MAX_PERIODIC)
        age = max_age if max_age not in (None, "") else (configured_option("max_savepoint_age") or DEFAULT_MAX_AGE)
        orphan = orphan_timeout if orphan_timeout not in (None, "") else (
            configured_option("orphan_timeout") or DEFAULT_ORPHAN_TIMEOUT)
        try:
            count = int(periodic)
        except (TypeError, ValueError):
            raise InvalidInputError(f"invalid max_periodic {periodic!r}", "use a whole number >= 0, e.g. 10") from None
        try:
            return cls(
                max_periodic=count,
                max_age_seconds=None if str(age).strip().lower() in ("none", "off") else _seconds(age),
                orphan_timeout_seconds=_seconds(orphan),
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(x) for x in first.get("loc", ()))
            raise InvalidInputError(
                f"invalid retention setting {field}: {first.get('msg')} (got {first.get('input')!r})",
                "max_periodic is 0..100000; durations are 0s..3650d, e.g. 90s, 15m, 12h, 7d",
            ) from exc


def _seconds(value: str | float) -> float:
    return float(value) if isinstance(value, int | float) else parse_duration(value)


class Action(StrEnum):
    KEEP = "keep"
    DISPOSE = "dispose"
    REMOVE_ORPHAN = "remove_orphan"


class Decision(BaseModel):
    savepoint_id: str
    pointer: str
    type: str | None
    state: str
    batch_id: int | None = None
    created_at: datetime | None = None
    action: Action
    reason: str
    conflict: str | None = None  # identity sources disagree: kept, for a person to inspect


class RetentionPlan(BaseModel):
    job: str
    savepoint_dir: str
    policy: RetentionPolicy
    decisions: list[Decision]
    planned_at: datetime
    settle: dict[str, SavepointRecord] = Field(default_factory=dict, exclude=True)  # catalog corrections

    def of(self, action: Action) -> list[Decision]:
        return [d for d in self.decisions if d.action == action]


class RetentionReport(BaseModel):
    plan: RetentionPlan
    dry_run: bool
    disposed: list[str] = Field(default_factory=list)
    removed_orphans: list[str] = Field(default_factory=list)
    skipped: list[dict[str, str]] = Field(default_factory=list)  # grounds gone at the last check
    failed: list[dict[str, str]] = Field(default_factory=list)
    removed_temp_files: list[str] = Field(default_factory=list)  # left by killed atomic writes

    def summary(self) -> dict[str, Any]:
        return {
            "job": self.plan.job,
            "savepoint_dir": self.plan.savepoint_dir,
            "dry_run": self.dry_run,
            "policy": self.plan.policy.model_dump(),
            "kept": [d.savepoint_id for d in self.plan.of(Action.KEEP)],
            "disposed": self.disposed,
            "removed_orphans": self.removed_orphans,
            "skipped": self.skipped,
            "failed": self.failed,
            "removed_temp_files": self.removed_temp_files,
            "decisions": [d.model_dump(mode="json") for d in self.plan.decisions],
        }


def _age(created: datetime | float | None, now: datetime) -> float | None:
    if created is None:
        return None
    stamp = created.timestamp() if isinstance(created, datetime) else created
    return now.timestamp() - stamp


def _human(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def plan_retention(root: Store, job: str, policy: RetentionPolicy, now: datetime | None = None) -> RetentionPlan:
    """Decide, for every savepoint location of ``job``, whether to keep or remove it, and why."""
    validate_job_name(job)
    now = now or datetime.now(UTC)
    job_store = root.child(job)
    check_no_link(job_store, root.root)  # a job folder linked elsewhere: never list, write or delete through it
    document = Catalog(job_store, job).load()
    lease = JobLock(job_store, request_id=None).current()
    lease_live = lease is not None and not JobLock(job_store, request_id=None).is_stale(lease)
    in_flight = lease.savepoint_id if lease_live and lease else None
    folders: dict[str, list[float | None]] = {}  # savepoint folder -> modification times of its files
    complete: set[str] = set()
    for path, stat in job_store.list_files().items():  # retention may crawl; listing and lookup never do
        folder, _, rest = path.partition("/")
        if SAVEPOINT_NAME.match(folder):
            folders.setdefault(folder, []).append(stat.modified)
            if rest == MANIFEST_FILE:
                complete.add(folder)
    for name in job_store.listdir():  # empty folders do not show in a listing of files
        if SAVEPOINT_NAME.match(name):
            folders.setdefault(name, [])

    decisions: list[Decision] = []
    completed: list[SavepointRecord] = []
    clock: list[datetime] = []

    def store_clock() -> datetime:
        if not clock:
            clock.append(datetime.fromtimestamp(store_now(job_store), UTC))
        return clock[0]

    settle: dict[str, SavepointRecord | None] = {}  # catalog corrections the plan relies on
    for savepoint_id in sorted(set(folders) | set(document.records)):
        record = document.records.get(savepoint_id)
        pointer = job_store.child(savepoint_id).url
        if savepoint_id == in_flight:
            decisions.append(_decision(record, savepoint_id, pointer, Action.KEEP, "in progress: holds the job's savepoint lease"))
            continue
        if savepoint_id not in folders:
            continue  # a record whose location is gone: nothing to remove (the record is dropped on apply)
        if savepoint_id in complete:
            if record is not None and record.state in (SavepointState.COMPLETED, SavepointState.DISPOSING) \
                    and record.conflict is None:
                completed.append(record)
                continue
            try:  # complete, but the catalog does not know it (yet), or flagged a conflict before: look again
                manifest = read_manifest(job_store.child(savepoint_id))
            except (ManifestCorruptError, ManifestVersionError, IncompleteSavepointError) as exc:
                decisions.append(_decision(record, savepoint_id, pointer, Action.KEEP,
                                           f"has an unreadable _metadata ({exc.code}): left for a person to inspect"))
                continue
            found = SavepointRecord.from_manifest(manifest, pointer)
            conflict = identity_conflict(savepoint_id, job, manifest, record)
            if conflict:
                flagged = (record or found).model_copy(update={"savepoint_id": savepoint_id, "conflict": conflict})
                settle[savepoint_id] = flagged  # shown by list and the API; never restored or disposed
                decisions.append(_decision(flagged, savepoint_id, pointer, Action.KEEP, f"conflict: {conflict}; never "
                                           "removed by retention: left for a person to inspect", conflict=conflict))
                continue
            completed.append(found)
            settle[savepoint_id] = found
            continue
        if record is not None and record.state != SavepointState.IN_PROGRESS:
            settle[savepoint_id] = record.model_copy(update={"state": SavepointState.FAILED})
        times = [t for t in folders[savepoint_id] if t is not None]
        newest = max(times) if times else None
        if newest is None:
            try:
                newest = job_store.stat(savepoint_id).modified
            except (FileNotFoundError, SavepointError):
                newest = None
        age = _age(newest, store_clock())  # the store's mtime against the store's clock
        missing = "its _metadata is missing" if record is not None and record.state != SavepointState.IN_PROGRESS \
            else "no _metadata"
        if age is not None and age < policy.orphan_timeout_seconds:
            decisions.append(_decision(record, savepoint_id, pointer, Action.KEEP,
                                       f"incomplete ({missing}), last written {_human(age)} ago: may still be in "
                                       f"progress (orphan timeout {_human(policy.orphan_timeout_seconds)})"))
        else:
            decisions.append(_decision(record, savepoint_id, pointer, Action.REMOVE_ORPHAN,
                                       f"orphan: {missing}, last written {_human(age)} ago "
                                       f"(orphan timeout {_human(policy.orphan_timeout_seconds)})"))

    completed.sort(key=lambda r: (r.created_at, r.batch_id or -1))
    newest_completed = next((r.savepoint_id for r in reversed(completed) if r.state == SavepointState.COMPLETED), None)
    periodic_rank = {r.savepoint_id: i for i, r in enumerate(
        r for r in reversed(completed) if r.type == SavepointType.PERIODIC and r.state == SavepointState.COMPLETED)}
    for record in completed:
        pointer = job_store.child(record.savepoint_id).url
        pins = document.active_pins(record.savepoint_id, now)
        age = _age(record.created_at, now) or 0.0
        if pins:
            action, reason = Action.KEEP, f"pinned by a {pins[0].purpose} in progress ({pins[0].owner})"
        elif record.state == SavepointState.DISPOSING:
            action, reason = Action.DISPOSE, "an earlier disposal was interrupted: finishing it"
        elif record.savepoint_id == newest_completed:
            action, reason = Action.KEEP, "the newest completed savepoint of the job"
        elif record.type in PROTECTED_TYPES:
            action, reason = Action.KEEP, f"a {record.type.value} savepoint: never removed by retention"
        elif policy.max_periodic is not None and periodic_rank[record.savepoint_id] >= policy.max_periodic:
            action, reason = Action.DISPOSE, (f"periodic #{periodic_rank[record.savepoint_id] + 1} from the newest, "
                                              f"beyond max_periodic={policy.max_periodic}")
        elif policy.max_age_seconds is not None and age > policy.max_age_seconds:
            action, reason = Action.DISPOSE, f"periodic, {_human(age)} old, past max_age={_human(policy.max_age_seconds)}"
        else:
            action, reason = Action.KEEP, (f"periodic #{periodic_rank[record.savepoint_id] + 1} from the newest, "
                                           f"{_human(age)} old: within the policy")
        conflict = None
        if action == Action.DISPOSE:  # only when record, _metadata and folder agree
            try:
                manifest = read_manifest(job_store.child(record.savepoint_id))
                conflict = identity_conflict(record.savepoint_id, job, manifest, record)
            except (ManifestCorruptError, ManifestVersionError) as exc:
                conflict = f"its _metadata is unreadable ({exc.code})"
            except IncompleteSavepointError:
                conflict = None  # gone meanwhile: apply finds it gone
            if conflict:
                action, reason = Action.KEEP, f"conflict: {conflict}; never removed by retention"
                settle[record.savepoint_id] = record.model_copy(update={"conflict": conflict})
        decisions.append(_decision(record, record.savepoint_id, pointer, action, reason, conflict=conflict))

    order = {d.savepoint_id: (d.created_at or now, d.savepoint_id) for d in decisions}
    decisions.sort(key=lambda d: order[d.savepoint_id])
    return RetentionPlan(job=job, savepoint_dir=root.url, policy=policy, decisions=decisions, planned_at=now,
                         settle={k: v for k, v in settle.items() if v is not None})


def identity_conflict(folder: str, job: str, manifest: SavepointManifest, record: SavepointRecord | None) -> str | None:
    """What disagrees about a savepoint's identity: its folder name (the truth), its job folder,
    its ``_metadata`` and its catalog record. None when they all agree."""
    problems = []
    if manifest.savepoint_id != folder:
        problems.append(f"folder {folder} holds a _metadata of savepoint {manifest.savepoint_id} (a copy?)")
    if manifest.job != job:
        problems.append(f"its _metadata names job {manifest.job!r}, the folder is in job {job!r}")
    if record is not None and (record.type != manifest.type or record.job != manifest.job):
        problems.append(f"the catalog says {record.type.value} of job {record.job!r}, the _metadata "
                        f"{manifest.type.value} of job {manifest.job!r}")
    return "; ".join(problems) or None


def _decision(record: SavepointRecord | None, savepoint_id: str, pointer: str, action: Action, reason: str,
              conflict: str | None = None) -> Decision:
    return Decision(
        savepoint_id=savepoint_id, pointer=pointer, action=action, reason=reason, conflict=conflict,
        type=record.type.value if record else None,
        state=record.state.value if record else "incomplete",
        batch_id=record.batch_id if record else None,
        created_at=record.created_at if record else None,
    )


def apply_retention(root: Store, plan: RetentionPlan) -> RetentionReport:
    """Carry out a plan: settle the catalog, dispose savepoints and remove orphans, re-checking each."""
    job_store = root.child(plan.job)
    catalog = Catalog(job_store, plan.job)
    report = RetentionReport(plan=plan, dry_run=False)
    lock = JobLock(job_store, request_id=None)
    lease = lock.current()
    catalog.reconcile(in_flight=lease.savepoint_id if lease is not None and not lock.is_stale(lease) else None)
    if plan.settle:
        catalog.update(lambda d: d.records.update(plan.settle))
    for decision in plan.of(Action.DISPOSE):
        try:
            location = job_store.child(decision.savepoint_id)
            manifest = read_manifest(location)
            check_under_root(location, manifest, root)
            if manifest.type in PROTECTED_TYPES or manifest.type.value != decision.type:
                report.skipped.append({"savepoint_id": decision.savepoint_id, "error": "conflict",
                                       "message": f"its _metadata now says {manifest.type.value}: kept"})
                continue
            dispose_location(location, manifest)
            report.disposed.append(decision.savepoint_id)
        except (SavepointNotFoundError, IncompleteSavepointError):
            catalog.forget(decision.savepoint_id)  # already gone: disposal is idempotent
            report.disposed.append(decision.savepoint_id)
        except SavepointError as exc:
            (report.skipped if exc.code == "savepoint_pinned" else report.failed).append(
                {"savepoint_id": decision.savepoint_id, "error": exc.code, "message": exc.message})
    for decision in plan.of(Action.REMOVE_ORPHAN):
        try:
            current = lock.current()
            if current is not None and current.savepoint_id == decision.savepoint_id and not lock.is_stale(current):
                report.skipped.append({"savepoint_id": decision.savepoint_id, "error": "in_progress",
                                       "message": "a trigger took it up again"})
                continue
            check_no_link(job_store.child(decision.savepoint_id), root.root)
            if MANIFEST_FILE in job_store.list_files(decision.savepoint_id):
                report.skipped.append({"savepoint_id": decision.savepoint_id, "error": "completed",
                                       "message": "its _metadata appeared: it is a completed savepoint now"})
                continue
            job_store.remove_tree(decision.savepoint_id)
            catalog.forget(decision.savepoint_id)
            report.removed_orphans.append(decision.savepoint_id)
        except SavepointError as exc:
            report.failed.append({"savepoint_id": decision.savepoint_id, "error": exc.code, "message": exc.message})
    _forget_vanished(catalog, job_store)
    report.removed_temp_files = _remove_stale_temp_files(job_store, plan)
    return report


_TEMP_FILE = re.compile(
    r"^\.(_catalog\.json|_inflight\.json|_run\.json|_catalog\.lock|_clock|_inflight\.json\.break|_catalog\.lock\.break)"
    r"\.[0-9a-f]{32}\.tmp$")
TEMP_FILE_FLOOR = 300.0  # seconds: longer than any lease's stale time; a live writer's temp file lives for milliseconds


def _remove_stale_temp_files(job_store: Store, plan: RetentionPlan) -> list[str]:
    """Temporary files of an atomic write in the job folder whose writer was killed: older, on the
    store's clock, than the orphan timeout and at least ``TEMP_FILE_FLOOR`` (never a live writer's)."""
    removed = []
    names = [n for n in job_store.listdir() if _TEMP_FILE.match(n)]
    if not names:
        return removed
    now = store_now(job_store)
    timeout = max(plan.policy.orphan_timeout_seconds, TEMP_FILE_FLOOR)
    for name in names:
        try:
            modified = job_store.stat(name).modified
        except (FileNotFoundError, SavepointError):
            continue
        if modified is not None and now - modified >= timeout:
            job_store.remove_file(name)
            removed.append(name)
    return removed


def _forget_vanished(catalog: Catalog, job_store: Store) -> None:
    """Drop records of failed or completed savepoints whose location no longer exists."""
    folders = set(job_store.listdir())
    gone = [sid for sid, r in catalog.load().records.items()
            if sid not in folders and r.state != SavepointState.IN_PROGRESS]
    if gone:
        catalog.update(lambda d: [d.records.pop(sid, None) for sid in gone])


def retain(root: Store, job: str, policy: RetentionPolicy, *, dry_run: bool = False) -> RetentionReport:
    """Plan retention for ``job`` and, unless ``dry_run``, apply it."""
    plan = plan_retention(root, job, policy)
    if dry_run:
        return RetentionReport(plan=plan, dry_run=True)
    report = apply_retention(root, plan)
    log.info("retention of %s: disposed %d, removed %d orphans, kept %d, failed %d", job, len(report.disposed),
             len(report.removed_orphans), len(plan.of(Action.KEEP)), len(report.failed))
    return report
