"""A job's metric series and its autoscaler's decision history: two bounded files in the job's folder.

``<savepoint dir>/<job>/_metrics.json`` holds the last :data:`DEFAULT_KEEP` batches' progress as
the in-job helper saw it (:mod:`airflow_savepoints.jobs.driver.control` records each new batch of
``query.lastProgress``), one :class:`MetricPoint` each: the batch's duration and trigger interval,
its input and processed rows per second, the cores the application had, its state rows, memory and
partitions, the Kafka backlog when the progress gives the sources' latest offsets (records), and the file
sources' backlog the helper counts (files not yet read, :mod:`airflow_savepoints.jobs.driver.file_backlog`).
``_autoscale.json`` holds the last :data:`DECISIONS_KEPT` decisions of the autoscaler
(:mod:`airflow_savepoints.jobs.workflows.autoscale`).

Both are written whole and atomically (one writer at a time: the run holding the run lease writes
the series, the autoscaler its history), and read by anyone from any host through the one reader
of run files (a regular file, capped at 1 MiB). A missing file is an empty series; a garbled one
is an empty series with a warning; a point of the wrong shape is dropped with a warning. Nothing
here ever fails a run or a command.
"""

from __future__ import annotations

import json
import logging
import math
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airflow_savepoints.core.lease import Lease
from airflow_savepoints.core.names import AUTOSCALE_FILE, AUTOSCALE_LOCK, METRICS_FILE
from airflow_savepoints.jobs.description.files import read_json
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

SERIES_VERSION = 1
DEFAULT_KEEP = 720  # points: an hour of 5 s batches; about 250 bytes each, well under the run files' 1 MiB cap
DECISIONS_KEPT = 200
HISTORY_LOCK_STALE_AFTER = 10.0  # seconds: the history's lock is held for one read and one write
HISTORY_LOCK_TIMEOUT = 30.0  # seconds a decision waits for it (a dead holder's is broken after the stale time)
MAX_SERIES_BYTES = 768 * 1024  # below the 1 MiB every reader of run files reads at most (storage/known_files.py)


class OperatorPoint(BaseModel):
    """One stateful operator's state after a batch (``stateOperators[i]`` of the progress)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    name: str | None = None  # operatorName (Spark 3.4+)
    rows: int | None = Field(default=None, ge=0)  # numRowsTotal
    memory_bytes: int | None = Field(default=None, ge=0)  # memoryUsedBytes
    partitions: int | None = Field(default=None, ge=1)  # numShufflePartitions (Spark 3.4+): the state partitions


class MetricPoint(BaseModel):
    """One trigger of the query, as its progress reported it."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    batch_id: int = Field(ge=0)
    time: float  # the trigger's start, epoch seconds (the progress's ``timestamp``, the driver's clock)
    run_id: str | None = None
    idle: bool = False  # a trigger that ran no batch (no new data): Spark reports one every 10 s by default
    duration_ms: float | None = Field(default=None, ge=0)  # durationMs.triggerExecution
    trigger_interval_ms: float | None = Field(default=None, gt=0)  # a processing-time trigger's; None: back to back
    input_rows: int | None = Field(default=None, ge=0)  # numInputRows
    input_rate: float | None = Field(default=None, ge=0)  # inputRowsPerSecond
    processed_rate: float | None = Field(default=None, ge=0)  # processedRowsPerSecond
    cores: int | None = Field(default=None, ge=1)  # the application's task slots (defaultParallelism)
    executors: int | None = Field(default=None, ge=0)
    operators: list[OperatorPoint] = Field(default_factory=list)
    backlog: int | None = Field(default=None, ge=0)  # Kafka: latest minus end offsets, summed; else None
    backlog_files: int | None = Field(default=None, ge=0)  # file sources: files not yet read (the in-job helper's count)
    files_read: int | None = Field(default=None, ge=0)  # file sources: the files this batch read

    @property
    def utilization(self) -> float | None:
        """The batch's duration over its trigger interval (1.0 and more: it cannot keep up); without an
        interval (back-to-back batches), input over processed rate. None when neither is known."""
        if self.idle:
            return 0.0
        if self.duration_ms is not None and self.trigger_interval_ms:
            return self.duration_ms / self.trigger_interval_ms
        if self.input_rate is not None and self.processed_rate:
            return self.input_rate / self.processed_rate
        return None

    @property
    def state_partitions(self) -> int | None:
        found = [op.partitions for op in self.operators if op.partitions]
        return max(found) if found else None

    @property
    def stateful(self) -> bool:
        return bool(self.operators)


