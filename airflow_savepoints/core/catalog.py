"""The per-job savepoint catalog: ``<dir>/<job>/_catalog.json``, one record per savepoint.

Finding a job's latest savepoint and listing its savepoints read this one file, so the number of
storage requests does not grow with the number of savepoints. ``_metadata`` files stay the source
of truth: a record is offered for restore only after its ``_metadata`` is read, ``rebuild``
recreates the catalog from them, and ``reconcile`` settles records left "in progress" by a
process that died.

Updates are read-modify-write under a short lease ``_catalog.lock`` (a :class:`Lease`: created
complete and exclusively, broken when stale on the store's clock). The catalog also holds pins: a
restore pins its savepoint, and an incremental savepoint the one it copies from, so that neither
retention nor dispose removes it meanwhile; dispose marks a record "disposing" under the same lease,
so a pin and a disposal never both succeed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError
from tenacity import (
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_fixed,
    wait_random,
)

from airflow_savepoints.core.lease import JobLock, Lease, owner_id
from airflow_savepoints.core.manifest import BAD_MANIFEST, SAVEPOINT_NAME, read_manifest, savepoint_info
from airflow_savepoints.core.models import SavepointInfo, SavepointManifest, SavepointSummary, SavepointType
from airflow_savepoints.core.names import CATALOG_FILE, CATALOG_LOCK, MANIFEST_FILE
from airflow_savepoints.errors import (
    CredentialsError,
    IncompleteSavepointError,
    ManifestUnreadableError,
    SavepointInFlightError,
    SavepointNotFoundError,
    SavepointPinnedError,
    StoragePermissionError,
    UnsafeFileError,
)
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

CATALOG_FORMAT = "airflow-savepoints/catalog"
CATALOG_VERSION = 1
LOCK_STALE_AFTER = 30.0  # seconds; the lease is held for one read and one write
PIN_TTL = 120.0  # seconds a pin lives without its holder's heartbeat (the savepoint lease's stale time)
T = TypeVar("T")


def _in_thread(fn: Callable[[], object]) -> Future:
    """``fn()`` started in a thread of its own (no pool kept: a forked child gets none of its threads)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)

    threading.Thread(target=run, name="catalog-then", daemon=True).start()
    return future


