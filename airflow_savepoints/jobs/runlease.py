"""One live run per job: the run lease ``<savepoint dir>/<job>/_lease.json`` on shared storage.

The lease names the run that may write the job's sink (its run id is the fencing token), with the
host, application id and control folder of that run. It is created atomically (exclusive create:
one of two simultaneous starts wins) and renewed by the run's heartbeats. Its age is measured on the
store's own clock (the modification time the store gives the lease against the one it gives a probe
file written just now), so a machine whose clock is minutes off still judges it right. A lease
older than its ``timeout_s`` has lapsed: its run stopped renewing it (dead, hung or cut off) and a
new run may take it over. Taking over is itself exclusive: one marker per lapsed run id
(``_lease-takeovers/<run id>``), so two starts never both replace the same lapsed lease.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from airflow_savepoints.storage import Store

LEASE_FILE = "_lease.json"
TAKEOVER_FOLDER = "_lease-takeovers"
DEFAULT_LEASE_TIMEOUT = 30.0
RELEASED = "(released)"  # what renew() reports when the lease is gone


def store_now(folder: Store) -> float:
    """The store's clock, in epoch seconds: the modification time it gives a file written just now."""
    name = f".clock-{uuid.uuid4().hex}"
    folder.write_bytes_atomic(name, b"")
    try:
        modified = folder.stat(name).modified
    finally:
        folder.remove_file(name)
    if modified is None:  # a store that reports no times: nothing better than our own clock
        return datetime.now(UTC).timestamp()
    return modified


def age_on_store_clock(folder: Store, rel: str, now: float | None = None) -> float | None:
    """Seconds since ``rel`` was last written, by the store's clock; None if it does not exist."""
    try:
        modified = folder.stat(rel).modified
    except FileNotFoundError:
        return None
    if modified is None:
        return None
    return max(0.0, (store_now(folder) if now is None else now) - modified)


class RunLeaseHolder(BaseModel):
    """What the lease says of the run holding it."""

    model_config = ConfigDict(extra="ignore")

    run_id: str
    host: str | None = None
    application_id: str | None = None
    pid: int | None = None
    control: str | None = None
    runner: str | None = None
    master: str | None = None
    checkpoint: str | None = None
    driver_pod: str | None = None  # Kubernetes cluster mode
    timeout_s: float = DEFAULT_LEASE_TIMEOUT
    renewed_at: str | None = None
    age_s: float | None = None  # set when read: seconds since the last renewal, on the store's clock

    @property
    def lapsed(self) -> bool:
        return self.age_s is not None and self.age_s > self.timeout_s

    def facts(self) -> dict[str, Any]:
        return self.model_dump(exclude={"age_s"})

    def describe(self) -> str:
        return (f"run {self.run_id} on host {self.host or 'unknown'}, application {self.application_id or 'unknown'}"
                + (f", pid {self.pid}" if self.pid else ""))


class RunLease:
    """The run lease of the job whose savepoint folder is ``job_folder``."""

    def __init__(self, job_folder: Store) -> None:
        self.folder = job_folder

    @classmethod
    def at(cls, lease_url: str, storage_options: dict[str, Any] | None = None) -> RunLease:
        store = Store(lease_url, storage_options)
        if store.name != LEASE_FILE:
            raise ValueError(f"{lease_url} is not a run lease ({LEASE_FILE})")
        return cls(store.parent())

    @property
    def url(self) -> str:
        return self.folder.url_of(LEASE_FILE)

    def holder(self) -> RunLeaseHolder | None:
        """The current holder with its age; None if there is no lease. An unreadable lease (a torn
        or foreign file) counts as held by run ``?`` that has lapsed once its file is old enough."""
        try:
            data = self.folder.read_bytes(LEASE_FILE)
        except FileNotFoundError:
            return None
        age = age_on_store_clock(self.folder, LEASE_FILE)
        if age is None:  # removed between the read and the stat
            return None
        try:
            holder = RunLeaseHolder.model_validate(json.loads(data))
        except (ValueError, ValidationError):
            holder = RunLeaseHolder(run_id="?")
        return holder.model_copy(update={"age_s": age})

    def _encode(self, run_id: str, facts: dict[str, Any]) -> bytes:
        holder = RunLeaseHolder.model_validate({**facts, "run_id": run_id,
                                                "renewed_at": datetime.now(UTC).isoformat()})
        return holder.model_dump_json(exclude={"age_s"}).encode()

    def acquire(self, run_id: str, facts: dict[str, Any], *,
                may_take_over: Any = None) -> RunLeaseHolder | None:
        """Take the lease for ``run_id``. Returns None on success, else the holder that keeps it.

        A lease held by ``run_id`` already is renewed. A lapsed lease is taken over if
        ``may_take_over(holder)`` (default: always) agrees; one taker per lapsed run wins."""
        data = self._encode(run_id, facts)
        for _ in range(3):
            if self.folder.create_exclusive(LEASE_FILE, data):
                return None
            holder = self.holder()
            if holder is None:
                continue  # released meanwhile: try again
            if holder.run_id == run_id:
                self.folder.write_bytes_atomic(LEASE_FILE, data)
                return None
            if not holder.lapsed or (may_take_over is not None and not may_take_over(holder)):
                return holder
            generation = hashlib.sha1(f"{holder.run_id}|{holder.renewed_at}".encode()).hexdigest()[:20]
            marker = f"{TAKEOVER_FOLDER}/{generation}"
            if not self.folder.create_exclusive(marker, run_id.encode()):
                return self.holder() or holder  # another start takes this lapsed lease over
            self.folder.write_bytes_atomic(LEASE_FILE, data)
            return None
        return self.holder()

    def renew(self, run_id: str, facts: dict[str, Any]) -> RunLeaseHolder | None:
        """Renew the lease if ``run_id`` holds it. Returns None if renewed, else the holder now
        (a run that finds another holder has been fenced off and must stop writing)."""
        holder = self.holder()
        if holder is None:  # released by a stop or cancel that judged this run ended: it must not go on
            return RunLeaseHolder(run_id=RELEASED)
        if holder.run_id != run_id:
            return holder
        self.folder.write_bytes_atomic(LEASE_FILE, self._encode(run_id, {**holder.facts(), **facts}))
        return None

    def release(self, run_id: str) -> bool:
        """Remove the lease if ``run_id`` holds it; True if it did."""
        holder = self.holder()
        if holder is None or holder.run_id != run_id:
            return False
        self.folder.remove_file(LEASE_FILE)
        return True
