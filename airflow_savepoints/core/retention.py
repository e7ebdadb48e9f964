"""Retention: which savepoints of a job to keep, and the disposal of the rest.

Never removed: the newest completed savepoint of the job; a savepoint pinned by a restore or an
incremental savepoint in progress; anything still in progress. Periodic savepoints beyond the
``max_periodic`` newest, or older than ``max_age``, are disposed; manual, stop and
retained-checkpoint savepoints beyond the ``max_manual`` newest of them (default: no limit).
Locations without ``_metadata`` older than ``orphan_timeout`` (a trigger that crashed) are removed.
Every removal re-checks its grounds right before it deletes; a dry run only returns the plan.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airflow_savepoints.core.catalog import Catalog, SavepointRecord, SavepointState
from airflow_savepoints.core.dispose import check_no_link, check_under_root, discard_incomplete, dispose_location
from airflow_savepoints.core.lease import JobLock, store_now
from airflow_savepoints.core.manifest import BAD_MANIFEST, SAVEPOINT_NAME, read_manifest
from airflow_savepoints.core.models import SavepointManifest, SavepointType, validate_job_name
from airflow_savepoints.core.names import (
    AUTOSCALE_FILE,
    CATALOG_FILE,
    CATALOG_LOCK,
    CLOCK_PROBE_PREFIX,
    INFLIGHT_LEASE,
    LEASE_BREAK_SUFFIX,
    MANIFEST_FILE,
    METRICS_FILE,
    RUN_FILE,
)
from airflow_savepoints.core.settings import DEFAULTS, configured_option, parse_duration
from airflow_savepoints.core.state_summary import remove_stray_summaries
from airflow_savepoints.errors import (
    IncompleteSavepointError,
    InvalidInputError,
    SavepointError,
    SavepointNotFoundError,
)
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

DEFAULT_MAX_PERIODIC = int(DEFAULTS["max_periodic_savepoints"])
DEFAULT_MAX_AGE = DEFAULTS["max_savepoint_age"]
DEFAULT_ORPHAN_TIMEOUT = DEFAULTS["orphan_timeout"]
DEFAULT_MAX_MANUAL = DEFAULTS["max_manual_savepoints"]
NO_LIMIT = ("none", "off", "unlimited")
PROTECTED_TYPES = {SavepointType.MANUAL, SavepointType.STOP, SavepointType.RETAINED_CHECKPOINT}
_TEN_YEARS = 10 * 365 * 86400.0


class RetentionPolicy(BaseModel):
    """Bounds for a job's savepoints. ``None``: no bound of that kind. ``max_manual`` caps manual,
    stop and retained-checkpoint savepoints together."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_periodic: int | None = Field(default=DEFAULT_MAX_PERIODIC, ge=0, le=100_000)
    max_age_seconds: float | None = Field(default=parse_duration(DEFAULT_MAX_AGE), ge=0, le=_TEN_YEARS)
    orphan_timeout_seconds: float = Field(default=parse_duration(DEFAULT_ORPHAN_TIMEOUT), ge=0, le=_TEN_YEARS)
    max_manual: int | None = Field(default=None, ge=0, le=100_000)

    @classmethod
    def resolve(cls, max_periodic: int | str | None = None, max_age: str | float | None = None,
                orphan_timeout: str | float | None = None, max_manual: int | str | None = None) -> RetentionPolicy:
        """Given values beat ``[savepoints]`` configuration, which beats the defaults (10, 7d, 1h,
        no limit: ``core.settings.OPTIONS``).

        A ``max_age`` or ``max_manual`` of "none" means no limit."""
        periodic = _given_or_configured(max_periodic, "max_periodic_savepoints")
        age = _given_or_configured(max_age, "max_savepoint_age")
        orphan = _given_or_configured(orphan_timeout, "orphan_timeout")
        manual = _given_or_configured(max_manual, "max_manual_savepoints")
        try:
            return cls(
                max_periodic=_count(periodic, "max_periodic"),
                max_age_seconds=None if str(age).strip().lower() in NO_LIMIT else _seconds(age),
                orphan_timeout_seconds=_seconds(orphan),
                max_manual=None if str(manual).strip().lower() in NO_LIMIT else _count(manual, "max_manual"),
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(x) for x in first.get("loc", ()))
            raise InvalidInputError(
                f"invalid retention setting {field}: {first.get('msg')} (got {first.get('input')!r})",
                "max_periodic and max_manual are 0..100000; durations are 0s..3650d, e.g. 90s, 15m, 12h, 7d",
            ) from exc


