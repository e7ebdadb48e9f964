"""A lease file in a store: one holder at a time, broken when its holder stops renewing it.

One implementation serves every lock of the package: the single-flight lease of a job's savepoint
(``_inflight.json``, :class:`JobLock` below), the catalog lock (``_catalog.lock``), a restore's
claim on its target and the run lease of a job (``jobs/description/lease.py``). Every holder is named the
same way (:func:`owner_id`).

- Taking it is one atomic exclusive create whose content is complete the moment the file becomes
  visible (:meth:`Store.create_exclusive`: a hard link of a written temp file locally, a PUT with
  ``If-None-Match: *`` on S3). A reader never sees a half-written lease.
- Staleness is judged on the STORE's clock: the store's modification time of the lease against
  the store's "now" (the modification time of a probe file written there, extrapolated with the
  local monotonic clock for a while). The local wall clock is never used, so a skewed worker can
  neither break a live lease nor keep a dead one. Renewing rewrites the lease (a new mtime).
- A lease says how long it lives: its holder writes its ``stale_after`` into it (its heartbeat
  beats at a quarter of that), and every reader judges it by that time, not by its own. A lease
  without one (an older release's, garbage) or with an unusable one is judged by the reader's.
- A lease whose mtime lies in the future (a clock that jumped, a ``touch``) has no usable age: it
  is stale once this process has seen it unchanged for its stale time. A lease whose
  content is garbage (``[]``, ``null``, a bad number, empty) is judged by its mtime like any other;
  neither ever raises.
- Breaking a stale lease happens under a short second lease ``<name>.break``: the breaker re-reads
  the lease and removes it only if it is still exactly the stale one it judged (same bytes, same
  mtime), so two breakers never remove a fresh lease that someone took in between. A late renewal
  or release (more than ``stale_after / 2`` after the last write) goes through the same lock.
- The content carries a fencing token (the caller's, e.g. a run id, or a random one), the owner
  (``host:pid``) and free-form facts the holder can update when it renews.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_savepoints.core.names import CLOCK_PROBE_PREFIX, INFLIGHT_LEASE, LEASE_BREAK_SUFFIX
from airflow_savepoints.errors import SavepointError, UnsafeFileError
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

LEASE_FORMAT = "airflow-savepoints/lease"
BREAK_SUFFIX = LEASE_BREAK_SUFFIX
LOCK_FILE = INFLIGHT_LEASE
BREAK_STALE_AFTER = 10.0  # seconds: a break lock is held for one read and one delete
CLOCK_SLACK = 2.0  # seconds: mtime resolution (1 s on S3) and the probe's own delay
CLOCK_PROBE_TTL = 30.0  # seconds a measured store clock is extrapolated before it is probed again
UNSAFE = b"\0unsafe"  # the content a lease file that is no plain small file is read as (never valid JSON)
MAX_DECLARED_STALE_AFTER = 86400.0  # seconds: a longer stale time written in a lease is not believed
_ABANDONED: set[str] = set()  # tokens of leases this process removed for their holder (``JobLock.abandon``)

_clock_cache: dict[tuple[str, str], tuple[float, float]] = {}  # (protocol, folder) -> (store time, monotonic)
_clock_lock = threading.Lock()


def owner_id() -> str:
    """This process, as lease owners are named: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def store_now(store: Store, *, fresh: bool = False) -> float:
    """The store's current time (epoch seconds): the mtime of a probe file written into ``store``'s
    folder, extrapolated with the local monotonic clock for up to ``CLOCK_PROBE_TTL`` seconds."""
    key = (store.protocol, store.root)
    with _clock_lock:
        cached = _clock_cache.get(key)
    if cached is not None and not fresh and time.monotonic() - cached[1] < CLOCK_PROBE_TTL:
        return cached[0] + (time.monotonic() - cached[1])
    probe = f"{CLOCK_PROBE_PREFIX}{uuid.uuid4().hex}.tmp"
    before = time.monotonic()
    store.touch(probe)  # one plain write: no temp file of its own
    try:
        modified = store.stat(probe).modified
    finally:
        try:
            store.remove_file(probe)
        except (OSError, SavepointError):  # retention removes a probe left behind
            pass
    if modified is None:  # a store that reports no times: nothing better than our own clock
        modified = time.time()
    with _clock_lock:
        _clock_cache[key] = (modified, before)
    return modified + (time.monotonic() - before)


@dataclass(frozen=True)
class LeaseState:
    """What a lease file says, judged on the store's clock.

    ``token``/``owner`` are None and ``facts`` empty when the content is unreadable (``readable``
    False); ``age_s`` is None when the lease's mtime lies in the future of the store's clock."""

    token: str | None
    owner: str | None
    facts: dict[str, Any]
    age_s: float | None
    stale: bool
    readable: bool
    modified: float | None = None
    stale_after: float | None = None  # the time it was judged by: the holder's, else the reader's
    identity: tuple[bytes, float | None] = field(default=(b"", None), repr=False, compare=False)


