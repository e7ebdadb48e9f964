"""The control channel between Airflow and a running job: a clean stop, between two batches.

The launcher gives each run a control folder (``<savepoint dir>/<job>/_control/<run>/``) and passes
its URL to the job as the Spark conf ``spark.savepoints.control``. A job that cooperates calls
:func:`run_until_stopped` instead of ``query.awaitTermination()``; it then

1. announces itself (``job.json``: application id, driver pid, query id),
2. watches for ``stop-request.json``; when one appears, lets the batch in flight commit and starts
   no other (so the stop savepoint is of the last committed batch, exactly),
3. acknowledges with ``stopped.json`` (last committed batch) and returns;
4. if the query fails, writes ``failed.json`` (the error) before failing as ``awaitTermination()`` does.

A job that does not cooperate never announces itself, and is stopped with signals instead
(crash-consistent). The channel uses the job's own credentials for the store; nothing secret is
passed on the command line.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from airflow_savepoints.storage import Store

CONTROL_CONF = "spark.savepoints.control"
ANNOUNCE_FILE = "job.json"
STOP_REQUEST_FILE = "stop-request.json"
STOPPED_FILE = "stopped.json"
FAILED_FILE = "failed.json"

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class JobControl:
    """One run's control folder; both sides use it (Airflow writes requests, the job answers)."""

    def __init__(self, folder: Store) -> None:
        self.folder = folder

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.folder.read_bytes(name))
        except FileNotFoundError:
            return None

    def _write(self, name: str, value: dict[str, Any]) -> None:
        self.folder.write_bytes_atomic(name, json.dumps(value, indent=1).encode())

    # the job's side
    def announce(self, **facts: Any) -> None:
        self._write(ANNOUNCE_FILE, {**facts, "announced_at": _now()})

    def stop_requested(self) -> dict[str, Any] | None:
        return self._read(STOP_REQUEST_FILE)

    def acknowledge_stop(self, request: dict[str, Any], **facts: Any) -> None:
        self._write(STOPPED_FILE, {"request_id": request.get("request_id"), **facts, "stopped_at": _now()})

    def report_failure(self, error: BaseException) -> None:
        self._write(FAILED_FILE, {"error": f"{type(error).__name__}: {str(error)[:2000]}", "failed_at": _now()})

    # Airflow's side
    def failure(self) -> dict[str, Any] | None:
        """What the job reported when its query failed; None if it did not (or does not cooperate)."""
        return self._read(FAILED_FILE)

    def stopped(self) -> dict[str, Any] | None:
        return self._read(STOPPED_FILE)

    def announcement(self) -> dict[str, Any] | None:
        """What the job said when it started; None if it does not cooperate (or has not started)."""
        return self._read(ANNOUNCE_FILE)

    def request_stop(self, request_id: str) -> None:
        self._write(STOP_REQUEST_FILE, {"request_id": request_id, "requested_at": _now()})

    def wait_until_stopped(self, request_id: str, timeout: float, poll: float = 0.5) -> dict[str, Any] | None:
        """The job's acknowledgement of ``request_id``, or None if none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            stopped = self._read(STOPPED_FILE)
            if stopped is not None and stopped.get("request_id") == request_id:
                return stopped
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll)


RUNNING_A_BATCH = ("Processing new data", "No new data but cleaning up state")  # Spark's status messages


class _GracefulEnd:
    """Ends a JVM query as Spark ends an ``availableNow`` one: its state is set to TERMINATED with no
    interrupt, so no further trigger starts and a batch already executing runs to its commit.

    Spark 4 interrupts a batch itself when it finds the query terminated at the end of the batch's
    planning (after its offsets were logged), so the moment is chosen: see :func:`_safe_moment`.
    Raises where the internals differ (Spark Connect, another Spark): the caller falls back.
    """

    def __init__(self, query) -> None:
        execution = query._jsq.streamingQuery()
        self.state = execution.state()
        active = self.state.get()
        if active.toString() != "ACTIVE":
            raise RuntimeError(f"query is {active.toString()}")
        package = active.getClass().getName().rsplit(".", 1)[0]
        self.terminated = active.getClass().forName(f"{package}.TERMINATED$").getField("MODULE$").get(None)
        trigger = execution.trigger()
        self.interval_ms = int(trigger.intervalMs()) if trigger.getClass().getSimpleName() == "ProcessingTimeTrigger" else None
        self.tracker = execution.sparkSession().sparkContext().statusTracker()
        self.job_group = str(query.runId)  # Spark runs a query's jobs in a job group named by its run id

    def jobs_running(self) -> bool:
        """A Spark job of the query runs: its batch executes (planning launches none for most sources)."""
        active = set(self.tracker.getActiveJobIds())
        return bool(active) and any(job in active for job in self.tracker.getJobIdsForGroup(self.job_group))

    def end(self) -> bool:
        active = self.state.get()
        return active.toString() == "ACTIVE" and bool(self.state.compareAndSet(active, self.terminated))


def _progress_mark(query) -> tuple | None:
    progress = query.lastProgress
    return (progress["batchId"], progress["timestamp"]) if progress else None


def _planning_allowance(query) -> float:
    """Seconds after a batch is first seen running by which its planning is surely over: twice the
    longest that the last 5 batches took to get their data and plan, plus 100 ms (0.5 s with no history)."""
    durations = [p.get("durationMs") or {} for p in query.recentProgress]
    planned = [d.get("getBatch", 0) + d["queryPlanning"] for d in durations if "queryPlanning" in d][-5:]
    return 2 * max(planned) / 1000 + 0.1 if planned else 0.5


def _safe_moment(query, interval_ms: int | None, jobs_running: Callable[[], bool] | None, seen_running: dict) -> bool:
    """True at a moment when ending ``query`` cuts no batch short.

    Waiting: idle twice, 20 ms apart, with no batch finished in between (not merely passing between
    two batches that run back to back), and, for a processing-time trigger, which fires at the next
    multiple of its interval since the epoch, that trigger far enough away. Executing (only where
    ``jobs_running`` can tell): a batch seen running for longer than its planning takes, with a
    Spark job of the query running, so it commits however it ends. ``seen_running`` holds, for
    each batch seen running, when it is past planning.
    """
    mark = _progress_mark(query)
    status = query.status
    if status.get("isTriggerActive"):
        if jobs_running is None or status.get("message") not in RUNNING_A_BATCH:
            time.sleep(0.002)  # reading or logging offsets, or a batch that only a stop could cut
            return False
        if mark not in seen_running:
            seen_running[mark] = time.monotonic() + _planning_allowance(query)
        if time.monotonic() < seen_running[mark] or not jobs_running():
            time.sleep(0.005)
            return False
        return _progress_mark(query) == mark and bool(query.status.get("isTriggerActive"))
    time.sleep(0.02)
    if query.status.get("isTriggerActive") or _progress_mark(query) != mark:
        return False
    if interval_ms:
        left_ms = interval_ms - (time.time() * 1000) % interval_ms
        if left_ms < min(0.4 * interval_ms, 250):
            time.sleep((left_ms + 10) / 1000)
            return False
    return True


def _stop_between_batches(query, timeout: float) -> bool:
    """Stop ``query`` with no batch cut short; True if a safe moment came within ``timeout`` seconds.

    A JVM query is ended gracefully (:class:`_GracefulEnd`) while it waits for its next trigger or
    while a batch executes, and waited for; any other query is stopped while it waits. At
    ``timeout`` it is stopped regardless: a batch cut short keeps its logged offsets, and Spark,
    like a restore of the savepoint, re-runs it with the same offsets.
    """
    deadline = time.monotonic() + timeout
    try:
        graceful = _GracefulEnd(query)
    except Exception:  # noqa: BLE001 - Spark Connect or other internals: stop while it waits
        graceful = None
    interval_ms = graceful.interval_ms if graceful else None
    seen_running: dict = {}
    safe = False
    while not safe and time.monotonic() < deadline:
        safe = _safe_moment(query, interval_ms, graceful.jobs_running if graceful else None, seen_running)
    if safe and graceful is not None:
        safe = graceful.end() and bool(query.awaitTermination(max(deadline - time.monotonic(), 1)))
    query.stop()  # no-op after a graceful end; else interrupts whatever runs
    return safe


def run_until_stopped(query, spark=None, *, poll_interval: float = 0.5, idle_timeout: float = 600) -> None:
    """Wait for ``query`` like ``awaitTermination()``, but stop it cleanly when Airflow asks.

    Without a control folder (the job was not started by airflow-savepoints) this is exactly
    ``query.awaitTermination()``. A failed query raises as ``awaitTermination()`` does.
    """
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.active()
    url = spark.conf.get(CONTROL_CONF, None)
    if not url:
        query.awaitTermination()
        return
    control = JobControl(Store(url))
    control.announce(application_id=spark.sparkContext.applicationId, pid=os.getpid(), host=socket.gethostname(),
                     query_id=str(query.id), run_id=str(query.runId), query_name=query.name)
    request = None
    while request is None:
        with _failure_reported(control):
            if query.awaitTermination(poll_interval):
                return
        request = control.stop_requested()
    log.info("stop requested (%s): stopping between batches", request.get("request_id"))
    with _failure_reported(control):
        idle = _stop_between_batches(query, idle_timeout)
    progress = query.lastProgress
    control.acknowledge_stop(request, between_batches=idle,
                             last_committed_batch=progress["batchId"] if progress else None)


@contextmanager
def _failure_reported(control: JobControl) -> Iterator[None]:
    """A query that fails inside says why in the control folder, then fails as before."""
    try:
        yield
    except Exception as exc:
        control.report_failure(exc)
        raise