def _given_or_configured(value: Any, option: str) -> Any:
    return value if value not in (None, "") else (configured_option(option) or DEFAULTS[option])


def _count(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"invalid {name} {value!r}", "use a whole number >= 0, e.g. 10") from None


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
    planner = _Planner(job_store, job, policy, now)
    decisions = planner.decide()
    order = {d.savepoint_id: (d.created_at or now, d.savepoint_id) for d in decisions}
    decisions.sort(key=lambda d: order[d.savepoint_id])
    return RetentionPlan(job=job, savepoint_dir=root.url, policy=policy, decisions=decisions, planned_at=now,
                         settle={k: v for k, v in planner.settle.items() if v is not None})


class _Planner:
    """One retention plan of one job folder: every location sorted, then the policy over the completed ones."""

    def __init__(self, job_store: Store, job: str, policy: RetentionPolicy, now: datetime):
        self.job_store, self.job, self.policy, self.now = job_store, job, policy, now
        self.document = Catalog(job_store, job).load()
        self.in_flight = JobLock(job_store, request_id=None).live_savepoint()
        self.decisions: list[Decision] = []
        self.completed: list[SavepointRecord] = []
        self.settle: dict[str, SavepointRecord | None] = {}  # catalog corrections the plan relies on
        self._store_clock: datetime | None = None
        self.folders: dict[str, list[float | None]] = {}  # savepoint folder -> modification times of its files
        self.complete: set[str] = set()
        for path, stat in job_store.list_files().items():  # retention may crawl; listing and lookup never do
            folder, _, rest = path.partition("/")
            if SAVEPOINT_NAME.match(folder):
                self.folders.setdefault(folder, []).append(stat.modified)
                if rest == MANIFEST_FILE:
                    self.complete.add(folder)
        for name in job_store.listdir():  # empty folders do not show in a listing of files
            if SAVEPOINT_NAME.match(name):
                self.folders.setdefault(name, [])

    def decide(self) -> list[Decision]:
        for savepoint_id in sorted(set(self.folders) | set(self.document.records)):
            record = self.document.records.get(savepoint_id)
            if savepoint_id == self.in_flight:
                self._add(record, savepoint_id, Action.KEEP, "in progress: holds the job's savepoint lease")
            elif savepoint_id not in self.folders:
                continue  # a record whose location is gone: nothing to remove (the record is dropped on apply)
            elif savepoint_id in self.complete:
                self._complete_location(savepoint_id, record)
            else:
                self._incomplete_location(savepoint_id, record)
        self._apply_policy()
        return self.decisions

    def _add(self, record: SavepointRecord | None, savepoint_id: str, action: Action, reason: str,
             conflict: str | None = None) -> None:
        self.decisions.append(_decision(record, savepoint_id, self.job_store.child(savepoint_id).url, action, reason,
                                        conflict=conflict))

    def _complete_location(self, savepoint_id: str, record: SavepointRecord | None) -> None:
        """A location with ``_metadata``: to the policy, unless its identity is disputed."""
        if record is not None and record.state in (SavepointState.COMPLETED, SavepointState.DISPOSING) \
                and record.conflict is None:
            self.completed.append(record)
            return
        location = self.job_store.child(savepoint_id)
        try:  # complete, but the catalog does not know it (yet), or flagged a conflict before: look again
            manifest = read_manifest(location)
        except (*BAD_MANIFEST, IncompleteSavepointError) as exc:
            self._add(record, savepoint_id, Action.KEEP,
                      f"has an unreadable _metadata ({exc.code}): left for a person to inspect")
            return
        found = SavepointRecord.from_manifest(manifest, location.url)
        conflict = identity_conflict(savepoint_id, self.job, manifest, record)
        if conflict:
            flagged = (record or found).model_copy(update={"savepoint_id": savepoint_id, "conflict": conflict})
            self.settle[savepoint_id] = flagged  # shown by list and the API; never restored or disposed
            self._add(flagged, savepoint_id, Action.KEEP, f"conflict: {conflict}; never removed by retention: left "
                      "for a person to inspect", conflict=conflict)
            return
        self.completed.append(found)
        self.settle[savepoint_id] = found

    def _incomplete_location(self, savepoint_id: str, record: SavepointRecord | None) -> None:
        """A location without ``_metadata``: an orphan once nothing was written to it for the orphan timeout."""
        if record is not None and record.state != SavepointState.IN_PROGRESS:
            self.settle[savepoint_id] = record.model_copy(update={"state": SavepointState.FAILED})
        age = _age(self._last_written(savepoint_id), self._now_on_store())  # the store's mtime against its clock
        missing = "its _metadata is missing" if record is not None and record.state != SavepointState.IN_PROGRESS \
            else "no _metadata"
        timeout = f"orphan timeout {_human(self.policy.orphan_timeout_seconds)}"
        if age is not None and age < self.policy.orphan_timeout_seconds:
            self._add(record, savepoint_id, Action.KEEP, f"incomplete ({missing}), last written {_human(age)} ago: "
                      f"may still be in progress ({timeout})")
        else:
            self._add(record, savepoint_id, Action.REMOVE_ORPHAN,
                      f"orphan: {missing}, last written {_human(age)} ago ({timeout})")

    def _last_written(self, savepoint_id: str) -> float | None:
        times = [t for t in self.folders[savepoint_id] if t is not None]
        if times:
            return max(times)
        try:
            return self.job_store.stat(savepoint_id).modified
        except (FileNotFoundError, SavepointError):
            return None

    def _now_on_store(self) -> datetime:
        if self._store_clock is None:
            self._store_clock = datetime.fromtimestamp(store_now(self.job_store), UTC)
        return self._store_clock

    def _apply_policy(self) -> None:
        """Keep or dispose each completed savepoint; a disposal only when record, _metadata and folder agree."""
        completed = sorted(self.completed, key=lambda r: (r.created_at, r.batch_id or -1))
        live = [r for r in completed if r.state == SavepointState.COMPLETED]
        newest = live[-1].savepoint_id if live else None
        rank = {r.savepoint_id: i for i, r in enumerate(r for r in reversed(live) if r.type == SavepointType.PERIODIC)}
        rank.update({r.savepoint_id: i for i, r in enumerate(r for r in reversed(live) if r.type in PROTECTED_TYPES)})
        for record in completed:
            action, reason = self._policy_says(record, newest, rank)
            conflict = self._disposal_conflict(record) if action == Action.DISPOSE else None
            if conflict:
                action, reason = Action.KEEP, f"conflict: {conflict}; never removed by retention"
                self.settle[record.savepoint_id] = record.model_copy(update={"conflict": conflict})
            self._add(record, record.savepoint_id, action, reason, conflict=conflict)

    def _policy_says(self, record: SavepointRecord, newest: str | None, rank: dict[str, int]) -> tuple[Action, str]:
        pins = self.document.active_pins(record.savepoint_id, self.now, lease_names=lambda: self.in_flight)
        age = _age(record.created_at, self.now) or 0.0
        policy = self.policy
        if pins:
            return Action.KEEP, f"pinned by {pins[0].holder()}"
        if record.state == SavepointState.DISPOSING:
            return Action.DISPOSE, "an earlier disposal was interrupted: finishing it"
        if record.savepoint_id == newest:
            return Action.KEEP, "the newest completed savepoint of the job"
        if record.type in PROTECTED_TYPES:
            return self._manual_policy_says(record, rank)
        place = f"periodic #{rank[record.savepoint_id] + 1} from the newest"
        if policy.max_periodic is not None and rank[record.savepoint_id] >= policy.max_periodic:
            return Action.DISPOSE, f"{place}, beyond max_periodic={policy.max_periodic}"
        if policy.max_age_seconds is not None and age > policy.max_age_seconds:
            return Action.DISPOSE, f"periodic, {_human(age)} old, past max_age={_human(policy.max_age_seconds)}"
        return Action.KEEP, f"{place}, {_human(age)} old: within the policy"

    def _manual_policy_says(self, record: SavepointRecord, rank: dict[str, int]) -> tuple[Action, str]:
        """Manual, stop and retained-checkpoint savepoints: counted together from the newest."""
        cap = self.policy.max_manual
        if cap is None:
            return Action.KEEP, f"a {record.type.value} savepoint: never removed by retention (max_manual: no limit)"
        place = f"{record.type.value} #{rank[record.savepoint_id] + 1} from the newest manual/stop/retained"
        if rank[record.savepoint_id] >= cap:
            return Action.DISPOSE, f"{place}, beyond max_manual={cap}"
        return Action.KEEP, f"{place}: within max_manual={cap}"

    def _disposal_conflict(self, record: SavepointRecord) -> str | None:
        try:
            manifest = read_manifest(self.job_store.child(record.savepoint_id))
        except BAD_MANIFEST as exc:
            return f"its _metadata is unreadable ({exc.code})"
        except IncompleteSavepointError:
            return None  # gone meanwhile: apply finds it gone
        return identity_conflict(record.savepoint_id, self.job, manifest, record)


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
    catalog.reconcile(in_flight=lock.live_savepoint())
    if plan.settle:
        catalog.update(lambda d: d.records.update(plan.settle))
    for decision in plan.of(Action.DISPOSE):
        try:
            location = job_store.child(decision.savepoint_id)
            manifest = read_manifest(location)
            check_under_root(location, manifest, root)
            uncapped = manifest.type in PROTECTED_TYPES and plan.policy.max_manual is None
            if uncapped or manifest.type.value != decision.type:
                report.skipped.append({"savepoint_id": decision.savepoint_id, "error": "conflict",
                                       "message": f"its _metadata now says {manifest.type.value}: kept"})
                continue
            dispose_location(location, manifest, by="retention", why=decision.reason)
            report.disposed.append(decision.savepoint_id)
        except (SavepointNotFoundError, IncompleteSavepointError):
            catalog.forget(decision.savepoint_id)  # already gone: disposal is idempotent
            report.disposed.append(decision.savepoint_id)
        except SavepointError as exc:
            (report.skipped if exc.code == "savepoint_pinned" else report.failed).append(
                {"savepoint_id": decision.savepoint_id, "error": exc.code, "message": exc.message})
    for decision in plan.of(Action.REMOVE_ORPHAN):
        try:
            if not lock.release_location(decision.savepoint_id):  # a live lease names it (a stale one is broken)
                report.skipped.append({"savepoint_id": decision.savepoint_id, "error": "in_progress",
                                       "message": "a trigger took it up again"})
                continue
            check_no_link(job_store.child(decision.savepoint_id), root.root)
            if not discard_incomplete(job_store.child(decision.savepoint_id)):
                report.skipped.append({"savepoint_id": decision.savepoint_id, "error": "completed",
                                       "message": "its _metadata appeared: it is a completed savepoint now"})
                continue
            report.removed_orphans.append(decision.savepoint_id)
        except SavepointError as exc:
            report.failed.append({"savepoint_id": decision.savepoint_id, "error": exc.code, "message": exc.message})
    _forget_vanished(catalog, job_store)
    report.removed_temp_files = _remove_stale_temp_files(job_store, plan)
    return report


_TEMP_OF = (CATALOG_FILE, INFLIGHT_LEASE, RUN_FILE, METRICS_FILE, AUTOSCALE_FILE, CATALOG_LOCK, CLOCK_PROBE_PREFIX[1:-1],
            INFLIGHT_LEASE + LEASE_BREAK_SUFFIX, CATALOG_LOCK + LEASE_BREAK_SUFFIX)  # files written in the job folder
_TEMP_FILE = re.compile(r"^\.(" + "|".join(map(re.escape, _TEMP_OF)) + r")\.[0-9a-f]{32}\.tmp$")
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
    """Drop records of failed or completed savepoints whose location no longer exists, and state
    summaries whose savepoint is gone."""
    folders = set(job_store.listdir())
    remove_stray_summaries(job_store, folders)
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
