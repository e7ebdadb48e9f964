"""Take a savepoint of a (running) Spark streaming query.

A :class:`SavepointRequest` says what the caller asks; a :class:`SavepointRun` holds one run's parts
(the live checkpoint, the job folder, its lease and catalog, the previous savepoint, the location
being written) and does one step per method. One attempt: plan committed batch N from one listing,
open a fresh ``savepoint-<id6>-<random>/`` location, copy the plan into it (sources first,
``metadata`` last, files in parallel), verify sizes, Spark's own checksums and the version of every
copied file, write ``_metadata`` last, finish in the catalog. A file that changed or vanished means
Spark raced the copy: the attempt is retried on a newer N. Any failure discards the location.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pydantic import field_validator, model_validator
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from airflow_savepoints import __version__
from airflow_savepoints.checkpoint import formats
from airflow_savepoints.checkpoint.planner import CheckpointPlan, FirstReads, KnownSnapshot, plan_checkpoint
from airflow_savepoints.core.catalog import Catalog, Change, PinHold
from airflow_savepoints.core.checksums import CRC32C, HEX_FORMAT
from airflow_savepoints.core.copier import (  # noqa: F401 - CopyMode, known_copy_mode: imported from here too
    CopiedFile,
    CopyMode,
    CopyOptions,
    KnownChecksum,
    checksum_of,
    copy_many,
    default_parallelism,
    known_copy_mode,
)
from airflow_savepoints.core.dispose import discard_incomplete
from airflow_savepoints.core.lease import InflightHolder, JobLock
from airflow_savepoints.core.manifest import new_savepoint_id, refuse_symlinks, savepoint_info
from airflow_savepoints.core.models import (
    MANIFEST_VERSION,
    PLAIN_MANIFEST_VERSION,
    Notify,
    Request,
    SavepointInfo,
    SavepointManifest,
    SavepointType,
    StateStoreSettings,
    validate_job_name,
)
from airflow_savepoints.core.names import CATALOG_FILE, MANIFEST_FILE
from airflow_savepoints.core.settings import resolve_savepoint_dir
from airflow_savepoints.errors import (
    CheckpointNotFoundError,
    CheckpointRaceError,
    InvalidInputError,
    SavepointError,
    SavepointInFlightError,
    SavepointRetriesExhaustedError,
    StorageFullError,
)
from airflow_savepoints.storage import FileStat, Store
from airflow_savepoints.storage.store import SourceChangedError

log = logging.getLogger(__name__)

# A Spark checkpoint does not record the Spark version that wrote it, and the worker's pyspark need not be the
# job's: the manifest leaves it out (null) unless the caller knows (spark_version=).

_NOT_TRIED = object()  # no try for the job's lease made yet
Listed = tuple[CheckpointPlan, Mapping[str, FileStat]]


def _as_store(location: str | Store, storage_options: dict[str, Any] | None) -> Store:
    return location if isinstance(location, Store) else Store(location, storage_options)


def check_apart(checkpoint: Store, root: Store) -> None:
    """Savepoints never live inside the live checkpoint, nor the checkpoint inside the savepoint root."""
    real_root, real_checkpoint = root.resolved(), checkpoint.resolved()
    if root.contains(checkpoint) or checkpoint.contains(root) or \
            real_root.contains(real_checkpoint) or real_checkpoint.contains(real_root):
        raise InvalidInputError(
            f"the savepoint directory {root.url} and the checkpoint {checkpoint.url} overlap",
            "keep savepoints in their own directory, outside the query's checkpointLocation",
        )


class SavepointRequest(Request):
    """What a caller asks of :func:`take_savepoint` (its keyword arguments are these fields).

    ``copy_mode``: ``auto`` (link, server-side copy or stream, whatever the stores offer) or
    ``stream``. ``incremental``: reuse the unchanged files of the job's previous savepoint.
    ``secondary_dir``: a second copy written in the same pass (restore prefers it when intact).
    ``lock_stale_after``: seconds after which a holder of the job's lease that stopped renewing it
    counts as dead; ``wait_for_same_request``: how long to wait for the same request in flight."""

    checkpoint: str | Store
    job: str
    savepoint_dir: str | Store | None = None
    savepoint_type: SavepointType = SavepointType.MANUAL
    reason: str | None = None
    request_id: str | None = None
    spark_version: str | None = None
    job_version: dict[str, Any] | None = None  # the job's version (application, args, Spark conf, hash)
    retired_checkpoint: bool = False  # of a checkpoint the job has left (asked for on purpose): never a restore default
    copy_mode: CopyMode = "auto"
    incremental: bool = True
    secondary_dir: str | Store | None = None
    parallelism: int | None = None  # None: copier.default_parallelism for each copy
    max_attempts: int = 5
    storage_options: dict[str, Any] | None = None
    checkpoint_storage_options: dict[str, Any] | None = None
    secondary_storage_options: dict[str, Any] | None = None
    lock_stale_after: float = 120.0
    wait_for_same_request: float = 600.0

    @field_validator("job")
    @classmethod
    def _job_name(cls, value: str) -> str:
        return validate_job_name(value)

    @field_validator("savepoint_type", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> SavepointType:
        try:
            return SavepointType(value)
        except ValueError:
            raise InvalidInputError(
                f"unknown savepoint type {value!r}", "use one of: " + ", ".join(t.value for t in SavepointType),
            ) from None

    @model_validator(mode="after")
    def _positive(self) -> SavepointRequest:
        if self.max_attempts < 1 or (self.parallelism is not None and self.parallelism < 1):
            raise InvalidInputError("max_attempts and parallelism must be at least 1", "use positive numbers")
        return self


class PreviousSavepoint:
    """The job's previous completed savepoint, pinned, and the files it can lend (by path)."""

    def __init__(self, location: Store, manifest: SavepointManifest):
        self.location, self.manifest = location, manifest
        self.entries = {e.path: e for e in manifest.files if e.source_version}

    def snapshots(self) -> dict[str, KnownSnapshot]:
        """The snapshot zips it holds, with the version they were copied at and the files they list."""
        return {path: (self.entries[path].source_version, files)
                for path, files in self.manifest.snapshot_files.items() if path in self.entries}

    def known(self, plan: CheckpointPlan) -> dict[str, KnownChecksum]:
        """Planned files the previous savepoint holds unchanged: same size, same version token."""
        if plan.query_id != self.manifest.query_id:
            return {}
        found = {}
        for planned in plan.files:
            entry = self.entries.get(planned.path)
            if entry is not None and entry.size == planned.size and entry.source_version == planned.version:
                found[planned.path] = KnownChecksum(self.location, entry.path, entry.size, int(entry.checksum, 16),
                                                    self.manifest.savepoint_id, entry.checksum_algorithm or CRC32C)
        return found