def _parse(raw: bytes) -> tuple[str | None, str | None, dict[str, Any], bool, float | None]:
    """(token, owner, facts, readable, the holder's stale time) of a lease's bytes; never raises."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, None, {}, False, None
    if not isinstance(body, dict):
        return None, None, {}, False, None
    token, owner = body.get("token"), body.get("owner")
    facts = body.get("facts")
    if not isinstance(facts, dict):  # an older lease file: its other keys are its facts
        facts = {k: v for k, v in body.items()
                 if k not in ("token", "owner", "format", "nonce", "written_at", "stale_after")}
    declared = body.get("stale_after")
    usable = isinstance(declared, int | float) and not isinstance(declared, bool) and \
        0 < declared <= MAX_DECLARED_STALE_AFTER  # NaN fails the comparison too
    return (token if isinstance(token, str) else None, owner if isinstance(owner, str) else None, facts,
            isinstance(token, str), float(declared) if usable else None)


class Lease:
    """The lease ``name`` in ``store`` (a file directly in the store's folder).

    ``try_acquire()`` returns None when this object now holds the lease, else the live holder's
    :class:`LeaseState`. ``renew(**facts)`` rewrites it (False once it is gone or another token
    holds it); ``release()`` removes it if it is still ours; ``read()`` says who holds it.
    """

    def __init__(self, store: Store, name: str, *, token: str | None = None, stale_after: float,
                 facts: dict[str, Any] | None = None):
        if stale_after <= 0:
            raise ValueError("stale_after must be positive")
        self.store, self.name, self.stale_after = store, name, float(stale_after)
        self.token = token or uuid.uuid4().hex
        self.owner = owner_id()
        self.facts: dict[str, Any] = dict(facts or {})
        self._written_at: float | None = None  # monotonic time of our last write of the lease
        self._seen: dict[str, tuple[tuple[bytes, float | None], float]] = {}  # name -> (identity, first seen)
        self._io = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False  # set once a renewal or a read finds the lease we took gone or taken over

    @property
    def written(self) -> bool:
        """Whether this object has taken the lease (and not released it)."""
        return self._written_at is not None

    # --- reading ------------------------------------------------------------------------------------
    def read(self) -> LeaseState | None:
        """The lease as it is now; None if there is none."""
        return self._state_of(self.name, self.stale_after)

    def held(self) -> bool:
        """Whether the lease file carries our token (one read; its age does not matter to its holder). Once a
        lease we took is read gone or another's, it is ``lost``: no later release trusts our last write."""
        try:
            ours = _parse(self.store.read_known(self.name, "lease"))[0] == self.token
        except (FileNotFoundError, UnsafeFileError):
            ours = False
        if not ours and self._written_at is not None:
            self.lost = True
        return ours

    def _raw(self, name: str) -> tuple[bytes, float | None] | None:
        try:
            return self.store.read_known_stamped(name, "lease")  # one request on S3
        except FileNotFoundError:
            return None
        except UnsafeFileError as exc:  # a folder, FIFO, link or oversize file: no lease of ours, and lapsed
            log.warning("%s: taken as a lapsed lease", exc)
            return UNSAFE, 0.0  # modified at the epoch: stale by any clock

    def _state_of(self, name: str, stale_after: float) -> LeaseState | None:
        raw = self._raw(name)
        if raw is None:
            self._seen.pop(name, None)
            return None
        data, modified = raw
        token, owner, facts, readable, declared = _parse(data)
        stale_after = declared or stale_after
        age: float | None = None
        if modified is not None:
            now = store_now(self.store)
            if modified > now + CLOCK_SLACK:
                now = store_now(self.store, fresh=True)  # the cached clock may be behind: measure again
            if modified <= now + CLOCK_SLACK:
                age = max(0.0, now - modified)
        if age is not None:
            self._seen.pop(name, None)
            stale = age > stale_after
        else:  # from the future, or no time at all: stale once seen unchanged for stale_after seconds
            seen = self._seen.get(name)
            if seen is None or seen[0] != raw:
                self._seen[name] = seen = (raw, time.monotonic())
            stale = time.monotonic() - seen[1] > stale_after
        return LeaseState(token=token, owner=owner, facts=facts, age_s=age, stale=stale, readable=readable,
                          modified=modified, stale_after=stale_after, identity=raw)

    # --- taking and giving back ---------------------------------------------------------------------
    def _body(self) -> bytes:
        return json.dumps({"format": LEASE_FORMAT, "token": self.token, "owner": self.owner, "facts": self.facts,
                           "stale_after": self.stale_after, "nonce": uuid.uuid4().hex, "written_at": time.time()},
                          sort_keys=True, default=str).encode()

    def try_acquire(self, judge_by: float | None = None) -> LeaseState | None:
        """Take the lease: None if this object holds it now, else the current holder's state.

        A stale lease is broken first (under the break lock); one that declares no stale time is
        judged by ``judge_by`` (default: ours). Never raises for a garbage lease."""
        with self._io:
            for _ in range(3):
                if self.store.create_exclusive(self.name, self._body()):
                    self._written_at = time.monotonic()
                    self.lost = False
                    return None
                holder = self._state_of(self.name, judge_by or self.stale_after)
                if holder is None:
                    continue  # released meanwhile: try again
                if holder.token == self.token:  # ours (e.g. a retried create): keep it
                    self._written_at = time.monotonic()
                    return None
                if not holder.stale:
                    return holder
                if not self._break(holder):
                    return holder
            # the lease came and went under us three times: busy (never None: None means "ours")
            return self.read() or LeaseState(token=None, owner=None, facts={}, age_s=0.0, stale=False, readable=False)

    def acquire(self, timeout: float, poll: float = 0.2) -> LeaseState | None:
        """``try_acquire`` until it succeeds or ``timeout`` seconds pass; the last holder on failure."""
        deadline = time.monotonic() + timeout
        while True:
            holder = self.try_acquire()
            if holder is None or time.monotonic() >= deadline:
                return holder
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    def renew(self, **facts: Any) -> bool:
        """Rewrite the lease (a new mtime on the store), merging ``facts`` into its facts.

        False, without writing, once the lease is gone or another token holds it."""
        with self._io:
            self.facts.update(facts)
            return self._while_ours(lambda: self.store.write_bytes_atomic(self.name, self._body()))

    def release(self) -> bool:
        """Stop the heartbeat and remove the lease if it is still ours. True if removed."""
        self.stop_heartbeat()
        with self._io:
            removed = self._while_ours(lambda: self.store.remove_file(self.name), removing=True)
            self._written_at = None
            return removed

    @property
    def recent(self) -> bool:
        """Whether our last write of the lease is less than ``stale_after / 2`` old on our clock: so recent
        that no reader can have judged it stale (its age is counted on the store's clock from a moment
        inside our write), so no breaker can have removed it; nor has this process, for us (``JobLock.abandon``),
        and no renewal has found it taken over (``lost``)."""
        return self._written_at is not None and time.monotonic() - self._written_at < self.stale_after / 2 \
            and not self.lost and self.token not in _ABANDONED

    def _while_ours(self, action: Callable[[], None], removing: bool = False) -> bool:
        """Run ``action`` if the lease is ours. Unless our last write is ``recent``, under the break lock,
        so that no breaker acts on it meanwhile. A recent lease is removed without reading it first: it
        can be no one else's."""
        if self.recent:
            if not removing and not self.held():
                return False
            action()
            if not removing:
                self._written_at = time.monotonic()
            return True
        with self._break_lock() as locked:
            if not locked or not self.held():
                return False
            action()
            if not removing:
                self._written_at = time.monotonic()
            return True

    # --- breaking -----------------------------------------------------------------------------------
    def _break(self, judged: LeaseState) -> bool:
        """Remove the stale lease ``judged`` if it is still exactly that lease. True if removed."""
        with self._break_lock() as locked:
            if not locked:
                return False
            now = self._raw(self.name)
            if now is None:
                return True
            if now != judged.identity:
                return False  # renewed, or replaced by a fresh lease: not ours to break
            log.warning("breaking the stale lease %s (owner %s, %s)", self.store.url_of(self.name), judged.owner,
                        "age unknown" if judged.age_s is None else f"{judged.age_s:.0f}s old")
            if now == (UNSAFE, 0.0) and self.store.isdir(self.name) and self.store.symlink_target(self.name) is None:
                self.store.remove_tree(self.name)  # a folder in its place never wedges the job
            else:
                self.store.remove_file(self.name)
            return True

    def _break_lock(self) -> _BreakLock:
        return _BreakLock(self)

    # --- heartbeat ----------------------------------------------------------------------------------
    def start_heartbeat(self, interval: float | None = None, on_lost: Callable[[], None] | None = None) -> None:
        """Renew in a daemon thread every ``interval`` seconds (default ``stale_after / 4``); when a
        renewal finds the lease taken over, set ``lost``, call ``on_lost`` and stop."""
        every = interval if interval is not None else max(0.05, self.stale_after / 4)
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(every):
                try:
                    still = self.renew()
                except Exception:  # noqa: BLE001 - a missed heartbeat only risks a broken lease
                    continue
                if not still:
                    self.lost = True
                    if on_lost is not None:
                        on_lost()
                    return

        self._thread = threading.Thread(target=beat, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)


class _BreakLock:
    """``<name>.break``: held for the moment a lease is checked and removed or rewritten."""

    def __init__(self, lease: Lease, wait: float = 2.0):
        self.lease, self.wait = lease, wait
        self.name = lease.name + BREAK_SUFFIX
        self.body = json.dumps({"token": uuid.uuid4().hex, "owner": owner_id()}).encode()
        self.held = False

    def __enter__(self) -> bool:
        store, deadline = self.lease.store, time.monotonic() + self.wait
        while True:
            if store.create_exclusive(self.name, self.body):
                self.held = True
                return True
            state = self.lease._state_of(self.name, BREAK_STALE_AFTER)
            if state is not None and state.stale:
                log.warning("removing the stale break lock %s", store.url_of(self.name))
                store.remove_file(self.name)
                continue
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def __exit__(self, *exc_info) -> None:
        if self.held:
            self.lease.store.remove_file(self.name)


# --- the single-flight lease of a job's savepoint -------------------------------------------------------
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
    """Single flight per job: the lease ``<dir>/<job>/_inflight.json`` held while a savepoint is taken.

    Renewed by a heartbeat; one not renewed for ``stale_after`` seconds belongs to a holder that
    died (``kill -9``, a lost worker) and is broken by the next trigger. Its facts name the request
    and the savepoint location being written, so retention keeps that location."""

    def __init__(self, job_store: Store, *, request_id: str | None, stale_after: float = 120.0):
        self.store = job_store
        self.stale_after = stale_after
        self.lease = Lease(job_store, LOCK_FILE, stale_after=stale_after,
                           facts={"request_id": request_id, "savepoint_id": None, "started_at": time.time()})
        self._released = False

    def current(self) -> InflightHolder | None:
        state = self.lease.read()
        return None if state is None else InflightHolder.of(state)

    @staticmethod
    def is_stale(holder: InflightHolder | None) -> bool:
        return holder is None or holder.stale

    def live_savepoint(self) -> str | None:
        """The location the job's live (not stale) savepoint lease names, if any: one read."""
        holder = self.current()
        return None if self.is_stale(holder) else holder.savepoint_id

    def release_location(self, savepoint_id: str) -> bool:
        """Whether ``savepoint_id`` may be removed as an orphan: no lease names it, or the stale one naming it
        is broken first. Its writer, if alive but late, then finds its lease gone before writing ``_metadata``
        (``still_held``) instead of completing a location retention is removing."""
        state = self.lease.read()
        if state is None or state.facts.get("savepoint_id") != savepoint_id:
            return True
        return state.stale and self.lease._break(state)  # noqa: SLF001 - the lease's own identity-checked break

    def try_acquire(self) -> InflightHolder | None:
        """Take the lease. Returns None on success, else the live lease of the current holder."""
        holder = self.lease.try_acquire()
        if holder is not None:
            return InflightHolder.of(holder)
        self._released = False
        self.lease.start_heartbeat()
        return None

    @property
    def savepoint_id(self) -> str | None:
        return self.lease.facts.get("savepoint_id")

    def set_savepoint(self, savepoint_id: str) -> None:
        """Name the location being written: in the lease as it is taken (no request of its own), or by
        a renewal once it is held."""
        if self.savepoint_id == savepoint_id:
            return
        if self.lease.written:
            self.lease.renew(savepoint_id=savepoint_id)
        else:
            self.lease.facts["savepoint_id"] = savepoint_id

    def still_held(self) -> bool:
        """Whether the lease is still ours, read from the store (not believed from our last write: a lease
        removed by hand, or by a trigger after a pause, must stop a ``_metadata`` write)."""
        return not self.lease.lost and self.lease.held()

    @staticmethod
    def abandon(job_store: Store, savepoint_id: str) -> bool:
        """Remove the lease if THIS process holds it for ``savepoint_id`` (a killed task's cleanup)."""
        state = Lease(job_store, LOCK_FILE, stale_after=120.0).read()
        if state is None or state.facts.get("savepoint_id") != savepoint_id or state.owner != owner_id():
            return False
        _ABANDONED.add(state.token)  # its holder's lease object, if still at work here, reads it again
        return Lease(job_store, LOCK_FILE, token=state.token, stale_after=120.0).release()

    def release(self) -> None:
        """Remove the lease if it is still ours; once done, again is a no-op (no request)."""
        if not self._released:
            self.lease.release()
            self._released = True
