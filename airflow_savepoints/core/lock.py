"""Single flight per job: a lease file ``<dir>/<job>/_inflight.json`` held while a savepoint is taken.

The file is created atomically (O_EXCL locally, a conditional PUT on S3) and refreshed by a heartbeat.
A lease whose heartbeat is older than ``stale_after`` seconds belongs to a holder that died
(``kill -9``, a lost worker) and may be broken by the next trigger.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from airflow_savepoints.storage import Store

LOCK_FILE = "_inflight.json"


@dataclass
class Lease:
    token: str
    request_id: str | None
    savepoint_id: str | None
    owner: str
    started_at: float
    heartbeat_at: float

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Lease | None:
        try:
            raw: dict[str, Any] = json.loads(data)
            return cls(**{k: raw.get(k) for k in cls.__dataclass_fields__})
        except (ValueError, TypeError):
            return None


class JobLock:
    """The lease of one job's in-flight savepoint."""

    def __init__(self, job_store: Store, *, request_id: str | None, stale_after: float = 120.0):
        self.store = job_store
        self.stale_after = stale_after
        now = time.time()
        self.lease = Lease(
            token=uuid.uuid4().hex, request_id=request_id, savepoint_id=None,
            owner=f"{socket.gethostname()}:{os.getpid()}", started_at=now, heartbeat_at=now,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> Lease | None:
        try:
            return Lease.from_bytes(self.store.read_bytes(LOCK_FILE))
        except FileNotFoundError:
            return None

    def is_stale(self, lease: Lease | None) -> bool:
        return lease is None or (time.time() - float(lease.heartbeat_at or 0)) > self.stale_after

    def try_acquire(self) -> Lease | None:
        """Take the lease. Returns None on success, else the live lease of the current holder."""
        for _ in range(3):
            if self.store.create_exclusive(LOCK_FILE, self.lease.to_bytes()):
                self._start_heartbeat()
                return None
            holder = self.current()
            if holder is not None and not self.is_stale(holder):
                return holder
            self.store.remove_file(LOCK_FILE)  # the holder died: break its lease
        return self.current()

    def set_savepoint(self, savepoint_id: str) -> None:
        self.lease.savepoint_id = savepoint_id
        self._refresh()

    def still_held(self) -> bool:
        holder = self.current()
        return holder is not None and holder.token == self.lease.token

    def _refresh(self) -> None:
        if self.still_held():
            self.lease.heartbeat_at = time.time()
            self.store.write_bytes_atomic(LOCK_FILE, self.lease.to_bytes())

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(max(1.0, self.stale_after / 4)):
                try:
                    self._refresh()
                except Exception:  # noqa: BLE001 - a missed heartbeat only risks a broken lease
                    pass

        self._thread = threading.Thread(target=beat, name="savepoint-lease", daemon=True)
        self._thread.start()

    @staticmethod
    def abandon(job_store: Store, savepoint_id: str) -> bool:
        """Remove the lease if THIS process holds it for ``savepoint_id`` (a killed task's cleanup)."""
        holder = JobLock(job_store, request_id=None).current()
        if holder is None or holder.savepoint_id != savepoint_id or holder.owner != f"{socket.gethostname()}:{os.getpid()}":
            return False
        job_store.remove_file(LOCK_FILE)
        return True

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.still_held():
            self.store.remove_file(LOCK_FILE)
