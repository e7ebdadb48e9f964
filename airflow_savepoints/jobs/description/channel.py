"""The control channel's files and Spark conf: what both sides of a run agree on.

Each run has a control folder (``<savepoint dir>/<job>/_control/<run id>/``) on shared storage,
named to the driver in its Spark conf (:func:`run_conf`). :class:`JobControl` reads and writes the
folder's files: the driver's announcement, heartbeats, answers and failures, and Airflow's stop
request. The driver's side of the protocol is :mod:`airflow_savepoints.jobs.driver.control`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from airflow_savepoints.core.names import (
    ANNOUNCE_FILE,
    CONTROL_FOLDER,
    FAILED_FILE,
    FENCED_FILE,
    HEARTBEAT_FILE,
    STOP_REQUEST_FILE,
    STOPPED_FILE,
)
from airflow_savepoints.jobs.description import trust
from airflow_savepoints.jobs.description.files import Heartbeat, read_json, tolerant
from airflow_savepoints.jobs.description.lease import LEASE_FILE, RunLeaseHolder
from airflow_savepoints.storage import Store

CONTROL_CONF = "spark.savepoints.control"  # the run's control folder URL
JOB_FOLDER_CONF = "spark.savepoints.jobFolder"  # <savepoint dir>/<job>: without a control folder, one is made here
RUN_ID_CONF = "spark.savepoints.runId"  # the fencing token; default: the control folder's name
LEASE_CONF = "spark.savepoints.lease"  # the run lease URL; default: _lease.json of the job folder
HEARTBEAT_CONF = "spark.savepoints.heartbeatInterval"  # seconds between heartbeats (default 5)
LEASE_TIMEOUT_CONF = "spark.savepoints.leaseTimeout"  # seconds without a heartbeat before the run counts as lost (30)
CHECKPOINT_CONF = "spark.savepoints.checkpoint"  # the run's checkpoint location, recorded in its lease
RUN_SECRET_CONF = "spark.savepoints.run.secret"  # a cluster-mode driver's channel secret (Spark redacts it by name)
CHECK_CONF = "spark.savepoints.check"  # an upgrade check's scratch folder: the run is a check (jobs/workflows/check.py)
CHECK_ENV = "SAVEPOINTS_CHECK"  # the same, for a driver on the launcher's host: the sink is swapped on import
CHECK_AFTER_CONF = "spark.savepoints.check.afterBatch"  # the restored batch: the check waits for one past it
CHECK_TIMEOUT_CONF = "spark.savepoints.check.timeout"  # seconds the driver waits for that batch
SKIP_MISSING_INPUT_CONF = "spark.savepoints.skipMissingInput"  # "true": the start accepted lost input (Kafka failOnDataLoss=false)
DEFAULT_HEARTBEAT_INTERVAL = 5.0

log = logging.getLogger(__name__)


def new_run_id() -> str:
    """A fresh run id: sortable by start time, unique, safe as a folder name."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def run_id_time(run_id: str) -> datetime | None:
    """When a run id (or a folder named by :func:`new_run_id`) was made; None for any other name."""
    try:
        return datetime.strptime(run_id.partition("-")[0], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class JobControl:
    """One run's control folder; both sides use it (Airflow writes requests, the job answers).

    Every file is sealed with the run's channel secret (:mod:`airflow_savepoints.jobs.description.trust`:
    derived from the run key, the job's name and the run id, which the folder ``<job>/_control/<run id>``
    names); what the job wrote counts only when its seal holds: a forged or foreign heartbeat, stop
    acknowledgement, failure, fencing or announcement is treated as absent, with a warning
    (``warnings``), and so is a stop request the driver did not get from a holder of the run key: a
    writer of the folder can neither stop a run nor make it look stopping."""

    def __init__(self, folder: Store, warnings: list[str] | None = None, secret: str | None = None) -> None:
        self.folder = folder
        self.warnings = warnings if warnings is not None else []
        self._secret = secret  # given to a driver on another host (RUN_SECRET_CONF); else derived

    @property
    def secret(self) -> str | None:
        if self._secret is None:
            self._secret = trust.folder_secret(self.folder.parent().parent().name, self.folder.name)
        return self._secret

    def _authentic(self, name: str, value: Any, warnings: list[str] | None = None) -> dict[str, Any] | None:
        """``value`` if it is an object sealed with the run's secret; else None, with a warning."""
        if not isinstance(value, dict):
            return None
        secret = self.secret
        if secret is not None and trust.sealed(value, secret):
            return {key: item for key, item in value.items() if key != trust.MAC_FIELD}
        text = (f"{self.folder.url_of(name)} is not sealed with run {self.folder.name}'s secret (forged, foreign, or "
                "written with another run key): ignored; where jobs run and are judged on several hosts, give each the "
                "same [savepoints] run_key (AIRFLOW__SAVEPOINTS__RUN_KEY)" if secret is not None else
                f"{self.folder.url_of(name)} cannot be checked (no run key here): ignored")
        for found in (self.warnings, warnings):
            if found is not None and text not in found:
                found.append(text)
        log.warning("%s", text)
        return None

    def _read(self, name: str) -> dict[str, Any] | None:
        """A control file through the one reader of run files (a regular file, capped, never a FIFO waited on)."""
        return self._authentic(name, read_json(self.folder, name, self.warnings))

    def _write(self, name: str, value: dict[str, Any]) -> None:
        secret = self.secret
        sealed = trust.seal(value, secret) if secret is not None else value
        self.folder.write_bytes_atomic(name, json.dumps(sealed, indent=1).encode())

    # the job's side
    def announce(self, **facts: Any) -> None:
        self._write(ANNOUNCE_FILE, {**facts, "announced_at": now_iso()})

    def stop_requested(self) -> dict[str, Any] | None:
        return self._read(STOP_REQUEST_FILE)

    def acknowledge_stop(self, request: dict[str, Any], **facts: Any) -> None:
        self._write(STOPPED_FILE, {"request_id": request.get("request_id"), **facts, "stopped_at": now_iso()})

    def report_failure(self, error: BaseException) -> None:
        self._write(FAILED_FILE, {"error": f"{type(error).__name__}: {str(error)[:2000]}", "failed_at": now_iso()})

    def beat(self, **facts: Any) -> None:
        self._write(HEARTBEAT_FILE, {**facts, "time": now_iso()})

    def heartbeat(self, warnings: list[str] | None = None) -> dict[str, Any] | None:
        """The run's last heartbeat, validated (fields of the wrong type dropped, with a warning)."""
        data = self._authentic(HEARTBEAT_FILE, read_json(self.folder, HEARTBEAT_FILE, warnings), warnings)
        beat = tolerant(Heartbeat, data, self.folder.url_of(HEARTBEAT_FILE), warnings) if data is not None else None
        return beat.model_dump(exclude_none=True) if beat is not None else None

    def report_fenced(self, holder: RunLeaseHolder | None, **facts: Any) -> None:
        self._write(FENCED_FILE, {"holder": holder.facts() if holder else None, **facts, "fenced_at": now_iso()})

    def fenced(self) -> dict[str, Any] | None:
        return self._read(FENCED_FILE)

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
        self._write(STOP_REQUEST_FILE, {"request_id": request_id, "requested_at": now_iso()})

    def wait_until_stopped(self, request_id: str, timeout: float, poll: float | None = None) -> dict[str, Any] | None:
        """The job's acknowledgement of ``request_id``, or None if none came within ``timeout`` seconds
        (read every ``poll`` seconds: by default the control folder's store's poll interval)."""
        poll = poll or self.folder.poll_interval
        deadline = time.monotonic() + timeout
        while True:
            stopped = self._read(STOPPED_FILE)
            if stopped is not None and stopped.get("request_id") == request_id:
                return stopped
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll)


