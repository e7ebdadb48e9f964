"""Single flight per job: the lease ``<dir>/<job>/_inflight.json`` held while a savepoint is taken.

A :class:`~airflow_savepoints.core.lease.Lease` (atomic exclusive create, staleness on the store's
clock, renewed by a heartbeat). A lease not renewed for ``stale_after`` seconds belongs to a holder
that died (``kill -9``, a lost worker) and is broken by the next trigger. Its facts name the request
and the savepoint location being written, so retention keeps that location.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_savepoints.core.lease import Lease, LeaseState, owner_id
from airflow_savepoints.storage import Store

LOCK_FILE = "_inflight.json"


@dataclass(frozen=True)
class InflightHolder:
    """Who holds a job's savepoint lease, and for what."""

    token: str | None
    request_id: str | None
    savepoint_id: str | None
    owner: str | None
    started_at: float | None
    stale: bool
    age_s: float | None

    @classmethod
    def of(cls, state: LeaseState) -> InflightHolder:
        facts = state.facts

        def text(key: str) -> str | None:
            value = facts.get(key)
            return value if isinstance(value, str) else None

        started: Any = facts.get("started_at")
        return cls(token=state.token, request_id=text("request_id"), savepoint_id=text("savepoint_id"),
                   owner=state.owner or "unknown (unreadable lease)",
                   started_at=float(started) if isinstance(started, int | float) else None,
                   stale=state.stale, age_s=state.age_s)


class JobLock:
    """The lease of one job's in-flight savepoint."""

    def __init__(self, job_store: Store, *, request_id: str | None, stale_after: float = 120.0):
        self.store = job_store
        self.stale_after = stale_after
        self.lease = Lease(job_store, LOCK_FILE, stale_after=stale_after,
                           facts={"request_id": request_id, "savepoint_id": None, "started_at": time.time()})

    def current(self) -> InflightHolder | None:
        state = self.lease.read()
        return None if state is None else InflightHolder.of(state)

    @staticmethod
    def is_stale(holder: InflightHolder | None) -> bool:
        return holder is None or holder.stale

    def try_acquire(self) -> InflightHolder | None:
        """Take the lease. Returns None on success, else the live lease of the current holder."""
        holder = self.lease.try_acquire()
        if holder is not None:
            return InflightHolder.of(holder)
        self.lease.start_heartbeat()
        return None

    def set_savepoint(self, savepoint_id: str) -> None:
        self.lease.renew(savepoint_id=savepoint_id)

    def still_held(self) -> bool:
        return not self.lease.lost and self.lease.held()

    @staticmethod
    def abandon(job_store: Store, savepoint_id: str) -> bool:
        """Remove the lease if THIS process holds it for ``savepoint_id`` (a killed task's cleanup)."""
        state = Lease(job_store, LOCK_FILE, stale_after=120.0).read()
        if state is None or state.facts.get("savepoint_id") != savepoint_id or state.owner != owner_id():
            return False
        return Lease(job_store, LOCK_FILE, token=state.token, stale_after=120.0).release()

    def release(self) -> None:
        self.lease.release()
