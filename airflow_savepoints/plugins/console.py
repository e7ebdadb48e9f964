"""What the savepoints console shows, computed from storage (no Airflow import, read-only).

One summary per job folder (lifecycle state, last committed batch, newest savepoint and its age,
counts, size), pages of a job's savepoints, and one savepoint's detail (manifest facts, state
stores, the state summary InspectSavepointOperator recorded (rows and skew per operator), checksums,
which savepoint a restore would pick, ready commands), and a job's metric series (downsampled for its
charts) and autoscale decisions. Everything reads the job's catalog, its ``_metadata`` files and the
lifecycle's and the run's files; nothing is written.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airflow_savepoints.core.catalog import SavepointRecord, SavepointState
from airflow_savepoints.core.models import SavepointManifest
from airflow_savepoints.core.names import AUTOSCALE_FILE, CONTROL_FOLDER, RUN_FILE, RUN_LEASE
from airflow_savepoints.core.pointer import latest_savepoint, list_jobs, list_savepoints
from airflow_savepoints.core.restore import verify_savepoint
from airflow_savepoints.core.settings import parse_duration
from airflow_savepoints.core.state_summary import read_summary, state_files
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs.description.files import tolerant
from airflow_savepoints.jobs.description.metrics import MetricPoint, read_decisions, read_series
from airflow_savepoints.jobs.description.record import restore_default
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

LIFECYCLE_MARKS = (RUN_LEASE, RUN_FILE, CONTROL_FOLDER)  # a job folder the lifecycle has written to
DEFAULT_PERIODIC_INTERVAL = "15m"  # dags/periodic_savepoints.py's default


def periodic_interval_s(configured: str | None = None) -> float:
    """The periodic savepoint interval: configured, else the example DAG's ``SAVEPOINTS_PERIODIC_INTERVAL``, else 15m."""
    return parse_duration(configured or os.environ.get("SAVEPOINTS_PERIODIC_INTERVAL") or DEFAULT_PERIODIC_INTERVAL)


# ---- job summaries ------------------------------------------------------------------------------

def job_specs(jobs_file: str | None) -> dict[str, Any]:
    """The jobs of the jobs file (empty when there is none or it does not read: states then come from
    the job folders' files alone)."""
    from airflow_savepoints.jobs.description.model import load_jobs

    if not jobs_file or not Path(jobs_file).is_file():
        return {}
    try:
        return load_jobs(jobs_file)
    except SavepointError as exc:
        log.warning("savepoints console: cannot read the jobs file %s: %s", jobs_file, exc)
        return {}


def declared_here(root: Store, specs: dict[str, Any]) -> set[str]:
    """Jobs of the jobs file whose savepoints go to this root (their own ``savepoint_dir``, or none:
    the configured one): shown before their first savepoint too."""
    here = (root.protocol, root.root)
    found = set()
    for name, spec in specs.items():
        try:
            if not spec.savepoint_dir or Store.location_of(spec.savepoint_dir) == here:
                found.add(name)
        except SavepointError:
            continue  # a savepoint_dir that is no URL: the job's own commands report it
    return found


def lifecycle_state(root: Store, job: str, specs: dict[str, Any]) -> dict[str, Any] | None:
    """The lifecycle's status of a job whose folder holds a run lease, run record or control folder
    (``jobs/lifecycle.status``, read-only); None for a job the lifecycle never ran."""
    from airflow_savepoints.jobs.description.model import StreamingJob
    from airflow_savepoints.jobs.workflows.lifecycle import status
    from airflow_savepoints.jobs.workflows.run import JobContext

    folder = root.child(job)
    if not any(folder.exists(mark) for mark in LIFECYCLE_MARKS):
        return None
    spec = specs.get(job) or StreamingJob(name=job, application="", checkpoint="")
    try:
        state = status(JobContext(spec, root))
    except SavepointError as exc:
        return {"state": "unknown", "error": exc.message, "reason": error_reason(exc.message)}
    found = state.model_dump(mode="json", include={"state", "run_id", "host", "last_batch", "heartbeat_age_s",
                                                   "error", "detail", "spark_version", "ended"})
    found["last_batch"] = _newest_batch(state.last_batch, state.checkpoint)
    found["reason"] = error_reason(state.error) if state.error else None
    return found


def _newest_batch(beat: int | None, checkpoint: str | None) -> int | None:
    """The last committed batch: the checkpoint's when it reads (a heartbeat may lag it by a batch)."""
    from airflow_savepoints.checkpoint.progress import checkpoint_progress

    try:
        committed = checkpoint_progress(Store(checkpoint))[0] if checkpoint else None
    except Exception:  # noqa: BLE001 - the checkpoint may be elsewhere (another host's disk): the heartbeat's then
        committed = None
    return max((b for b in (beat, committed) if b is not None), default=None)


