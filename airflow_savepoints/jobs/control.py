"""The control channel between Airflow and a running job: a clean stop, between two batches.

The launcher gives each run a control folder (``<savepoint dir>/<job>/_control/<run>/``) and passes
its URL to the job as the Spark conf ``spark.savepoints.control``. A job that cooperates calls
:func:`run_until_stopped` instead of ``query.awaitTermination()``; it then

1. announces itself (``job.json``: application id, driver pid, query id),
2. watches for ``stop-request.json``; when one appears, waits until no trigger is active and stops
   the query (no batch in flight, so the stop savepoint is of the last committed batch, exactly),
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


def _stop_between_batches(query, timeout: float) -> bool:
    """Stop ``query`` at a moment no trigger is running; True if one was found within ``timeout``.

    With a processing-time trigger the query is idle between batches; a batch that starts in the
    instant between the check and the stop is interrupted, which Spark recovers from (its offsets
    are logged, its commit is not): the acknowledgement then reports it.
    """
    deadline = time.monotonic() + timeout
    while query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.01)
    idle = not query.status.get("isTriggerActive")
    query.stop()
    return idle


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
    while True:
        try:
            if query.awaitTermination(poll_interval):
                return
        except Exception as exc:  # the query failed: say why in the control folder, then fail as before
            control.report_failure(exc)
            raise
        request = control.stop_requested()
        if request is None:
            continue
        log.info("stop requested (%s): stopping between batches", request.get("request_id"))
        idle = _stop_between_batches(query, idle_timeout)
        progress = query.lastProgress
        control.acknowledge_stop(request, between_batches=idle,
                                 last_committed_batch=progress["batchId"] if progress else None)
        return
