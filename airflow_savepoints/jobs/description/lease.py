"""One live run per job: the run lease ``<savepoint dir>/<job>/_lease.json`` on shared storage.

The lease names the run that may write the job's sink: its token is the run id (the fencing
token), its facts the host, application id, control folder and checkpoint of that run. It is a
:class:`~airflow_savepoints.core.lease.Lease` (one implementation for every lock of the package):
taken by an atomic exclusive create whose content is complete when visible, renewed by the run's
heartbeats, and aged on the store's own clock, so a machine whose clock is minutes off still
judges it right. A lease not renewed for its run's ``timeout_s`` has lapsed: that run stopped
renewing it (dead, hung or cut off) and a new run may take it over; breaking a stale lease is
itself exclusive, so two starts never both take over the same lapsed lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airflow_savepoints.core.lease import CLOCK_SLACK, Lease, LeaseState, store_now
from airflow_savepoints.core.models import validate_job_name
from airflow_savepoints.core.names import RUN_LEASE
from airflow_savepoints.jobs.description.files import MAX_TIMEOUT_S, tolerant
from airflow_savepoints.storage import Store

LEASE_FILE = RUN_LEASE
DEFAULT_LEASE_TIMEOUT = 30.0
RELEASED = "(released)"  # what renew() reports when the lease is gone


def age_on_store_clock(folder: Store, rel: str) -> float | None:
    """Seconds since ``rel`` was last written, by the store's clock; None if it does not exist.
    Negative (how far ahead) when it is dated ahead of the store's clock, measured afresh."""
    try:
        modified = folder.stat(rel).modified
    except FileNotFoundError:
        return None
    if modified is None:
        return None
    age = store_now(folder) - modified
    if age < -CLOCK_SLACK:
        age = store_now(folder, fresh=True) - modified
    return max(0.0, age) if age >= -CLOCK_SLACK else age


class RunLeaseHolder(BaseModel):
    """What the lease says of the run holding it."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    run_id: str
    host: str | None = None
    application_id: str | None = None
    pid: int | None = Field(default=None, gt=0)
    pid_started: float | None = None  # the driver process's start time (psutil), so a reused pid is never signalled
    control: str | None = None
    runner: str | None = None
    master: str | None = None
    checkpoint: str | None = None
    driver_pod: str | None = None  # Kubernetes cluster mode
    spark_version: str | None = None  # the driver's, when it runs the in-job helper
    version: str | None = None  # the hash of the job version the run was started with
    timeout_s: float = Field(default=DEFAULT_LEASE_TIMEOUT, gt=0, le=MAX_TIMEOUT_S)
    age_s: float | None = None  # set when read: seconds since the last renewal, on the store's clock
    stale: bool = False  # judged without an age (an mtime in the store's future, seen unchanged too long)
    ahead: bool = False  # its mtime lies ahead of the store's clock: lapsed (no store writes one), and broken by a taker

    @property
    def lapsed(self) -> bool:
        return self.stale if self.age_s is None else self.age_s > self.timeout_s

    def facts(self) -> dict[str, Any]:
        return self.model_dump(exclude={"age_s", "stale", "ahead"})

    def describe(self) -> str:
        return (f"run {self.run_id} on host {self.host or 'unknown'}, application {self.application_id or 'unknown'}"
                + (f", pid {self.pid}" if self.pid else ""))

    @classmethod
    def of(cls, state: LeaseState, warnings: list[str] | None = None) -> RunLeaseHolder:
        """The holder a lease file names (facts of the wrong type dropped, with a warning); a garbage
        lease is held by run ``?`` (lapsed once old). A lease dated ahead of the store's clock is
        lapsed: a store's own clock never writes one, so it was forged or carried over."""
        facts = {k: v for k, v in state.facts.items() if k in cls.model_fields and k not in ("age_s", "stale", "ahead")}
        holder = tolerant(cls, {**facts, "run_id": state.token or "?"}, f"the run lease ({RUN_LEASE})", warnings)
        ahead = state.age_s is None and state.modified is not None
        return (holder or cls(run_id=state.token or "?")).model_copy(update={"age_s": state.age_s, "ahead": ahead,
                                                                           "stale": state.stale or ahead})