# a stack trace's head, an ERROR log line, a Spark error class
_ROOT_CAUSE = re.compile(r"Exception|\bERROR\b|\[[A-Z_]+(\.[A-Z_]+)*\]")
_FAILURE = re.compile(r"Error|exitCode=|Caused by|FAILED|[Ff]ailed|refused|denied|not found")
_CHATTER = re.compile(r"\b(INFO|DEBUG|TRACE|WARN)\b")  # a log line that reports, not fails
_THROWN = re.compile(r"(?:[A-Za-z_$][\w$]*\.)*([A-Z][\w$]*(?:Exception|Error)\b.*)$")  # "org.x.FooException: why"


def error_reason(error: str) -> str:
    """A failure's reason first: the line of ``error`` (often a Spark log) that says what failed, not
    the INFO lines around it: an exception or ERROR line, else one naming a failure, else the first line;
    from its exception's class name on when it names one ("UnknownTopicOrPartitionException: ...")."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    for pattern in (_ROOT_CAUSE, _FAILURE):
        telling = [line for line in lines if pattern.search(line) and not _CHATTER.search(line)]
        if telling:
            thrown = _THROWN.search(telling[0])
            return (thrown.group(1) if thrown else telling[0])[:300]
    return (lines[0] if lines else error)[:300]


def job_summary(root: Store, job: str, *, interval_s: float, specs: dict[str, Any],
                now: datetime | None = None) -> dict[str, Any]:
    """One row of the jobs view."""
    now = now or datetime.now(UTC)
    records = list_savepoints(root, job)
    completed = [r for r in records if r.state == SavepointState.COMPLETED and r.conflict is None]
    newest = completed[-1] if completed else None
    lifecycle = lifecycle_state(root, job, specs)
    state = lifecycle["state"] if lifecycle else ("not_started" if job in specs and not records else None)
    newest_age = (now - newest.created_at).total_seconds() if newest else None
    expects_savepoints = state not in ("stopped", "failed", "not_started")
    return {
        "job": job,
        "state": state,
        "lifecycle": lifecycle,
        "last_batch": (lifecycle or {}).get("last_batch"),
        "newest": newest.summary() if newest else None,
        "newest_age_s": round(newest_age, 1) if newest_age is not None else None,
        "stale": bool(expects_savepoints and newest_age is not None and newest_age > 2 * interval_s),
        "savepoints": len(records),
        "by_type": dict(Counter(r.type.value for r in records)),
        "by_state": dict(Counter(r.state.value for r in records)),
        "conflicts": sum(1 for r in records if r.conflict),
        "total_bytes": sum(r.bytes or 0 for r in records if r.state == SavepointState.COMPLETED),
    }


def overview(root: Store, *, interval_s: float, jobs_file: str | None, parallelism: int = 8) -> dict[str, Any]:
    """Every job's summary, several jobs at a time (each is a handful of reads of an object store);
    a job whose catalog cannot be read gets an error instead of failing the page."""
    now = datetime.now(UTC)
    specs = job_specs(jobs_file)

    def summary(job: str) -> dict[str, Any]:
        try:
            return job_summary(root, job, interval_s=interval_s, specs=specs, now=now)
        except SavepointError as exc:
            return {"job": job, "error": exc.to_dict()}

    names = sorted(set(list_jobs(root)) | declared_here(root, specs))
    with ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(names)))) as pool:
        jobs = list(pool.map(summary, names))
    return {"root": root.url, "checked_at": now.isoformat(), "periodic_interval_s": interval_s, "jobs": jobs}


def page_of(records: list[SavepointRecord], offset: int, limit: int | None, newest_first: bool) -> dict[str, Any]:
    ordered = list(reversed(records)) if newest_first else records
    end = None if limit is None else offset + limit
    return {"total": len(records), "offset": offset, "limit": limit,
            "order": "newest" if newest_first else "oldest",
            "savepoints": [r.summary() for r in ordered[offset:end]]}


# ---- one savepoint ------------------------------------------------------------------------------

def state_stores(manifest: SavepointManifest) -> list[dict[str, Any]]:
    """Per stateful operator: partitions, files and bytes (from the manifest's ``state/<op>/<partition>/`` files)."""
    settings = manifest.state_store
    return [{"operator": op["operator"], "partitions": op["partitions"], "files": op["files"], "bytes": op["bytes"],
             "provider": settings.provider, "format_version": settings.checkpoint_format_version}
            for op in state_files(manifest).values()]


def recorded_state(root: Store, job: str, savepoint_id: str) -> dict[str, Any] | None:
    """The state summary InspectSavepointOperator recorded beside the savepoint: rows and skew per operator
    (read without Spark); None when it was never inspected."""
    summary = read_summary(root.child(job), savepoint_id)
    if summary is None:
        return None
    return {"inspected_at": summary.inspected_at, "total_rows": summary.total_rows, "limits": summary.limits,
            "operators": [{"operator_id": op.operator_id, "name": op.name, "partitions": op.partitions, "rows": op.rows,
                           "skew": op.skew, "max_partition_rows": max(op.rows_per_partition, default=None),
                           "bytes": op.bytes, "stores": [s.state_var or s.store for s in op.stores]}
                          for op in summary.operators]}


def commands(job: str, pointer: str, checkpoint: str, savepoint_id: str) -> dict[str, str]:
    """Ready commands: restore into a fresh location beside the job's checkpoint, or start the job from it."""
    target = f"{checkpoint.rstrip('/')}-restore-{savepoint_id.rsplit('-', 1)[-1]}"
    return {
        "restore": f"airflow-savepoints restore {shlex.quote(pointer)} --to {shlex.quote(target)}",
        "start": f"airflow-savepoints job start {shlex.quote(job)} --from {shlex.quote(pointer)}",
        "verify": f"airflow-savepoints verify {shlex.quote(pointer)}",
    }


def checksums(root: Store, pointer: str, manifest: SavepointManifest, verify: bool) -> dict[str, Any]:
    """The manifest's checksums; with ``verify``, every file read again and compared (nothing is changed)."""
    sources = Counter(entry.checksum_source or "read" for entry in manifest.files)
    algorithms = sorted({entry.algorithm for entry in manifest.files}) or [manifest.checksum_algorithm]
    result: dict[str, Any] = {"algorithm": ", ".join(algorithms), "files": len(manifest.files),
                              "sources": dict(sources), "verified": None, "problem": None}
    if verify:
        try:
            verify_savepoint(pointer, root.storage_options)
            result.update(verified=True, verified_at=datetime.now(UTC).isoformat())
        except SavepointError as exc:
            result.update(verified=False, problem=exc.message)
    return result


def restore_sink(root: Store, job: str, pointer: str, manifest: SavepointManifest, jobs_file: str | None) -> dict[str, Any]:
    """What a restore of the job from this savepoint would tell of its sink, checked now as the restore checks it
    (the jobs file's ``sink:`` and the job's last committed batch): the report, or the refusal's code, message, hint."""
    from airflow_savepoints.core.restore import RestoreRequest, plan_sink
    from airflow_savepoints.jobs.workflows.lifecycle import sink_checks
    from airflow_savepoints.jobs.workflows.run import JobContext

    spec = job_specs(jobs_file).get(job) if job in declared_here(root, job_specs(jobs_file)) else None
    if spec is None:
        return {"refused": None, "kind": "unknown", "detail": f"job '{job}' is not in the jobs file: its sink is not known, "
                                                                 "so what it does with batches run again is not checked"}
    try:
        checks = sink_checks(JobContext(spec, root))
        report = plan_sink(manifest, RestoreRequest(pointer=pointer, target="", **checks))
    except SavepointError as exc:
        return {"refused": exc.to_dict(), "kind": spec.sink.kind if spec.sink else "unknown", "detail": exc.message}
    return {"refused": None, **report.model_dump(mode="json")}


def savepoint_detail(root: Store, job: str, record: SavepointRecord, manifest: SavepointManifest | None,
                     verify: bool = False, jobs_file: str | None = None) -> dict[str, Any]:
    """What the detail view shows beside the record and the manifest."""
    pick = restore_default(root, job)
    detail: dict[str, Any] = {
        "restore_pick": {"savepoint_id": pick.manifest.savepoint_id, "pointer": pick.pointer,
                         "is_this": pick.manifest.savepoint_id == record.savepoint_id} if pick else None,
    }
    if manifest is not None:
        detail.update(
            state_stores=state_stores(manifest),
            state_summary=recorded_state(root, job, record.savepoint_id),
            checksums=checksums(root, record.pointer, manifest, verify),
            commands=commands(job, record.pointer, manifest.checkpoint, record.savepoint_id),
            restore_sink=restore_sink(root, job, record.pointer, manifest, jobs_file),
        )
    return detail


# ---- a job's history ----------------------------------------------------------------------------

def job_history(root: Store, job: str) -> dict[str, Any]:
    """The job's savepoint attempts newest first (completed, failed with the reason first, disposed by
    whom and why), and the state per operator of its newest savepoint (sizes; rows where it was inspected)."""
    from airflow_savepoints.core.catalog import Catalog
    from airflow_savepoints.core.pointer import read_manifest

    entries = [{**e.as_json(), "error_reason": error_reason(e.error) if e.error else None}
               for e in reversed(Catalog(root.child(job), job).history())]
    newest = latest_savepoint(root, job)
    operators: dict[str, Any] | None = None
    if newest is not None:
        sid = newest.manifest.savepoint_id
        operators = {"savepoint_id": sid, "state_stores": state_stores(read_manifest(root.child(job).child(sid))),
                     "state_summary": recorded_state(root, job, sid)}
    return {"job": job, "total": len(entries), "history": entries, "operators": operators}


def declared_job_without_folder(root: Store, job: str, jobs_file: str | None) -> dict[str, Any] | None:
    """What to answer for a job of the jobs file that has no folder under the root yet (no savepoint
    taken): an empty answer that says so; None for any other job."""
    if root.isdir(job) or job not in declared_here(root, job_specs(jobs_file)):
        return None
    return {"job": job, "declared": True,
            "message": f"job '{job}' is declared in {jobs_file} but has no savepoint under {root.url} yet",
            "hint": "start it (restore_from_savepoint with fresh_start) or take a savepoint (periodic_savepoints)"}


# ---- a job's metrics and autoscale decisions ----------------------------------------------------------

class ChartPoint(BaseModel):
    """A point of a job's charts: one trigger, or consecutive triggers merged when the series has more than asked."""

    time: float  # epoch seconds: the last merged trigger's start
    batch_id: int  # the last merged trigger's batch
    batches: int  # the triggers merged into this point
    run_id: str | None = None
    duration_ms: float | None = None  # the longest merged batch (a slow batch is not averaged away)
    trigger_interval_ms: float | None = None  # the last known
    input_rate: float | None = None  # mean rows per second
    processed_rate: float | None = None  # mean rows per second
    backlog: int | None = None  # Kafka records, the largest
    backlog_files: int | None = None  # file sources' files not yet read, the largest
    cores: int | None = None  # the last known
    partitions: int | None = None  # the last trigger's state partitions
    state_rows: int | None = None  # the last trigger's, summed over its stateful operators
    state_memory_bytes: int | None = None  # the same, in bytes


class DecisionEntry(BaseModel):
    """A recorded autoscale decision as the console shows it (``job autoscale`` records more keys)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    at: str | None = None
    action: str | None = None
    reason: str | None = None
    outcome: str | None = None
    message: str | None = None
    mode: str | None = None
    dry_run: bool | None = None
    current: dict[str, int | None] = Field(default_factory=dict)
    target: dict[str, int | None] = Field(default_factory=dict)
    evidence: dict[str, Any] = Field(default_factory=dict)
    error: dict[str, Any] | None = None  # an action rolled back or failed: its code, message and hint


def _merged(points: list[MetricPoint]) -> ChartPoint:
    def known(values: Any) -> list[Any]:
        return [v for v in values if v is not None]

    def mean(values: Any) -> float | None:
        found = known(values)
        return sum(found) / len(found) if found else None

    def state(field: str) -> int | None:
        found = known(getattr(op, field) for op in last.operators)
        return sum(found) if found else None

    last = points[-1]
    return ChartPoint(
        time=last.time, batch_id=last.batch_id, batches=len(points), run_id=last.run_id,
        duration_ms=max(known(p.duration_ms for p in points), default=None),
        trigger_interval_ms=next(iter(known(p.trigger_interval_ms for p in reversed(points))), None),
        input_rate=mean(p.input_rate for p in points), processed_rate=mean(p.processed_rate for p in points),
        backlog=max(known(p.backlog for p in points), default=None),
        backlog_files=max(known(p.backlog_files for p in points), default=None),
        cores=next(iter(known(p.cores for p in reversed(points))), None), partitions=last.state_partitions,
        state_rows=state("rows"), state_memory_bytes=state("memory_bytes"))


def downsampled(points: list[MetricPoint], max_points: int) -> tuple[list[ChartPoint], int]:
    """``points`` (oldest first) as at most ``max_points`` chart points, and how many triggers each merges:
    runs of ``ceil(len / max_points)`` consecutive triggers."""
    size = max(1, math.ceil(len(points) / max(1, max_points)))
    return [_merged(points[i:i + size]) for i in range(0, len(points), size)], size


def job_metrics(job_folder: Store, job: str, max_points: int, max_decisions: int) -> dict[str, Any]:
    """The job's metric series for its charts (downsampled to ``max_points``) and its newest ``max_decisions``
    autoscale decisions, newest first; a file that cannot be read is an empty series or history with a warning."""
    warnings: list[str] = []
    series = read_series(job_folder, warnings)
    recorded = read_decisions(job_folder, warnings)
    where = job_folder.url_of(AUTOSCALE_FILE)
    decisions = [tolerant(DecisionEntry, item, where, warnings) for item in reversed(recorded[-max_decisions:])]
    points, merged = downsampled(series, max_points)
    return {"job": job, "total_points": len(series), "merged": merged, "points": [p.model_dump() for p in points],
            "total_decisions": len(recorded), "decisions": [d.model_dump() for d in decisions if d is not None],
            "warnings": warnings}