class SavepointState(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    DISPOSING = "disposing"


class SavepointRecord(BaseModel):
    """What the catalog knows of one savepoint location."""

    savepoint_id: str
    job: str
    type: SavepointType
    state: SavepointState
    pointer: str = ""  # filled in from the catalog's own location when read
    reason: str | None = None
    request_id: str | None = None
    query_id: str | None = None
    batch_id: int | None = None
    includes_next_offsets: bool | None = None  # known once completed (catalogs written before it: None)
    files: int | None = None
    bytes: int | None = None
    spark_version: str | None = None
    checkpoint_format_version: int | None = None
    created_at: datetime
    updated_at: datetime
    conflict: str | None = None  # what retention found disagreeing about its identity: kept, never restored or disposed
    job_version_hash: str | None = None  # the short hash of the job's version (manifest job_version.hash)
    retired_checkpoint: bool = False  # of a checkpoint its job had left: never a restore default

    @classmethod
    def from_manifest(cls, manifest: SavepointManifest, pointer: str = "") -> SavepointRecord:
        return cls(
            savepoint_id=manifest.savepoint_id, job=manifest.job, type=manifest.type, state=SavepointState.COMPLETED,
            pointer=pointer, reason=manifest.reason, request_id=manifest.request_id, query_id=manifest.query_id,
            batch_id=manifest.batch_id, includes_next_offsets=manifest.includes_next_offsets, files=len(manifest.files),
            bytes=manifest.total_bytes,
            spark_version=manifest.spark_version, checkpoint_format_version=manifest.state_store.checkpoint_format_version,
            created_at=manifest.created_at, updated_at=datetime.now(UTC), job_version_hash=manifest.job_version_hash,
            retired_checkpoint=manifest.retired_checkpoint,
        )

    def summary(self) -> dict[str, Any]:
        """Plain JSON for the CLI, XCom and the API: the same :class:`SavepointSummary` as ``SavepointInfo.summary``."""
        return SavepointSummary(**self.model_dump(exclude={"updated_at", "state"}), state=self.state.value).as_json()


LeaseNames = Callable[[], str | None]  # the location the job's live savepoint lease names, asked when needed


class Pin(BaseModel):
    """A savepoint held by a restore or an incremental savepoint in progress.

    A restore's pin lapses at ``expires_at`` unless its holder's heartbeat extends it. An
    incremental savepoint's pin names its own location (``in_flight``) and lives exactly as long as
    the job's savepoint lease names that location: the lease is renewed anyway, so the pin needs
    no heartbeat of its own, and it lapses when the lease goes stale (a holder that died)."""

    pin_id: str
    savepoint_id: str
    owner: str
    purpose: str = "restore"
    created_at: datetime
    expires_at: datetime
    in_flight: str | None = None

    def active(self, now: datetime | None = None, lease_names: LeaseNames | None = None) -> bool:
        """Whether it still holds. ``lease_names`` is asked only for a pin that lives with the job's
        lease; without it (not known) such a pin counts as live."""
        if self.in_flight is None:
            return self.expires_at > (now or datetime.now(UTC))
        return lease_names is None or lease_names() == self.in_flight

    def holder(self, detail: str = "") -> str:
        """Who holds it, as messages say: "a restore in progress (host:pid[, detail])"."""
        who = f"{self.owner}, {detail}" if detail else self.owner
        return f"{'an' if self.purpose[:1] in 'aeiou' else 'a'} {self.purpose} in progress ({who})"

    def describe(self) -> str:
        """:meth:`holder` and how long the pin holds."""
        return self.holder(f"while {self.in_flight} holds the job's savepoint lease" if self.in_flight
                           else f"until {self.expires_at.isoformat()}")


class HistoryEntry(BaseModel):
    """One savepoint attempt as it ended: completed, failed (with its error) or disposed (by whom, why)."""

    savepoint_id: str | None = None  # None: it failed before a location was chosen
    type: SavepointType | None = None
    outcome: Literal["completed", "failed", "disposed"]
    triggered_at: datetime | None = None  # when the attempt began (unknown for a savepoint older than the history)
    ended_at: datetime  # completed, failed or disposed at
    batch_id: int | None = None
    files: int | None = None
    bytes: int | None = None
    error: str | None = None  # a failure's message (its first lines)
    disposed_by: str | None = None  # retention, dispose, ...
    reason: str | None = None  # the savepoint's reason; for a disposal, why it was disposed

    @property
    def duration_s(self) -> float | None:
        return None if self.triggered_at is None else round((self.ended_at - self.triggered_at).total_seconds(), 3)

    def as_json(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json"), "duration_s": self.duration_s}


HISTORY_LIMIT = 100  # entries kept per job, the oldest dropped first


class CatalogDocument(BaseModel):
    format: Literal["airflow-savepoints/catalog"] = CATALOG_FORMAT
    format_version: int = CATALOG_VERSION
    job: str
    records: dict[str, SavepointRecord] = Field(default_factory=dict)
    pins: dict[str, Pin] = Field(default_factory=dict)
    history: list[HistoryEntry] = Field(default_factory=list)  # catalogs written before it have none

    def remember(self, entry: HistoryEntry) -> None:
        """Add ``entry`` to the bounded history (the last :data:`HISTORY_LIMIT` attempts)."""
        self.history = [*self.history, entry][-HISTORY_LIMIT:]

    def active_pins(self, savepoint_id: str, now: datetime | None = None,
                    lease_names: LeaseNames | None = None) -> list[Pin]:
        return [p for p in self.pins.values() if p.savepoint_id == savepoint_id and p.active(now, lease_names)]


def _confirmed_manifest(location: Store) -> SavepointManifest:
    """The ``_metadata`` of a record the catalog calls completed. It was written before the record,
    so a miss is read again twice before it counts (a store's passing inconsistency must not make a
    retried request take a second savepoint)."""
    for attempt in Retrying(stop=stop_after_attempt(3), wait=wait_fixed(0.5),
                            retry=retry_if_exception_type(IncompleteSavepointError), reraise=True):
        with attempt:
            return read_manifest(location)
    raise AssertionError("unreachable")  # pragma: no cover


Change = Callable[[CatalogDocument], Any]  # an edit of the catalog, applied under its lease


class PinHold:
    """A pin held in the catalog until released: extended every ``PIN_TTL / 4`` seconds by a
    heartbeat, or (``heartbeat=False``) kept alive by the job's savepoint lease."""

    def __init__(self, catalog: Catalog, savepoint_id: str, pin_id: str, ttl: timedelta, *, heartbeat: bool = True):
        self.catalog, self.savepoint_id, self.pin_id, self.ttl = catalog, savepoint_id, pin_id, ttl
        self.released = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name=f"pin-{savepoint_id}", daemon=True)
            self._thread.start()

    def _extend(self, document: CatalogDocument) -> None:
        pin = document.pins.get(self.pin_id)
        if pin is not None:
            document.pins[self.pin_id] = pin.model_copy(update={"expires_at": datetime.now(UTC) + self.ttl})

    def _beat(self) -> None:
        while not self._stop.wait(PIN_TTL / 4):
            try:
                self.catalog.update(self._extend)
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.warning("could not extend the pin on %s (%s)", self.savepoint_id, exc)

    def release(self, also: Change | None = None, then: Callable[[], object] | None = None) -> None:
        """Remove the pin, writing ``also`` in the same update (once released: ``also`` alone); ``then``
        as in :meth:`Catalog.update`."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self.released:
            if also is not None:
                self.catalog.update(also, then)
            elif then is not None:
                then()
            return
        self.catalog.unpin(self.pin_id, also, then)
        self.released = True


class Catalog:
    """The catalog of one job folder ``<dir>/<job>``."""

    def __init__(self, job_store: Store, job: str | None = None, *, overlap_lock: bool = False):
        """``overlap_lock`` (a savepoint on an object store, where each request is a round trip): an update's
        unlock runs beside what follows it, and :meth:`lock_ahead` takes the lock while other work runs;
        the next update, or :meth:`settle`, waits for both."""
        self.store = job_store
        self.job = job or job_store.name
        self._in_progress_seen: dict[str, SavepointRecord] | None = None  # in the catalog as last read
        self._overlap_lock = overlap_lock
        self._pending = threading.Lock()  # guards the two below
        self._unlocking: tuple[Lease, Future] | None = None  # an unlock under way in the background
        self._ahead: Future | None = None  # (lock, document) taken ahead of the next update

    # --- reading ------------------------------------------------------------------------------------
    def load(self) -> CatalogDocument:
        """The catalog (one read); read from the ``_metadata`` files when missing or unreadable
        (without writing: the next update, or ``rebuild``, stores it)."""
        return self._with_pointers(self._read() or self._crawl())

    def _read(self) -> CatalogDocument | None:
        document = self._parse()
        self._in_progress_seen = {} if document is None else \
            {k: r.model_copy() for k, r in document.records.items() if r.state == SavepointState.IN_PROGRESS}
        return document

    def _parse(self) -> CatalogDocument | None:
        try:
            raw = self.store.read_known(CATALOG_FILE, "catalog")
        except FileNotFoundError:
            return None
        except UnsafeFileError as exc:
            log.warning("%s; rebuilding the catalog from the _metadata files", exc)
            return None
        try:
            document = CatalogDocument.model_validate_json(raw)
        except ValidationError:
            log.warning("catalog %s is unreadable; rebuilding it from the _metadata files", self.store.url_of(CATALOG_FILE))
            return None
        if document.format_version > CATALOG_VERSION:
            return None  # written by a newer release: read the _metadata files instead of guessing
        bad = [k for k, r in document.records.items() if not SAVEPOINT_NAME.match(k) or r.savepoint_id != k]
        for key in bad:  # a record keyed by anything but its own folder name ('../../etc') is ignored
            log.warning("catalog %s: ignoring the record keyed %r (not a savepoint folder name)",
                        self.store.url_of(CATALOG_FILE), key)
            document.records.pop(key)
        return document

    def _with_pointers(self, document: CatalogDocument) -> CatalogDocument:
        for savepoint_id, record in document.records.items():
            record.pointer = self.store.child(savepoint_id).url
        return document

    def records(self, states: set[SavepointState] | None = None) -> list[SavepointRecord]:
        """Records oldest first, optionally only those in ``states``. An in-progress record whose
        ``_metadata`` is written reads as completed (the catalog update after it may have failed, on
        a full disk for instance); the next update of the catalog stores that."""
        settled = [self._settled(r) for r in self.load().records.values()]
        found = [r for r in settled if states is None or r.state in states]
        return sorted(found, key=lambda r: (r.created_at, r.batch_id or -1))

    def _settled(self, record: SavepointRecord) -> SavepointRecord:
        if record.state != SavepointState.IN_PROGRESS:
            return record
        location = self.store.child(record.savepoint_id)
        try:
            manifest = read_manifest(location)
        except (IncompleteSavepointError, *BAD_MANIFEST, ManifestUnreadableError):
            return record
        if manifest.savepoint_id != record.savepoint_id or manifest.job != self.job or manifest.type != record.type:
            return record  # identity disputed: left to reconcile, which reports the conflict
        return SavepointRecord.from_manifest(manifest, location.url)

    def completed(self) -> list[SavepointRecord]:
        """Completed savepoints whose identity nothing disputes (a record in conflict is never picked)."""
        return [r for r in self.records({SavepointState.COMPLETED}) if r.conflict is None]

    def latest(self, accept: Callable[[SavepointManifest], bool] | None = None) -> SavepointInfo | None:
        """The newest completed savepoint whose ``_metadata`` reads (a record alone is never enough), of a
        checkpoint the job had not left (``retired_checkpoint``), and that ``accept`` takes if given."""
        for record in reversed(self.completed()):
            if record.retired_checkpoint:
                continue
            location = self.store.child(record.savepoint_id)
            try:
                manifest = _confirmed_manifest(location)
            except (IncompleteSavepointError, *BAD_MANIFEST):
                log.warning("catalog record %s has no usable _metadata; skipped", location.url)
                continue
            if manifest.retired_checkpoint or (accept is not None and not accept(manifest)):
                continue
            return savepoint_info(location, manifest)
        return None

    def find_request(self, request_id: str) -> SavepointInfo | None:
        """The completed savepoint taken for ``request_id``, confirmed by its ``_metadata``."""
        for record in reversed(self.completed()):
            if record.request_id == request_id:
                location = self.store.child(record.savepoint_id)
                try:
                    return savepoint_info(location, _confirmed_manifest(location))
                except (IncompleteSavepointError, *BAD_MANIFEST):
                    continue
        return None

    # --- writing ------------------------------------------------------------------------------------
    def update(self, change: Callable[[CatalogDocument], T], then: Callable[[], object] | None = None) -> T:
        """Apply ``change`` to the catalog under its lease and write it back atomically. ``then`` runs
        once the catalog is written, at the same time as its lease is released (two requests each on
        an object store); its error is raised after the release."""
        lease, document = self._locked()
        after: Future | None = None
        written = False
        try:
            result = change(document)
            document.records = {k: v.model_copy(update={"pointer": ""}) for k, v in document.records.items()}
            self.store.write_bytes_atomic(CATALOG_FILE, document.model_dump_json().encode())
            written = True
            if then is not None:
                after = _in_thread(then)
            return result
        finally:
            if written and self._overlap_lock:  # the next update (or ``settle``) waits for it
                with self._pending:
                    self._unlocking = (lease, _in_thread(lease.release))
            else:
                lease.release()
            if after is not None:
                after.result()

    def _locked(self) -> tuple[Lease, CatalogDocument]:
        """The catalog's lock and the document read under it: the ones taken ahead while still ``recent``
        (no other writer can have broken the lock as stale meanwhile), else taken now."""
        with self._pending:
            ahead, self._ahead = self._ahead, None
        if ahead is not None:
            lease, document = ahead.result()
            if lease.recent:
                return lease, document
            lease.release()  # held too long ahead (a long plan): it may have been broken; take it afresh
        return self._lock_and_read()

    def _lock_and_read(self) -> tuple[Lease, CatalogDocument]:
        lease = self._acquire()
        try:
            return lease, self._read() or self._crawl()
        except BaseException:
            lease.release()
            raise

    def lock_ahead(self) -> None:
        """With ``overlap_lock``: take the lock and read the catalog in the background now, for the next
        update (one that never comes is released by :meth:`settle`)."""
        if not self._overlap_lock:
            return
        with self._pending:
            if self._ahead is None:
                self._ahead = _in_thread(self._lock_and_read)

    def settle(self, *, quiet: bool = False) -> None:
        """Wait for an unlock under way in the background (one that failed is tried once more, raising if
        it fails again), and release a lock taken ahead that no update used. ``quiet``: a failure is
        logged instead (the lock is broken once stale)."""
        with self._pending:
            ahead, self._ahead = self._ahead, None
        try:
            self._join_unlock()
            if ahead is not None and ahead.exception() is None:
                ahead.result()[0].release()
        except Exception as exc:
            if not quiet:
                raise
            log.warning("could not release the catalog lock of %s (%s); it is broken once stale", self.job, exc)

    def _join_unlock(self) -> None:
        with self._pending:
            unlocking, self._unlocking = self._unlocking, None
        if unlocking is not None:
            lease, done = unlocking
            if done.exception() is not None:
                lease.release()

    def look(self) -> None:
        """Read the catalog once: its in-progress records are what ``reconcile(as_last_read=True)`` settles."""
        self._read()

    def rebuild(self) -> CatalogDocument:
        """Recreate the catalog from the ``_metadata`` files; keeps live pins and in-progress records."""
        def replace(document: CatalogDocument) -> CatalogDocument:
            fresh = self._crawl()
            for savepoint_id, record in document.records.items():
                if record.state == SavepointState.IN_PROGRESS and savepoint_id not in fresh.records:
                    fresh.records[savepoint_id] = record
            fresh.pins = {k: p for k, p in document.pins.items() if p.active()}
            document.records, document.pins = fresh.records, fresh.pins
            return document.model_copy(deep=True)

        return self._with_pointers(self.update(replace))

    def _crawl(self) -> CatalogDocument:
        """One listing of the job folder, one read per ``_metadata``."""
        document = CatalogDocument(job=self.job)
        for path in sorted(self.store.list_files()):
            parts = path.split("/")
            if len(parts) == 2 and parts[1] == MANIFEST_FILE and SAVEPOINT_NAME.match(parts[0]):
                try:
                    manifest = read_manifest(self.store.child(parts[0]))
                except (*BAD_MANIFEST, IncompleteSavepointError) as exc:
                    log.warning("%s: skipped (%s); `verify`/`show` report why", self.store.url_of(parts[0]), exc)
                    continue
                if manifest.savepoint_id == parts[0] and manifest.job == self.job:
                    document.records[parts[0]] = SavepointRecord.from_manifest(manifest)
        return document

    def begin(self, savepoint_id: str, savepoint_type: SavepointType, reason: str | None, request_id: str | None) -> None:
        self.update(self.record_begun(savepoint_id, savepoint_type, reason, request_id))

    def record_begun(self, savepoint_id: str, savepoint_type: SavepointType, reason: str | None,
                     request_id: str | None) -> Change:
        """The change that records ``savepoint_id`` as in progress (``begin`` applies it alone)."""
        now = datetime.now(UTC)
        record = SavepointRecord(savepoint_id=savepoint_id, job=self.job, type=savepoint_type,
                                 state=SavepointState.IN_PROGRESS, reason=reason, request_id=request_id,
                                 created_at=now, updated_at=now)
        return lambda d: d.records.__setitem__(savepoint_id, record)

    def complete(self, manifest: SavepointManifest, then: Callable[[], object] | None = None) -> None:
        self.update(self.record_completed(manifest), then)

    @staticmethod
    def record_completed(manifest: SavepointManifest) -> Change:
        """The change that records the savepoint of ``manifest`` as completed, and its history entry
        (``complete`` applies it alone)."""
        def completed(document: CatalogDocument) -> None:
            begun = document.records.get(manifest.savepoint_id)
            record = SavepointRecord.from_manifest(manifest)
            document.records[manifest.savepoint_id] = record
            document.remember(HistoryEntry(
                savepoint_id=record.savepoint_id, type=record.type, outcome="completed",
                triggered_at=begun.created_at if begun is not None else manifest.created_at, ended_at=record.updated_at,
                batch_id=record.batch_id, files=record.files, bytes=record.bytes, reason=record.reason))

        return completed

    def forget(self, savepoint_id: str) -> None:
        self.update(lambda d: d.records.pop(savepoint_id, None))

    def record_disposed(self, savepoint_id: str, by: str, why: str | None) -> None:
        """Drop the record of a disposed savepoint and keep its history entry: who disposed it and why."""
        def disposed(document: CatalogDocument) -> None:
            record = document.records.pop(savepoint_id, None)
            document.remember(HistoryEntry(
                savepoint_id=savepoint_id, type=record.type if record else None, outcome="disposed", ended_at=datetime.now(UTC),
                batch_id=record.batch_id if record else None, files=record.files if record else None,
                bytes=record.bytes if record else None, disposed_by=by, reason=why))

        self.update(disposed)

    def record_failure(self, savepoint_id: str | None, savepoint_type: SavepointType, triggered_at: datetime,
                       error: str, reason: str | None = None) -> None:
        """Keep a failed attempt in the history, with its error."""
        self.update(lambda d: d.remember(HistoryEntry(
            savepoint_id=savepoint_id, type=savepoint_type, outcome="failed", triggered_at=triggered_at,
            ended_at=datetime.now(UTC), error=error[:2000], reason=reason)))

    def history(self) -> list[HistoryEntry]:
        """The job's savepoint attempts, oldest first (one read)."""
        return sorted((self._parse() or CatalogDocument(job=self.job)).history, key=lambda e: e.ended_at)

    def mark_failed(self, savepoint_id: str) -> None:
        def fail(document: CatalogDocument) -> None:
            record = document.records.get(savepoint_id)
            if record is not None and record.state == SavepointState.IN_PROGRESS:
                document.records[savepoint_id] = record.model_copy(
                    update={"state": SavepointState.FAILED, "updated_at": datetime.now(UTC)})

        self.update(fail)

    def reconcile(self, in_flight: str | None, *, as_last_read: bool = False) -> list[str]:
        """Settle in-progress records other than ``in_flight``: completed if their ``_metadata``
        exists, failed if the location remains without one, dropped if it is gone. ``as_last_read``:
        find them in the catalog as this object last read it, if it has (no request); the update
        itself re-reads it under the lease and skips a record no longer in progress."""
        if not (as_last_read and self._in_progress_seen is not None):
            self._read()
        seen = self._in_progress_seen or {}
        stale = [sid for sid in seen if sid != in_flight]
        if not stale:
            return []
        settled: dict[str, SavepointRecord | None] = {}
        for savepoint_id in stale:
            location = self.store.child(savepoint_id)
            try:
                settled[savepoint_id] = SavepointRecord.from_manifest(read_manifest(location))
            except IncompleteSavepointError:
                settled[savepoint_id] = (seen[savepoint_id].model_copy(update={"state": SavepointState.FAILED})
                                         if location.exists() else None)
            except BAD_MANIFEST:
                settled[savepoint_id] = seen[savepoint_id].model_copy(update={"state": SavepointState.FAILED})

        def apply(doc: CatalogDocument) -> None:
            for savepoint_id, record in settled.items():
                current = doc.records.get(savepoint_id)
                if current is None or current.state != SavepointState.IN_PROGRESS:
                    continue  # changed meanwhile
                if record is None:
                    doc.records.pop(savepoint_id)
                else:
                    doc.records[savepoint_id] = record

        self.update(apply)
        return stale

    # --- pins and disposal --------------------------------------------------------------------------
    def pin(self, savepoint_id: str, ttl: timedelta = timedelta(hours=6), purpose: str = "restore",
            manifest: SavepointManifest | None = None, also: Change | None = None, in_flight: str | None = None) -> str:
        """Hold a completed savepoint against retention and dispose; returns the pin id.

        ``manifest`` is its ``_metadata`` if the caller has just read it (else it is read here);
        ``also``: another change written in the same update; ``in_flight``: the location the caller
        writes while holding the job's savepoint lease, which then keeps the pin alive (``ttl`` unused)."""
        if manifest is None:
            manifest = read_manifest(self.store.child(savepoint_id))  # _metadata first: the source of truth
        now = datetime.now(UTC)
        pin = Pin(pin_id=uuid.uuid4().hex, savepoint_id=savepoint_id, owner=owner_id(), purpose=purpose,
                  created_at=now, expires_at=now + ttl, in_flight=in_flight)
        # the lease names ours while we pin with it, so another pin living with the lease is a dead holder's
        lease_names: LeaseNames | None = None if in_flight is None else (lambda: in_flight)

        def add(document: CatalogDocument) -> None:
            record = document.records.get(savepoint_id)
            if record is not None and record.state == SavepointState.DISPOSING:
                raise SavepointNotFoundError(
                    f"savepoint {self.store.child(savepoint_id).url} is being disposed",
                    "restore another savepoint (list the job's savepoints)",
                )
            if record is None:  # taken before the catalog existed, or its record was lost: recheck
                read_manifest(self.store.child(savepoint_id))  # under the lease: not disposed meanwhile
                document.records[savepoint_id] = SavepointRecord.from_manifest(manifest)
            document.pins = {k: p for k, p in document.pins.items() if p.active(now, lease_names)}
            document.pins[pin.pin_id] = pin
            if also is not None:
                also(document)

        self.update(add)
        return pin.pin_id

    def unpin(self, pin_id: str, also: Change | None = None, then: Callable[[], object] | None = None) -> None:
        def remove(document: CatalogDocument) -> None:
            document.pins.pop(pin_id, None)
            if also is not None:
                also(document)

        self.update(remove, then)

    @contextlib.contextmanager
    def held(self, savepoint_id: str, purpose: str, manifest: SavepointManifest | None = None,
             also: Change | None = None, in_flight: str | None = None) -> Iterator[PinHold]:
        """Pin ``savepoint_id`` for the block with a short pin (``PIN_TTL``) renewed by a heartbeat:
        the pin of a process that dies lapses after ``PIN_TTL`` seconds, not hours. With ``in_flight``
        (the caller holds the job's savepoint lease for that location) the lease keeps the pin alive
        instead, and no heartbeat runs. ``also`` is written with the pin; the block may release the
        pin early together with another change."""
        ttl = timedelta(seconds=PIN_TTL)
        hold = PinHold(self, savepoint_id, self.pin(savepoint_id, ttl=ttl, purpose=purpose, manifest=manifest,
                                                    also=also, in_flight=in_flight), ttl, heartbeat=in_flight is None)
        try:
            yield hold
        finally:
            try:
                hold.release()
            except Exception as exc:  # noqa: BLE001 - the pin lapses by itself
                log.warning("could not release the pin on %s (%s); it lapses after %.0fs", savepoint_id, exc, PIN_TTL)

    @contextlib.contextmanager
    def pinned(self, savepoint_id: str, purpose: str, manifest: SavepointManifest | None = None, *,
               unless: tuple[type[Exception], ...] = (), also: Change | None = None,
               in_flight: str | None = None) -> Iterator[PinHold | bool]:
        """The one pin context of savepoint and restore: ``held`` for the block, yielding its
        :class:`PinHold`. A pin that fails with one of the ``unless`` errors is logged and the block
        runs unpinned (False; ``also`` is then not written either)."""
        with contextlib.ExitStack() as stack:
            try:
                holding: PinHold | bool = stack.enter_context(self.held(savepoint_id, purpose, manifest, also, in_flight))
            except unless as exc:
                log.warning("could not pin %s for the %s (%s): going on without the pin",
                            self.store.child(savepoint_id).url, purpose, getattr(exc, "message", exc))
                holding = False
            yield holding

    def begin_dispose(self, savepoint_id: str) -> None:
        """Mark a savepoint "disposing"; refused while a live pin holds it."""
        lease_names = functools.cache(JobLock(self.store, request_id=None).live_savepoint)  # read only if a pin needs it

        def mark(document: CatalogDocument) -> None:
            pins = document.active_pins(savepoint_id, lease_names=lease_names)
            if pins:
                raise SavepointPinnedError(
                    f"savepoint {self.store.child(savepoint_id).url} is pinned by {pins[0].describe()}",
                    f"wait for the {pins[0].purpose} to finish, then dispose it",
                )
            record = document.records.get(savepoint_id)
            if record is not None:
                document.records[savepoint_id] = record.model_copy(
                    update={"state": SavepointState.DISPOSING, "updated_at": datetime.now(UTC)})

        self.update(mark)

    # --- the lease ----------------------------------------------------------------------------------
    def _acquire(self, timeout: float = 60.0) -> Lease:
        self._join_unlock()  # our own unlock first: never wait on ourselves
        lease = Lease(self.store, CATALOG_LOCK, stale_after=LOCK_STALE_AFTER)
        retrying = Retrying(stop=stop_after_delay(timeout), wait=wait_random(0.005, 0.05),  # held for milliseconds
                            retry=retry_if_result(lambda holder: holder is not None),
                            retry_error_callback=lambda state: state.outcome.result())
        holder = retrying(lease.try_acquire)
        if holder is None:
            return lease
        raise SavepointInFlightError(
            f"the catalog of job '{self.job}' stayed locked for {timeout:.0f}s ({self.store.url_of(CATALOG_LOCK)}, "
            f"owner {holder.owner or 'unknown'})",
            f"retry; if no process holds it, delete {CATALOG_LOCK} (it is broken automatically once it has not "
            f"changed for {LOCK_STALE_AFTER:.0f}s)",
        )


@contextlib.contextmanager
def pinned_savepoint(location: Store, manifest: SavepointManifest, purpose: str,
                     catalog: Catalog | None = None) -> Iterator[PinHold | bool]:
    """Hold the savepoint at ``location`` against retention and dispose for ``purpose`` (a restore, an
    inspect), in ``catalog`` (by default its job's). Only a savepoint laid out as ``<dir>/<job>/savepoint-…``
    has a catalog to pin in; a store that may not be written to (a read-only bucket) is used unpinned, with
    a warning (then False is yielded, as when there is no catalog)."""
    if not SAVEPOINT_NAME.match(location.name) or location.parent().name != manifest.job:
        yield False
        return
    catalog = catalog or Catalog(location.parent(), manifest.job)
    with catalog.pinned(location.name, purpose, manifest, unless=(StoragePermissionError, CredentialsError)) as held:
        yield held