def run_conf(job_folder: str, *, run_id: str | None = None, checkpoint: str | None = None,
             heartbeat_interval: float | None = None, lease_timeout: float | None = None,
             cluster: bool = False) -> dict[str, str]:
    """The Spark conf that lets a job take part: its control folder, run id and run lease.

    ``job_folder`` is ``<savepoint dir>/<job>``. Without ``run_id`` the driver makes its own (a job
    started by another tool, e.g. the Spark provider's SparkSubmitOperator, with a conf fixed at
    DAG parse time). ``cluster``: the driver runs on another host (cluster deploy mode), so the run's
    channel secret goes in the conf (:data:`RUN_SECRET_CONF`, redacted by Spark and in the run record)."""
    conf = {JOB_FOLDER_CONF: job_folder, LEASE_CONF: Store(job_folder).url_of(LEASE_FILE)}
    if run_id:
        conf[RUN_ID_CONF] = run_id
        conf[CONTROL_CONF] = Store(job_folder).child(CONTROL_FOLDER).child(run_id).url
        if cluster:
            conf[RUN_SECRET_CONF] = trust.channel_secret(Store(job_folder).name, run_id)
    if checkpoint:
        conf[CHECKPOINT_CONF] = checkpoint
    if heartbeat_interval is not None:
        conf[HEARTBEAT_CONF] = str(heartbeat_interval)
    if lease_timeout is not None:
        conf[LEASE_TIMEOUT_CONF] = str(lease_timeout)
    return conf