def plan_listed(source: Store, parallelism: int | None = None, previous: PreviousSavepoint | None = None, *,
                listing: Mapping[str, FileStat] | None = None, pending: Mapping[str, Future[bytes]] | None = None,
                expect: bool = False) -> Listed:
    """The plan and the one listing it was made from (on a local disk, only planned files are stat'ed).
    On an object store the snapshot zips are read ``parallelism`` at a time (one request each); on a
    local disk planning is Python work on cached pages, which threads only slow down: one at a time.
    A zip ``previous`` holds unchanged is planned from its manifest, not read. ``listing`` and
    ``pending`` (reads under way, by path): what the caller fetched already. With ``expect``, a local
    listing takes ``previous``'s entry (size, version token) of each name that still holds the inode it
    records, without a stat (``LazyLocalListing.expect``): the copy proves each with the stat of the inode
    it links (``copier._reuse_all_by_link``), or a check of what it copied (``check_copied``)."""
    listing = source.list_files_lazily() if listing is None else listing
    if not listing and not source.exists():
        raise CheckpointNotFoundError(
            f"checkpoint {source.url} does not exist", "point at the query's checkpointLocation"
        )
    if expect and previous is not None and (take := getattr(listing, "expect", None)) is not None:
        take([(path, entry.size, entry.source_version) for path, entry in previous.entries.items()])
    workers = 1 if source.is_local else parallelism or default_parallelism()  # reads: no upload buffer
    known = previous.snapshots() if previous is not None else None
    return plan_checkpoint(listing, source.read_bytes, where=source.url, parallelism=workers,
                           known_snapshots=known, pending=pending), listing