def _epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _offsets(value: Any) -> dict[tuple[str, str], int] | None:
    """A Kafka offset JSON (``{"topic": {"0": 12}}``, or its text) as (topic, partition) -> offset; None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict) or not value:
        return None
    found: dict[tuple[str, str], int] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            return None
        for partition, offset in partitions.items():
            if not isinstance(offset, int) or isinstance(offset, bool):
                return None
            found[str(topic), str(partition)] = offset
    return found


def backlog_of(sources: Any) -> int | None:
    """The records not yet read, summed over the sources whose progress gives both their ``latestOffset``
    and ``endOffset`` as Kafka offsets (per topic and partition); None when no source gives them."""
    total, known = 0, False
    for source in sources if isinstance(sources, list) else []:
        if not isinstance(source, dict):
            continue
        latest, end = _offsets(source.get("latestOffset")), _offsets(source.get("endOffset"))
        if latest is None or end is None:
            continue
        known = True
        total += sum(max(offset - end.get(key, offset), 0) for key, offset in latest.items())
    return total if known else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def point_of(progress: Any, *, trigger_interval_ms: float | None = None, cores: int | None = None,
             executors: int | None = None, run_id: str | None = None) -> MetricPoint | None:
    """The point of one ``query.lastProgress`` (a dict); None for anything that is not a batch's progress."""
    if not isinstance(progress, dict) or not isinstance(progress.get("batchId"), int):
        return None
    when = _epoch(progress.get("timestamp"))
    if when is None or progress["batchId"] < 0:
        return None
    durations = progress.get("durationMs") if isinstance(progress.get("durationMs"), dict) else {}
    operators = []
    for op in progress.get("stateOperators") or []:
        if isinstance(op, dict):
            operators.append(OperatorPoint.model_validate({
                "name": op.get("operatorName") if isinstance(op.get("operatorName"), str) else None,
                "rows": op.get("numRowsTotal") if _number(op.get("numRowsTotal")) is not None else None,
                "memory_bytes": op.get("memoryUsedBytes") if _number(op.get("memoryUsedBytes")) is not None else None,
                "partitions": op.get("numShufflePartitions") if isinstance(op.get("numShufflePartitions"), int)
                and op["numShufflePartitions"] > 0 else None}))
    rows = progress.get("numInputRows")
    try:
        return MetricPoint(
            batch_id=progress["batchId"], time=when, run_id=run_id, idle="addBatch" not in durations and not rows,
            duration_ms=_number(durations.get("triggerExecution")), trigger_interval_ms=trigger_interval_ms or None,
            input_rows=rows if isinstance(rows, int) and rows >= 0 else None,
            input_rate=_number(progress.get("inputRowsPerSecond")),
            processed_rate=_number(progress.get("processedRowsPerSecond")),
            cores=cores if cores and cores > 0 else None, executors=executors, operators=operators,
            backlog=backlog_of(progress.get("sources")))
    except ValidationError as exc:
        log.warning("a batch's progress made no metric point (%s): skipped", exc.errors()[0].get("msg"))
        return None


def _items(store: Store, name: str, key: str, warnings: list[str] | None) -> list[Any]:
    """The list under ``key`` in ``name``; [] when the file is absent, garbled or of another shape (with a warning)."""
    try:
        data = read_json(store, name, warnings)
    except Exception as exc:  # noqa: BLE001 - an unreachable store reads as no series; the caller says so
        text = f"{store.url_of(name)} could not be read ({type(exc).__name__}: {exc}): treated as empty"
        log.warning("%s", text)
        if warnings is not None:
            warnings.append(text)
        return []
    if data is None:
        return []
    items = data.get(key)
    if not isinstance(items, list):
        text = f"{store.url_of(name)} has no '{key}' list (damaged or foreign): treated as empty"
        log.warning("%s", text)
        if warnings is not None:
            warnings.append(text)
        return []
    return items