def running_spark_version(root: Store, job: str, checkpoint: str) -> str | None:
    """The Spark version the driver of the job's current run announced, if that run writes
    ``checkpoint`` (compared as given, without a trailing slash); else None. A bad job name raises
    :class:`~airflow_savepoints.errors.InvalidJobNameError`, as a savepoint of it would."""
    holder = RunLease(root.child(validate_job_name(job))).holder()
    if holder is None or not holder.checkpoint or holder.checkpoint.rstrip("/") != checkpoint.rstrip("/"):
        return None
    return holder.spark_version


class RunLease:
    """The run lease of the job whose savepoint folder is ``job_folder``."""

    def __init__(self, job_folder: Store) -> None:
        self.folder = job_folder
        self._leases: dict[str, Lease] = {}

    @classmethod
    def at(cls, lease_url: str, storage_options: dict[str, Any] | None = None) -> RunLease:
        store = Store(lease_url, storage_options)
        if store.name != LEASE_FILE:
            raise ValueError(f"{lease_url} is not a run lease ({LEASE_FILE})")
        return cls(store.parent())

    @property
    def url(self) -> str:
        return self.folder.url_of(LEASE_FILE)

    def _lease(self, run_id: str, timeout: float | None = None) -> Lease:
        lease = self._leases.get(run_id)
        if lease is None:
            lease = self._leases[run_id] = Lease(self.folder, LEASE_FILE, token=run_id,
                                                 stale_after=timeout or DEFAULT_LEASE_TIMEOUT)
        return lease

    def _state(self) -> LeaseState | None:
        return Lease(self.folder, LEASE_FILE, stale_after=DEFAULT_LEASE_TIMEOUT).read()

    def holder(self, warnings: list[str] | None = None) -> RunLeaseHolder | None:
        """The current holder with its age; None if there is no lease."""
        state = self._state()
        return None if state is None else RunLeaseHolder.of(state, warnings)

    @contextmanager
    def kept(self, run_id: str) -> Iterator[None]:
        """Renew ``run_id``'s lease in the background meanwhile (a start restoring a savepoint), so
        that it lapses within its timeout once the start itself dies, and not before."""
        lease = self._lease(run_id)
        lease.start_heartbeat()
        try:
            yield
        finally:
            lease.stop_heartbeat()

    def acquire(self, run_id: str, facts: dict[str, Any], *, may_take_over: Any = None) -> RunLeaseHolder | None:
        """Take the lease for ``run_id``. Returns None on success, else the holder that keeps it.

        A lease held by ``run_id`` already is renewed with ``facts``. A lapsed lease is taken over
        if ``may_take_over(holder)`` (default: always) agrees; one taker per lapsed lease wins."""
        timeout = float(facts.get("timeout_s") or DEFAULT_LEASE_TIMEOUT)
        lease = self._lease(run_id, timeout)
        for _ in range(3):
            current = self.holder()
            if current is not None and current.run_id != run_id and (
                    not current.lapsed or (may_take_over is not None and not may_take_over(current))):
                return current
            if current is not None and current.run_id != run_id and current.ahead and (state := self._state()) \
                    and RunLeaseHolder.of(state).ahead:
                lease._break(state)  # the lease code waits to see such a lease unchanged; a run lease lapses at once
            lease.facts = {**(current.facts() if current is not None and current.run_id == run_id else {}),
                           **facts, "run_id": run_id, "timeout_s": timeout}
            taken = lease.try_acquire(judge_by=current.timeout_s if current is not None and current.run_id != run_id
                                      else None)  # for a lease from a release that wrote no stale time
            if taken is None:
                if current is not None and current.run_id == run_id:
                    lease.renew()  # ours already: with the new facts
                return None
            if not RunLeaseHolder.of(taken).lapsed:
                return RunLeaseHolder.of(taken)
        return self.holder()

    def renew(self, run_id: str, facts: dict[str, Any]) -> RunLeaseHolder | None:
        """Renew the lease if ``run_id`` holds it, merging ``facts``. Returns None if renewed, else
        the holder now (a run that finds another holder, or none, has been fenced off)."""
        lease = self._lease(run_id)
        state = lease.read()
        if state is None:  # released by a stop or cancel that judged this run ended: it must not go on
            return RunLeaseHolder(run_id=RELEASED)
        if state.token != run_id:
            return RunLeaseHolder.of(state)
        lease.facts = {**state.facts, **facts, "run_id": run_id}
        if lease.renew():
            return None
        state = lease.read()
        return RunLeaseHolder.of(state) if state is not None else RunLeaseHolder(run_id=RELEASED)

    def release(self, run_id: str) -> bool:
        """Remove the lease if ``run_id`` holds it; True if it did."""
        return self._lease(run_id).release()