class SavepointRun:
    """One run of a savepoint request: its parts, and a method per step."""

    def __init__(self, request: SavepointRequest, on_event: Notify | None = None):
        self.request = request
        self.notify: Notify = on_event or (lambda event, data: None)
        self.quiet = on_event is None  # no one to tell of each file copied
        self.source = _as_store(request.checkpoint, request.checkpoint_storage_options)
        self.root = request.savepoint_dir if isinstance(request.savepoint_dir, Store) else \
            Store(resolve_savepoint_dir(request.savepoint_dir), request.storage_options)
        check_apart(self.source, self.root)
        self._listing: Mapping[str, FileStat] | None = None  # local disks: the first plan's listing, walked once
        if self.source.is_local and self.root.is_local:
            links: list[str] = []
            self._listing = self.source.list_files_lazily(links=links)
            refuse_symlinks(self.source, "checkpoint", links)
        else:
            refuse_symlinks(self.source, "checkpoint")
        self.job_folder = self.root.child(request.job)
        self.catalog = Catalog(self.job_folder, request.job, overlap_lock=not self.root.is_local)
        self.lease = JobLock(self.job_folder, request_id=request.request_id, stale_after=request.lock_stale_after)
        self.secondary_root = None if request.secondary_dir is None else \
            _as_store(request.secondary_dir, request.secondary_storage_options).child(request.job)
        self.previous: PreviousSavepoint | None = None
        self.location: Store | None = None
        self.attempt = 0
        self._first_plan: Listed | None = None
        self._latest: SavepointInfo | None = None  # the previous savepoint found before planning
        self._pin: PinHold | None = None  # the pin on it while the attempts run, written with our in-progress record
        self._early_holder: InflightHolder | None | object = _NOT_TRIED  # the first try for the lease, if planning made it

    # --- before the lease -----------------------------------------------------------------------------
    def already_taken(self) -> SavepointInfo | None:
        """The savepoint already taken for this request id, if any."""
        if not self.request.request_id:
            return None
        return self.catalog.find_request(self.request.request_id)

    def plan_first(self) -> None:
        """Plan before anything but the job's lease is written (bad input fails here and changes nothing);
        the first attempt uses this plan.

        Where the checkpoint or the savepoints are on an object store, the serial requests overlap: the
        checkpoint's listing, its ``metadata``, the job's catalog and (on an object store, once the
        ``metadata`` names the query) the first try for the job's lease run together, and the lease is
        released again if planning fails. On S3 the batch's logs are read once the listing's pages are
        past them (``FirstReads``), while the rest is listed. On local disks (requests cost microseconds) one after another."""
        if self.source.is_local and self.root.is_local:
            self._latest = self._latest_of_checkpoint()
            listing, self._listing = self._listing, None
            # the first attempt takes the previous savepoint's entries of unchanged names (no stat each); a retry
            # (a race, or an entry the copy could not prove) stats every planned file
            self._first_plan = plan_listed(self.source, self.request.parallelism, self._lender(), listing=listing,
                                           expect=True)
            self.lease.set_savepoint(new_savepoint_id(self._first_plan[0].query_id))  # named as the lease is taken
            return
        with ThreadPoolExecutor(max_workers=6, thread_name_prefix="savepoint-start") as pool:
            metadata = pool.submit(self.source.read_bytes, formats.METADATA_FILE)
            latest = pool.submit(self._latest_of_checkpoint)
            early = None if self.root.is_local else pool.submit(self._lease_early, metadata)
            logs = FirstReads(functools.partial(pool.submit, self.source.read_bytes))  # once the listing is past them
            try:
                listing = self.source.list_files_lazily(on_page=logs)
                self._latest = latest.result()
                self._first_plan = plan_listed(self.source, self.request.parallelism, self._lender(), listing=listing,
                                               pending={formats.METADATA_FILE: metadata, **logs.started})
                if early is not None:
                    self._early_holder = early.result()
            except BaseException:
                if early is not None and not early.cancel() and early.exception() is None and early.result() is None:
                    self.catalog.settle(quiet=True)  # the catalog's lock taken with it, unused
                    self.lease.release()  # taken for a plan that failed: nothing is left behind
                raise
        if self.lease.savepoint_id is None:
            self.lease.set_savepoint(new_savepoint_id(self._first_plan[0].query_id))  # named as the lease is taken

    def _lender(self) -> PreviousSavepoint | None:
        latest = self._latest
        return None if latest is None else \
            PreviousSavepoint(self.job_folder.child(latest.manifest.savepoint_id), latest.manifest)

    def _lease_early(self, metadata: Future[bytes]) -> InflightHolder | None:
        """The first try for the job's lease, named after the query the checkpoint's ``metadata`` names
        (a checkpoint without a readable one gets no lease: its plan fails). Once it is ours, the catalog's
        lock is taken and the catalog read for the first update under it (the pin of the previous savepoint,
        or our in-progress record) while planning goes on: two round trips fewer between plan and copy."""
        query_id = formats.parse_stream_metadata(metadata.result())
        self.lease.set_savepoint(new_savepoint_id(query_id))
        holder = self.lease.try_acquire()
        if holder is None:
            self.catalog.lock_ahead()
        return holder

    def wait_for_lease(self) -> SavepointInfo | None:
        """Take the job's lease (None), or return the result of the same request finishing elsewhere."""
        request, started = self.request, time.monotonic()
        holder, self._early_holder = self._early_holder, _NOT_TRIED
        while (holder := self.lease.try_acquire() if holder is _NOT_TRIED else holder) is not None:
            same_request = bool(request.request_id) and holder.request_id == request.request_id
            # a lease from the future has no age on the store's clock: it goes stale once seen unchanged
            # for lock_stale_after seconds, so wait that long for it rather than fail
            waited = time.monotonic() - started
            if not ((same_request and waited <= request.wait_for_same_request)
                    or (holder.age_s is None and waited <= request.lock_stale_after + 5)):
                raise self._in_flight(holder)
            time.sleep(1.0 if same_request else 0.5)  # the same request is in flight elsewhere: wait for its result
            if same_request and (done := self.already_taken()) is not None:
                return done
            holder = _NOT_TRIED
        return None

    def _in_flight(self, holder: InflightHolder) -> SavepointInFlightError:
        since = "" if holder.started_at is None else \
            f", started {datetime.fromtimestamp(holder.started_at, UTC).isoformat()}"
        return SavepointInFlightError(
            f"a savepoint of job '{self.request.job}' is already in progress (request {holder.request_id!r}, "
            f"location {holder.savepoint_id!r}, owner {holder.owner}{since})",
            "wait for it to finish, or retry with the same request id to get its result "
            f"(a holder that died is broken after {self.request.lock_stale_after:.0f}s)",
        )

    # --- under the lease ------------------------------------------------------------------------------
    def take(self) -> SavepointInfo:
        """Holding the lease: settle stale records, then attempt until a consistent copy is made."""
        # we hold the lease: other in-progress records are stale (those of the catalog read before it)
        self.catalog.reconcile(in_flight=None, as_last_read=True)
        done = self.already_taken()  # it may have completed between our first look and taking the lease
        if done is not None:
            return done
        with self._pinned_previous() as self.previous:
            return self._attempts()

    def _latest_of_checkpoint(self) -> SavepointInfo | None:
        """The job's newest completed savepoint of the same checkpoint, when files may be reused."""
        if not (self.request.incremental and self.request.copy_mode == "auto"):
            with contextlib.suppress(Exception):  # read now, reconcile (under the lease) needs no request of its own
                self.catalog.look()
            return None
        try:
            latest = self.catalog.latest()
        except Exception as exc:  # noqa: BLE001 - reuse only saves work; without it every file is copied
            log.info("not reusing the previous savepoint of %s (%s): copying every file", self.request.job, exc)
            return None
        return latest if latest is not None and latest.manifest.checkpoint == self.source.url else None

    @contextlib.contextmanager
    def _pinned_previous(self) -> Iterator[PreviousSavepoint | None]:
        """Pin the savepoint found before planning (the job's newest of the same checkpoint then) for the
        copy. One completed since is not looked for: any completed savepoint lends correctly, and the pin
        fails if this one was disposed meanwhile."""
        if self._latest is None:
            yield None
            return
        manifest = self._latest.manifest
        # the pin and our in-progress record go in one update; the job's lease, which names our location
        # and is renewed anyway, keeps the pin alive (no heartbeat of its own)
        with self.catalog.pinned(manifest.savepoint_id, "incremental savepoint", manifest, unless=(Exception,),
                                 also=self._begun(), in_flight=self.lease.savepoint_id) as held:
            if not held:  # unpinned, retention could remove it while files are taken from it
                log.info("not reusing the previous savepoint of %s: copying every file", self.request.job)
                yield None
                return
            self._pin = held
            try:
                yield PreviousSavepoint(self.job_folder.child(manifest.savepoint_id), manifest)
            finally:
                self._pin = None

    def _begun(self) -> Change:
        """The catalog change recording this run's location (the one the lease names) as in progress."""
        request = self.request
        return self.catalog.record_begun(self.lease.savepoint_id, request.savepoint_type, request.reason,
                                         request.request_id)

    def _attempts(self) -> SavepointInfo:
        try:
            for attempt in Retrying(stop=stop_after_attempt(self.request.max_attempts),
                                    wait=wait_exponential(multiplier=0.2, max=5),
                                    retry=retry_if_exception_type(CheckpointRaceError), reraise=False):
                with attempt:
                    self.attempt = attempt.retry_state.attempt_number
                    return self.attempt_once()
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            self.discard()
            raise SavepointRetriesExhaustedError(
                f"could not take a consistent savepoint of {self.source.url} in {self.request.max_attempts} "
                f"attempts: Spark kept changing the files being copied (last: {cause})",
                "retry later, raise spark.sql.streaming.minBatchesToRetain, or use --max-attempts",
            ) from cause
        except BaseException:
            self.discard()
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def attempt_once(self) -> SavepointInfo:
        """One attempt, step by step."""
        plan, listing = self.plan()
        self.open_location(plan)
        copied = self.copy(plan, listing)
        self.verify(plan, copied)
        secondary = self.copy_secondary(plan, listing, copied)
        self.catalog.lock_ahead()  # the completed record's lock and read, while ``_metadata`` is written
        manifest = self.write_metadata(plan, copied, secondary)
        return self.finish(manifest)

    # --- the steps ------------------------------------------------------------------------------------
    def plan(self) -> Listed:
        """The plan made before the lease for the first attempt, a fresh one for a retry."""
        first, self._first_plan = self._first_plan, None
        return first if first is not None else plan_listed(self.source, self.request.parallelism, self.previous)

    def open_location(self, plan: CheckpointPlan) -> Store:
        """A fresh location recorded as in progress (the lease names it), or the same one emptied for a retry."""
        if self.location is None:
            savepoint_id = self.lease.savepoint_id or new_savepoint_id(plan.query_id)
            self.location = self.job_folder.child(savepoint_id)
            self.lease.set_savepoint(savepoint_id)
            if self._pin is None:  # else written with the pin of the previous savepoint
                self.catalog.update(self._begun())
        else:
            self.job_folder.remove_tree(self.location.name)  # a retry starts from an empty location
        self.location.makedirs()
        self.notify("planned", {"batch_id": plan.batch_id, "files": len(plan.files), "bytes": plan.total_bytes,
                                "attempt": self.attempt, "location": self.location.url})
        return self.location

    def copy(self, plan: CheckpointPlan, listing: Mapping[str, FileStat]) -> dict[str, CopiedFile]:
        """Copy the plan in one pass, its files handed to the workers in the plan's order (sources first: the
        file-source log's window is the shortest; ``metadata`` last), no group waiting for the one before
        (a wait would cost a round trip per group on an object store). A file gone or replaced meanwhile is
        a race, however the copies interleave: each is of the version listed (``check_unchanged``)."""
        known = self.previous.known(plan) if self.previous is not None else {}
        on_file = None if self.quiet else lambda c: self.notify("file_done", {"path": c.path, "bytes": c.size})
        # the completed record's lock and read start with the copy's last wave (after the secondary copy, if any)
        options = CopyOptions(self.request.parallelism, self.request.copy_mode, any_store_checksum=True, on_file=on_file,
                              on_last_wave=self.catalog.lock_ahead if self.secondary_root is None else None)
        try:
            return copy_many(self.source, self.location, [f.path for f in plan.files], options, stats=listing, known=known)
        except FileNotFoundError as exc:
            raise CheckpointRaceError(f"a planned file vanished during the copy: {exc}") from exc
        except SourceChangedError as exc:
            raise CheckpointRaceError(f"a planned file was replaced during the copy: {exc}") from exc

    def verify(self, plan: CheckpointPlan, copied: dict[str, CopiedFile]) -> None:
        """Sizes, Spark's checksums and version tokens match the plan (see ``check_copied``, ``check_unchanged``)."""
        check_copied(plan, copied, self.location)
        check_unchanged(plan, copied, self.source)

    def copy_secondary(self, plan: CheckpointPlan, listing: Mapping[str, FileStat],
                       copied: dict[str, CopiedFile]) -> Store | None:
        """Copy the plan to the secondary location, every file checked against the primary's CRC32C.

        Linked on the same filesystem as the checkpoint, else streamed. Any failure drops it."""
        if self.secondary_root is None:
            return None
        savepoint_id = self.location.name
        secondary = self.secondary_root.child(savepoint_id)
        try:
            self.secondary_root.remove_tree(savepoint_id)  # what an earlier attempt left
            secondary.makedirs()
            got = copy_many(self.source, secondary, [f.path for f in plan.files], CopyOptions(self.request.parallelism),
                            stats=listing, algorithms={p: c.algorithm for p, c in copied.items()})
            wrong = [p for p, c in got.items() if (c.size, c.checksum) != (copied[p].size, copied[p].checksum)]
            if wrong:
                raise CheckpointRaceError(f"{len(wrong)} files differ from the primary copy, e.g. {wrong[0]}")
            return secondary
        except Exception as exc:  # noqa: BLE001 - the secondary copy is optional
            log.warning("dropping the secondary copy %s (%s)", secondary.url, exc)
            with contextlib.suppress(Exception):
                self.secondary_root.remove_tree(savepoint_id)
            return None

    def write_metadata(self, plan: CheckpointPlan, copied: dict[str, CopiedFile],
                       secondary: Store | None) -> SavepointManifest:
        """Write ``_metadata`` last (the savepoint is complete from then on), if the lease is still ours."""
        if not self.lease.still_held():
            raise SavepointInFlightError(
                f"the in-flight lease of job '{self.request.job}' was taken over while copying",
                "another trigger judged this one dead; retry later",
            )
        manifest = self.manifest(plan, copied, secondary)
        body = manifest.model_dump_json(indent=1).encode()
        self.location.write_bytes_atomic(MANIFEST_FILE, body)
        if secondary is not None:
            try:
                secondary.write_bytes_atomic(MANIFEST_FILE, body)
            except Exception as exc:  # noqa: BLE001 - the primary is complete; restore falls back to it
                log.warning("secondary copy %s of %s has no _metadata (%s); restore will use the primary",
                            secondary.url, self.location.url, exc)
        return manifest

    def manifest(self, plan: CheckpointPlan, copied: dict[str, CopiedFile], secondary: Store | None) -> SavepointManifest:
        request, versions = self.request, {f.path: f.version for f in plan.files}
        return SavepointManifest(
            savepoint_id=self.location.name, job=request.job, query_id=plan.query_id, batch_id=plan.batch_id,
            includes_next_offsets=plan.includes_next_offsets, includes_next_state=plan.includes_next_state,
            type=request.savepoint_type, reason=request.reason, request_id=request.request_id,
            created_at=datetime.now(UTC), tool_version=__version__,
            spark_version=request.spark_version, job_version=request.job_version,
            checkpoint=self.source.url, retired_checkpoint=request.retired_checkpoint,
            offset_log_version=plan.offset_log_version, commit_log_version=plan.commit_log_version,
            state_store=StateStoreSettings(
                provider=plan.state_store_provider, checkpoint_format_version=plan.checkpoint_format_version,
                changelog_checkpointing=plan.changelog_checkpointing, operators=plan.operators,
                partitions=formats.state_partitions(versions),
            ),
            source_offsets=plan.source_offsets, spark_conf=plan.spark_conf,
            format_version=PLAIN_MANIFEST_VERSION if {c.algorithm for c in copied.values()} <= {CRC32C}
            else MANIFEST_VERSION,
            files=[{"path": p, "size": c.size, "checksum": format(c.crc, HEX_FORMAT[c.algorithm]),  # validated in one call
                    "method": c.method,
                    "checksum_algorithm": None if c.algorithm == CRC32C else c.algorithm,
                    "checksum_source": c.checksum_source, "source_version": versions[p], "reused_from": c.reused_from}
                   for p, c in sorted(copied.items())],
            snapshot_files=plan.snapshots,
            total_bytes=sum([c.size for c in copied.values()]),
            attempts=self.attempt,
            secondary=secondary.url if secondary is not None else None,
        )

    def finish(self, manifest: SavepointManifest) -> SavepointInfo:
        """Record the completed savepoint in the catalog and announce it."""
        info = savepoint_info(self.location, manifest)
        try:  # once the record is written, the job's lease goes as the catalog's lock does
            if self._pin is not None:  # the pin goes in the same update
                self._pin.release(also=self.catalog.record_completed(manifest), then=self.lease.release)
            else:
                self.catalog.complete(manifest, then=self.lease.release)
        except Exception as exc:  # noqa: BLE001 - the savepoint is complete; the next trigger or retention records it
            log.warning("savepoint %s is complete but its catalog record was not updated (%s)", self.location.url, exc)
        self.notify("completed", info.summary())
        return info

    def record_failure(self, triggered_at: datetime, exc: Exception) -> None:
        """Keep the failed attempt in the job's history, when the job has a catalog already (a job
        name that does not exist yet gets no folder for it)."""
        try:
            if self.job_folder.exists(CATALOG_FILE):
                error = exc.message if isinstance(exc, SavepointError) else f"{type(exc).__name__}: {exc}"
                self.catalog.record_failure(self.location.name if self.location is not None else None,
                                            self.request.savepoint_type, triggered_at, error, self.request.reason)
        except Exception as failure:  # noqa: BLE001 - the original error is what the caller needs
            log.warning("could not record the failed savepoint of %s in its history (%s)", self.request.job, failure)

    def discard(self) -> None:
        """Remove this failed run's location, a ``_metadata`` it may have written included."""
        self.catalog.settle(quiet=True)  # the removal records itself in the catalog: a lock taken ahead goes first
        if self.location is not None:
            discard_incomplete(self.location, quiet=True, own_failed_run=True)