def read_series(job_folder: Store, warnings: list[str] | None = None) -> list[MetricPoint]:
    """The job's metric points, oldest first; points of the wrong shape are dropped (one warning)."""
    points, dropped = [], 0
    for item in _items(job_folder, METRICS_FILE, "points", warnings):
        try:
            points.append(MetricPoint.model_validate(item))
        except ValidationError:
            dropped += 1
    if dropped:
        text = f"{job_folder.url_of(METRICS_FILE)}: {dropped} point(s) of the wrong shape ignored"
        log.warning("%s", text)
        if warnings is not None:
            warnings.append(text)
    return sorted(points, key=lambda p: (p.time, p.batch_id))


def trimmed(points: list[MetricPoint], keep: int = DEFAULT_KEEP) -> list[MetricPoint]:
    """The last ``keep`` points by time, each trigger once (a point seen again replaces the earlier copy)."""
    unique = {(p.run_id, p.batch_id, p.time): p for p in points}
    return sorted(unique.values(), key=lambda p: (p.time, p.batch_id))[-keep:] if keep > 0 else []


def _encoded(points: list[MetricPoint]) -> bytes:
    body = {"version": SERIES_VERSION, "points": [p.model_dump(exclude_defaults=True) for p in points]}
    return json.dumps(body, separators=(",", ":")).encode()


def write_series(job_folder: Store, points: list[MetricPoint], keep: int = DEFAULT_KEEP,
                 max_bytes: int = MAX_SERIES_BYTES) -> list[MetricPoint]:
    """Write ``points`` (the last ``keep``, and fewer when they would take more than ``max_bytes``: a query
    with many stateful operators) atomically; returns what was written."""
    kept = trimmed(points, keep)
    data = _encoded(kept)
    while len(data) > max_bytes and kept:
        kept = kept[max(1, len(kept) // 10):]  # the oldest tenth goes
        data = _encoded(kept)
    job_folder.write_bytes_atomic(METRICS_FILE, data)
    return kept


def append_points(job_folder: Store, new: list[MetricPoint], keep: int = DEFAULT_KEEP,
                  warnings: list[str] | None = None) -> list[MetricPoint]:
    """Read the series, add ``new``, keep the last ``keep`` points and write it back (one writer at a time)."""
    return write_series(job_folder, read_series(job_folder, warnings) + list(new), keep)


def read_decisions(job_folder: Store, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The autoscaler's recorded decisions, oldest first (objects only; anything else dropped)."""
    return [item for item in _items(job_folder, AUTOSCALE_FILE, "decisions", warnings) if isinstance(item, dict)]


def append_decision(job_folder: Store, record: dict[str, Any], keep: int = DECISIONS_KEPT,
                    warnings: list[str] | None = None, lock_timeout: float = HISTORY_LOCK_TIMEOUT) -> list[dict[str, Any]]:
    """Add ``record`` to the decision history, keep the last ``keep``, write it atomically; under the history's
    short lock (``_autoscale.lock``), so that two autoscalers deciding at once (one acting, one holding) never
    lose each other's record. A lock not had within ``lock_timeout`` seconds: written anyway, with a warning."""
    lock = Lease(job_folder, AUTOSCALE_LOCK, stale_after=HISTORY_LOCK_STALE_AFTER)
    holder = lock.acquire(lock_timeout, poll=0.05)
    if holder is not None:
        text = f"{job_folder.url_of(AUTOSCALE_LOCK)} stayed held ({holder.owner}): the decision is recorded without it"
        log.warning("%s", text)
        if warnings is not None:
            warnings.append(text)
    try:
        decisions = (read_decisions(job_folder, warnings) + [record])[-keep:]
        job_folder.write_bytes_atomic(AUTOSCALE_FILE, json.dumps({"version": 1, "decisions": decisions}, indent=1,
                                                                 default=str).encode())
    finally:
        if holder is None:
            lock.release()
    return decisions