def run_savepoint(request: SavepointRequest, on_event: Notify | None = None) -> SavepointInfo:
    """Carry out ``request`` (see :func:`take_savepoint`); a failure after the plan is kept in the job's history.

    Between local disks, Python's cycle collector is paused meanwhile: such a savepoint allocates tens of
    thousands of objects in tens of milliseconds, none of them in a cycle it leaves behind, and each
    collection they would trigger walks every object of the process (in a scheduler's or worker's process,
    more work than the savepoint's own). Reference counting still frees everything; the collector is on
    again when the savepoint ends (left off if it was off)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        run, triggered_at = SavepointRun(request, on_event), datetime.now(UTC)
        if paused and not (run.source.is_local and run.root.is_local):
            gc.enable()  # an object store's savepoint waits on the network: no reason to pause it
            paused = False
        return _run(run, triggered_at)
    finally:
        if paused:
            gc.enable()


def _run(run: SavepointRun, triggered_at: datetime) -> SavepointInfo:
    done = run.already_taken()
    if done is not None:
        run.notify("reused", {"pointer": done.pointer})
        return done
    run.plan_first()  # bad input fails here and changes nothing: not an attempt kept in the history
    try:
        done = run.wait_for_lease()
        if done is not None:
            return done
        try:
            return run.take()
        finally:
            run.lease.release()
    except (SavepointInFlightError, StorageFullError):
        raise  # another request's savepoint is under way; a full store gets no more writes (nothing changed)
    except Exception as exc:
        run.record_failure(triggered_at, exc)
        raise
    finally:
        run.catalog.settle(quiet=True)  # its unlocks under way, a lock taken ahead and unused


def take_savepoint(checkpoint: str | Store, job: str, *, on_event: Notify | None = None, **options: Any) -> SavepointInfo:
    """Take a savepoint of the newest committed batch of ``checkpoint`` for ``job``.

    ``options`` are the other fields of :class:`SavepointRequest`. With ``request_id``, a retried
    call returns the savepoint already taken for that id. Files are hard-linked when checkpoint and
    savepoint share a local filesystem, copied inside the store on S3, streamed otherwise
    (``copy_mode="stream"`` always streams). With ``incremental``, files that the job's previous
    savepoint already holds unchanged (same size and version token) are taken from it with their
    recorded checksum, the previous savepoint pinned meanwhile.

    With ``secondary_dir`` (typically local disk of the worker, after Flink's task-local
    recovery), a secondary copy is written in the same pass to ``<secondary_dir>/<job>/<id>/``,
    checked file by file against the primary's checksums; restore prefers it when it is intact.
    A secondary copy that fails is dropped with a warning; the savepoint does not fail for it.
    """
    return run_savepoint(SavepointRequest.of("take_savepoint", checkpoint=checkpoint, job=job, **options), on_event)


def check_copied(plan: CheckpointPlan, copied: dict[str, CopiedFile], location: Store) -> None:
    """Sizes as listed and as promised, and Spark's own CRC32C sidecars, match what was copied."""
    for planned in plan.files:
        got = copied[planned.path]
        if got.source_version is not None and got.source_version != planned.version:
            raise CheckpointRaceError(f"{planned.path} was replaced between listing and copying")
        if got.size != planned.size:
            raise CheckpointRaceError(f"{planned.path} changed size during the copy ({planned.size} -> {got.size})")
        if planned.expected_size is not None and got.size != planned.expected_size:
            raise CheckpointRaceError(
                f"{planned.path} has {got.size} bytes but its snapshot lists {planned.expected_size}"
            )
        if planned.sidecar_of:
            sidecar = formats.parse_spark_sidecar(location.read_known(planned.path, "spark_log"), planned.path)
            main = copied[planned.sidecar_of]
            crc = main.crc if main.algorithm == CRC32C else checksum_of(location, planned.sidecar_of)[1]
            if sidecar.value != crc or sidecar.main_file_size not in (-1, main.size):
                raise CheckpointRaceError(f"{planned.sidecar_of} does not match its Spark checksum file")


def check_unchanged(plan: CheckpointPlan, copied: dict[str, CopiedFile], source: Store) -> None:
    """Files copied without a known source version (a streamed read of an object store, where a
    replacement mid-read could mix two objects' bytes) must still be as planned after the copy.

    Every other copy already proved it holds the planned version: a link or a local read records
    the inode it got (``check_copied`` compares it), a server-side copy was made only from the
    listed ETag, and a reused file is the previous savepoint's copy of that same version."""
    unproven = [f for f in plan.files if copied[f.path].source_version is None]
    if not unproven:
        return
    relisted = source.stat_files(f.path for f in unproven)
    for planned in unproven:
        now = relisted.get(planned.path)
        if now is None:
            raise CheckpointRaceError(f"{planned.path} was deleted during the copy")
        if (now.size, now.version) != (planned.size, planned.version):
            raise CheckpointRaceError(f"{planned.path} was replaced during the copy")
