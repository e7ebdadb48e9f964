"""Restore savepoints into fresh checkpoint locations (``verify_savepoint``: core/verify.py).

Restore copies every file into the new checkpoint location the way a savepoint does (a hard link on
one local filesystem, a server-side copy on S3, else streamed; ``core/copier.py``) and checks each
file's CRC32C against the manifest; a file that does not match aborts the restore and removes what
was written. Absolute paths Spark stores (transformWithState schema file paths) are rewritten
to the new location; the checkpoint's ``metadata`` (the query id) is written last. The savepoint
itself is only read.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import posixpath
import re
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import google_crc32c
from pydantic import Field

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.catalog import Catalog, pinned_savepoint
from airflow_savepoints.core.copier import CopyMode, CopyOptions, copy_many
from airflow_savepoints.core.input_check import check_input
from airflow_savepoints.core.lease import Lease
from airflow_savepoints.core.manifest import parse_manifest, refuse_symlinks, resolve_pointer
from airflow_savepoints.core.models import FileEntry, Notify, Request, RestoreResult, SavepointManifest
from airflow_savepoints.core.names import (
    CHECKPOINT_METADATA,
    CLOCK_PROBE_PREFIX,
    LEASE_BREAK_SUFFIX,
    MANIFEST_FILE,
    RESTORE_CLAIM,
)
from airflow_savepoints.core.rescale import RescalePlan, plan_rescale, repartition
from airflow_savepoints.core.settings import parse_duration
from airflow_savepoints.core.verify import bytes_mismatch as _bytes_mismatch
from airflow_savepoints.core.verify import mismatch as _mismatch
from airflow_savepoints.core.verify import verify_savepoint  # noqa: F401 - imported from here too
from airflow_savepoints.errors import (
    InvalidInputError,
    SavepointTooOldError,
    SinkAheadError,
    SinkRepeatsError,
    StorageError,
    TargetClaimedError,
    TargetNotEmptyError,
    VerificationError,
)
from airflow_savepoints.sinks import DeltaSink, FileSink, Sink, SinkReport, file_sink_latest_batch, sink_for
from airflow_savepoints.storage import FileStat, Store
from airflow_savepoints.storage.store import SourceChangedError

OPERATOR_METADATA_V2 = "/_metadata/v2/"
log = logging.getLogger(__name__)


def check_sink(manifest: SavepointManifest, sink_path: str, storage_options: dict[str, Any] | None,
               committed_only: bool = False) -> None:
    """Refuse a restore that a file sink would silently skip (its log is past the savepoint).

    ``committed_only``: the restore leaves the savepoint's planned batch N+1 out (a rescale), so a sink
    holding N+1 would get that batch's output again: refused too."""
    latest = file_sink_latest_batch(Store(sink_path, storage_options))
    if committed_only and latest == manifest.batch_id + 1 and manifest.includes_next_offsets:
        raise SinkAheadError(
            f"the file sink at {sink_path} already holds batch {latest}, the savepoint's planned but uncommitted "
            "batch: a rescale leaves that batch out of the restored checkpoint and reads its input again after the "
            "repartition batch, so the sink would get its output twice",
            "restore without state_partitions (--state-partitions): Spark re-runs that batch and the sink skips it; "
            "then take a new savepoint once the job has committed a batch and rescale that one; nothing was restored",
        )
    # With offsets/N+1 and complete state N+2, a sink that already holds N+1 is what Spark's own
    # crash recovery handles: N+1 re-runs with the same offsets and the sink skips it safely.
    allowed = manifest.batch_id + 1 if manifest.includes_next_offsets and manifest.includes_next_state \
        else manifest.batch_id
    if latest is not None and latest > allowed:
        raise SinkAheadError(
            f"the file sink at {sink_path} already holds batch {latest}, past the savepoint's batch "
            f"{manifest.batch_id}: Spark would skip batches {allowed + 1}..{latest} as already "
            "committed, silently dropping their new output, and a stateful query would then fail on missing state",
            "restore a savepoint at batch >= " + str(latest) + ", or point the restored job at a new "
            "output path (and its own checkpoint), or remove the sink's output after batch "
            f"{manifest.batch_id} yourself",
        )


def _allowed(manifest: SavepointManifest, committed_only: bool) -> int:
    """The highest batch a skipping sink may hold: N, or N+1 when the savepoint plans N+1 with its offsets and
    complete state (Spark re-runs N+1 with the same offsets and the sink skips it, as in its own crash recovery)."""
    return manifest.batch_id + 1 if manifest.includes_next_offsets and manifest.includes_next_state and not committed_only \
        else manifest.batch_id


def _span(first: int, last: int | None) -> list[int] | None:
    return [first, last] if last is not None and last >= first else None


def _repartition_unrecorded(request: RestoreRequest, n: int) -> str:
    """What a rescale means for a sink not named as a file sink (empty without a rescale)."""
    if request.state_partitions is None:
        return ""
    return (f". The rescale adds Spark's repartition batch {n + 1} to the checkpoint only: a file sink not named here "
            "gets no entry for it in its _spark_metadata log, and the sink's next compaction fails "
            "(BATCH_METADATA_NOT_FOUND); name the sink (--sink-path, sink_path=, the jobs file's sink:)")


def plan_sink(manifest: SavepointManifest, request: RestoreRequest, committed_only: bool = False) -> SinkReport:
    """What the sink will see of the batches the restored run runs again, checked before anything is written.

    Refused: a skipping sink (file, Delta) past the savepoint (``sink_ahead``); ``reprocess`` while the rows of the
    batches it would write again are still in the Delta table (``sink_ahead``); an at-least-once sink with
    ``rerun_until`` M > N unless ``allow_repeats`` (``sink_repeats``)."""
    sink = sink_for(request.sink_kind, request.sink_path, request.sink_storage_options, request.sink_app_id)
    n, until = manifest.batch_id, request.rerun_until
    if request.reprocess and not (isinstance(sink, DeltaSink) and sink.on_rerun == "skipped"):
        raise InvalidInputError(
            f"reprocess is for a Delta sink (it gives the restored query a new id, so Delta writes the batches it would "
            f"skip), not a {sink.kind if sink else 'missing'} sink",
            "declare the Delta table (--sink-path P --sink-kind delta), or restore without --reprocess; nothing was restored")
    if sink is None:
        rerun = _span(n + 1, until)
        return SinkReport(kind="unknown", rerun=rerun, on_rerun="unknown", detail=(
            f"no sink was given: what it does with batches {rerun[0]}..{rerun[1]}, which the restored run runs again, is "
            "not checked" if rerun else "no sink was given: what it does with batches the restored run runs again is not checked")
            + _repartition_unrecorded(request, n))
    if isinstance(sink, FileSink):
        check_sink(manifest, sink.path or "", sink.storage_options, committed_only=committed_only)
        recorded = sink.recorded_batch(manifest.query_id)
        return _skipping_report(sink, n, recorded, until, f"batches its _spark_metadata log holds (up to {recorded})"
                                if recorded is not None else "nothing: its log is empty")
    if isinstance(sink, DeltaSink) and sink.on_rerun == "skipped":
        return _plan_delta(manifest, sink, request, committed_only)
    rerun = _span(n + 1, until)
    if sink.on_rerun == "unknown":
        return SinkReport(kind=sink.kind, rerun=rerun, on_rerun="unknown", detail=(
            f"the {sink.describe()} is of a kind not checked here: the restored run runs batches {rerun[0]}..{rerun[1]} again "
            "and what the sink does with them is unknown" if rerun else
            f"the {sink.describe()} is of a kind not checked here; no batch after {n} is known to have run")
            + _repartition_unrecorded(request, n))
    if rerun and not request.allow_repeats:
        count = rerun[1] - rerun[0] + 1
        raise SinkRepeatsError(
            f"the {sink.describe()} records no batch ids, so the restored run writes batches {rerun[0]}..{rerun[1]} "
            f"({count} batch{'es' if count > 1 else ''}) to it again: the job already ran to batch {until} and the "
            f"savepoint is at batch {n}",
            f"restore a savepoint at batch >= {until}, or accept the {count} repeated batches with --allow-repeats "
            "(allow_repeats=True); nothing was restored")
    return SinkReport(kind=sink.kind, rerun=rerun, on_rerun="written_again", recorded_batch=None, detail=(
        f"the {sink.describe()} gets batches {rerun[0]}..{rerun[1]} again (at least once: duplicates of their output, "
        "accepted)" if rerun else
        f"the {sink.describe()} writes again any batch after {n} that already ran; none is known (rerun_until not given "
        f"or <= {n})"))


def _skipping_report(sink: Sink, n: int, recorded: int | None, until: int | None, holds: str) -> SinkReport:
    last = max(x for x in (recorded, until, n) if x is not None)
    rerun = _span(n + 1, last)
    return SinkReport(kind=sink.kind, rerun=rerun, on_rerun="skipped", recorded_batch=recorded, detail=(
        f"the {sink.describe()} holds {holds}: the restored run runs batches {rerun[0]}..{rerun[1]} again and the sink "
        "skips each batch it already recorded (exactly once)" if rerun else
        f"the {sink.describe()} holds {holds}: no batch after {n} ran, nothing is run again"))


def _plan_delta(manifest: SavepointManifest, sink: DeltaSink, request: RestoreRequest, committed_only: bool) -> SinkReport:
    """A Delta table (a ``format("delta")`` sink, or ``foreachBatch`` with ``txnAppId``): its txn version for the
    savepoint's query id (or the declared appId) against the savepoint's batch."""
    n, qid = manifest.batch_id, manifest.query_id
    txn = sink.recorded_batch(qid)
    app = sink.app_id_for(qid)
    version = sink.snapshot().version if sink.log.exists() else None
    if request.reprocess:
        if not sink.follows_query_id:
            raise InvalidInputError(
                f"reprocess gives the restored query a new id, but the {sink.describe()} records its batches under the "
                f"fixed appId {app!r}, which a new query id does not change: Delta would still skip them",
                "let the job's foreachBatch write the re-run batches under a new txnAppId (and declare it), or restore a "
                "later savepoint; nothing was restored")
        if txn is not None and txn > n:
            still, why = sink.rows_still_there(qid, n + 1, txn)
            if still is not False:
                raise SinkAheadError(
                    f"reprocess would write batches {n + 1}..{txn} to the Delta table at {sink.path} again, but {why}: "
                    "their rows would be there twice",
                    f"RESTORE the table to a version before batch {n + 1}'s commit first, or restore a savepoint at batch "
                    f">= {txn} without --reprocess; nothing was restored")
            rerun = _span(n + 1, max(txn, request.rerun_until or txn))
            return SinkReport(kind=sink.kind, rerun=rerun, on_rerun="written_again", recorded_batch=txn, detail=(
                f"reprocess: the restored query gets a new id, so the Delta table at {sink.path} (version {version}, txn "
                f"{txn} for the old query id) writes batches {rerun[0]}..{rerun[1]} again; {why}"))
        rerun = _span(n + 1, request.rerun_until)
        return SinkReport(kind=sink.kind, rerun=rerun, on_rerun="written_again", recorded_batch=txn, detail=(
            f"reprocess: the restored query gets a new id; the Delta table at {sink.path} recorded no batch after {n} "
            f"for the old one (txn {txn}), so nothing is written twice"))
    allowed = _allowed(manifest, committed_only)
    if txn is not None and txn > allowed:
        commit = sink.log.txn_commits(app, allowed + 1, allowed + 1, version or 0).get(allowed + 1)
        before = f" (to version {commit.version - 1}, before batch {allowed + 1}'s commit {commit.version})" if commit else ""
        raise SinkAheadError(
            f"the Delta table at {sink.path} (version {version}) recorded txn {txn} for appId {app}, past the savepoint's "
            f"batch {n}: Delta would skip batches {allowed + 1}..{txn} as already written, silently dropping their new "
            "output, and a stateful query would then fail on missing state",
            f"restore a savepoint at batch >= {txn}; or, to write those batches again (a bug fix), RESTORE the table{before} "
            "and restore with --reprocess (reprocess=True: a new query id); nothing was restored")
    return _skipping_report(sink, n, txn, request.rerun_until,
                            f"txn {txn} for appId {app} (table version {version})" if txn is not None else
                            f"no txn for appId {app}" + (f" (table version {version})" if version is not None else " (no table yet)"))


SPARK_MAX_INT = 2**31 - 1  # a partition count is a Java int
MAX_SANE_STATE_PARTITIONS = 10_000  # docs/evolve.md; above it only with many_state_partitions

class RestoreRequest(Request):
    """What a caller asks of :func:`restore_savepoint` (its keyword arguments are these fields)."""

    pointer: str
    target: str
    new_query_id: bool = False
    sink_path: str | None = None
    storage_options: dict[str, Any] | None = None
    target_storage_options: dict[str, Any] | None = None
    sink_storage_options: dict[str, Any] | None = None
    sink_kind: str | None = None  # sinks.KINDS; None with a sink_path: a file sink (a Delta table if it holds _delta_log)
    sink_app_id: str | None = None  # a foreach_batch sink's Delta txnAppId ("query_id": the query id)
    reprocess: bool = False  # Delta: a new query id, so the batches it recorded are written again (their rows must be gone)
    rerun_until: int | None = Field(default=None, ge=0)  # M: the job's last committed batch, if the caller knows it
    allow_repeats: bool = False  # restore though an at-least-once sink gets batches N+1..M again
    parallelism: int | None = Field(default=None, ge=1)  # None: copier.default_parallelism
    copy_mode: CopyMode = "auto"
    prefer_secondary: bool = True
    secondary_storage_options: dict[str, Any] | None = None
    max_age: str | None = None  # refuse a savepoint older than this ("12h", "7d")
    skip_missing_input: bool = False  # restore even if input files a file source will re-read (or Kafka records) are gone
    input_storage_options: dict[str, Any] | None = None  # for a file source's input files
    kafka_bootstrap_servers: str | None = None  # the brokers of the Kafka topics the savepoint resumes (checked first)
    kafka_options: dict[str, Any] | None = None  # kafka-python client options for them (security_protocol, sasl_*, ...)
    # rescale the state into this many partitions (Spark 4.2+): an int Spark takes (2^31 - 1 at most), and at
    # most MAX_SANE_STATE_PARTITIONS unless many_state_partitions (each partition is a store Spark opens)
    state_partitions: int | None = Field(default=None, ge=1, le=SPARK_MAX_INT)
    many_state_partitions: bool = False
    spark_session: Any = None  # the SparkSession that rescales (None: the active one, else a local one)
    # runs the rescale elsewhere instead (a job's rescale application: jobs/workflows/rescale.py), called as
    # rescaler(destination, plan, manifest, conf, file_sink) -> (repartition batch, partitions after)
    rescaler: Any = None


def check_state_partitions(request: RestoreRequest) -> None:
    """Refuse a partition count beyond the sane bound before Spark starts, unless the caller insists."""
    if request.state_partitions and request.state_partitions > MAX_SANE_STATE_PARTITIONS \
            and not request.many_state_partitions:
        raise InvalidInputError(
            f"invalid state_partitions: {request.state_partitions} is over {MAX_SANE_STATE_PARTITIONS} (each partition "
            "is a state store every batch opens)",
            "pass fewer partitions, or insist with --many-state-partitions (many_state_partitions=True)")


def check_age(location: Store, manifest: SavepointManifest, max_age: str | None) -> None:
    """Refuse a savepoint older than ``max_age`` (``None``: no limit)."""
    if max_age is None:
        return
    age = manifest.age_seconds()
    if age > parse_duration(max_age):
        raise SavepointTooOldError(
            f"savepoint {location.url} is {age / 3600:.1f} h old, older than max_age {max_age}",
            "take a fresh savepoint, raise max_age, or leave it out to restore this one; nothing was restored",
        )


def restore_savepoint(pointer: str, target: str, *, on_event: Notify | None = None, **options: Any) -> RestoreResult:
    """Materialise the savepoint at ``pointer`` into the fresh, empty checkpoint location ``target``.

    ``options`` are the other fields of :class:`RestoreRequest`. Files are hard-linked when
    savepoint and target share a local filesystem (Spark never writes a checkpoint file in place,
    so the savepoint stays unmodified), copied inside the store on S3, streamed otherwise
    (``copy_mode="stream"`` always streams); every file's CRC32C is checked against the manifest
    either way (read from the linked inode, or computed by the store).

    Refused before anything is written: a savepoint older than ``max_age``; a sink past it or one that would get
    batches again (``sink_path``, ``sink_kind``, ``sink_app_id``, ``rerun_until``, ``allow_repeats``, ``reprocess``:
    :func:`plan_sink`, reported in the result's ``sink``); input files a file source will read again that are gone,
    or Kafka records its Kafka sources would start at that were deleted, asked of ``kafka_bootstrap_servers`` (unless
    ``skip_missing_input``; see ``core/input_check.py``).

    ``state_partitions=N`` rescales the state: after the copy, Spark's offline repartition (Spark 4.2+,
    RocksDB state; ``core/rescale.py``) rewrites the COPY into N partitions, in ``spark_session`` (else the
    active session, else a local one), or through ``rescaler`` (a job's own Spark application, submitted to
    its master: ``jobs/workflows/rescale.py``). A savepoint's planned, uncommitted batch is left out of the copy
    (Spark repartitions only a checkpoint whose last batch committed). Already N partitions: restored
    as usual (``rescaled`` False). Refused before anything is copied: HDFS-backed state, no Spark 4.2;
    a failure in Spark's rewrite removes everything from the target (the savepoint is only read).

    If the savepoint has a secondary copy (``take_savepoint(secondary_dir=...)``) that exists here
    and is the same savepoint, it is restored from instead, every file checked against the
    primary's manifest; any problem with it falls back to the primary.

    ``on_event("planned", {files, bytes})`` then ``on_event("file_done", {path, bytes})`` per file report progress."""
    request: RestoreRequest = RestoreRequest.of("restore_savepoint", pointer=pointer, target=target, **options)
    check_state_partitions(request)
    location, manifest = resolve_pointer(pointer, request.storage_options)
    refuse_symlinks(location, "savepoint")
    check_age(location, manifest, request.max_age)
    rescale = plan_rescale(manifest, request.state_partitions, location.url, local=request.rescaler is None) \
        if request.state_partitions else None
    destination = _fresh_target(location, Store(target, request.target_storage_options))
    sink = plan_sink(manifest, request, committed_only=bool(rescale and rescale.trailing))
    if request.reprocess:
        request = request.model_copy(update={"new_query_id": True})
    if not request.skip_missing_input:
        check_input(location, manifest, request.input_storage_options, request.kafka_bootstrap_servers,
                    request.kafka_options)
    # on an object store the primary's listing runs while the restore claims its target and pins the savepoint
    # (a savepoint being disposed cannot be pinned; every file copied is checked against the manifest anyway)
    catalog = Catalog(location.parent(), manifest.job, overlap_lock=not location.is_local)  # the pin's unlocks overlap
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="restore-listing") as pool:
        listed = None if location.is_local or (request.prefer_secondary and manifest.secondary) else \
            pool.submit(location.list_files)
        with claimed_and_pinned(destination, location, manifest, catalog):
            secondary = _usable_secondary(manifest, request.secondary_storage_options) if request.prefer_secondary else None
            if secondary is not None:
                try:
                    result = _restore_pinned(secondary, manifest, destination, request, on_event, rescale)
                    return result.model_copy(update={"pointer": location.url, "restored_from": secondary.url, "sink": sink})
                except (VerificationError, FileNotFoundError, StorageError) as exc:
                    log.warning("the secondary copy %s is not usable (%s); restoring from the primary %s",
                                secondary.url, getattr(exc, "message", exc), location.url)
            result = _restore_pinned(location, manifest, destination, request, on_event, rescale, listed)
            return result.model_copy(update={"restored_from": location.url, "sink": sink})


def _fresh_target(location: Store, destination: Store) -> Store:
    """The restore target: a real folder (or nothing yet) apart from the savepoint, and empty."""
    link_target = destination.symlink_target()
    if link_target is not None:
        raise TargetNotEmptyError(
            f"the restore target {destination.url} is a symbolic link (to {link_target})",
            "give the real path of a new, empty checkpoint location",
        )
    real_location, real_destination = location.resolved(), destination.resolved()
    if location.contains(destination) or destination.contains(location) or \
            real_location.contains(real_destination) or real_destination.contains(real_location):
        raise InvalidInputError(
            f"the restore target {destination.url} overlaps the savepoint {location.url}",
            "restore into a new checkpoint location outside the savepoint directory",
        )
    _refuse_file_or_files(destination)
    return destination


def _refuse_file_or_files(destination: Store) -> None:
    """Refuse a target that is a file or holds files; on an object store both are asked together."""
    is_a_file = TargetNotEmptyError(f"the restore target {destination.url} is a file", "choose a new folder")
    if destination.is_local:
        if destination.isfile():
            raise is_a_file
        _check_empty(destination)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="restore-target") as pool:
        is_file = pool.submit(destination.isfile)
        try:
            _check_empty(destination)
        except TargetNotEmptyError:
            if is_file.result():  # a file there is what to say first
                raise is_a_file from None
            raise
        if is_file.result():
            raise is_a_file


CLAIM_FILE = RESTORE_CLAIM
_HELPER_FILE = re.compile("^(" + "|".join((  # a clock probe, a claim's temp files, its break lock
    re.escape(CLOCK_PROBE_PREFIX) + r"[0-9a-f]{32}\.tmp",
    r"\." + re.escape(CLAIM_FILE) + f"({re.escape(LEASE_BREAK_SUFFIX)})?" + r"\.[0-9a-f]{32}\.tmp",
    re.escape(CLAIM_FILE + LEASE_BREAK_SUFFIX),
)) + ")$")
CLAIM_STALE_AFTER = 60.0


def _check_empty(destination: Store, claim: Lease | None = None) -> None:
    """Refuse a target holding any file but a restore's claim and its helpers."""
    existing = sorted(p for p in destination.list_files() if p != CLAIM_FILE and not _HELPER_FILE.match(p))
    if existing:
        raise TargetNotEmptyError(
            f"the restore target {destination.url} is not empty ({len(existing)} files, e.g. {existing[0]})",
            "restore into a new, empty checkpoint location; nothing was changed",
        )


@contextlib.contextmanager
def claimed(destination: Store) -> Iterator[Lease]:
    """Claim the target for this restore (the lease ``_restore.lease``, created atomically and
    exclusively, carrying the restore's id) before anything is written; a second restore into it
    fails at once. Released when the restore ends, whatever the outcome."""
    claim = Lease(destination, CLAIM_FILE, token=f"restore-{uuid.uuid4().hex}", stale_after=CLAIM_STALE_AFTER)
    holder = claim.try_acquire()
    if holder is not None:
        raise TargetClaimedError(
            f"the restore target {destination.url} is claimed by another restore ({holder.token or 'unreadable claim'}, "
            f"{holder.owner or 'unknown owner'})",
            "restore into another new, empty checkpoint location; nothing was changed",
        )
    try:
        claim.start_heartbeat()
        _check_empty(destination)  # a restore that finished just before our claim: its files are there
        yield claim
    finally:
        if claim.written:  # not given back already (claimed_and_pinned)
            _release_claim(claim, destination)


def _release_claim(claim: Lease, destination: Store) -> None:
    try:
        claim.release()
    except Exception as exc:  # noqa: BLE001 - a claim left behind goes stale by itself
        log.warning("could not release the claim %s (%s)", destination.url_of(CLAIM_FILE), exc)


@contextlib.contextmanager
def claimed_and_pinned(destination: Store, location: Store, manifest: SavepointManifest, catalog: Catalog) -> Iterator[None]:
    """The target claimed, then the savepoint pinned in ``catalog`` (see ``claimed``, ``pinned_savepoint``); when the
    restore ends the claim is given back while the pin is (neither waits for the other: a target and a catalog),
    and both are done when this ends."""
    with claimed(destination) as claim, ThreadPoolExecutor(max_workers=1, thread_name_prefix="restore-claim") as pool:
        released = None
        try:
            with pinned_savepoint(location, manifest, "restore", catalog):
                try:
                    yield
                finally:
                    released = pool.submit(_release_claim, claim, destination)
        finally:
            if released is not None:
                released.result()  # before ``claimed`` looks whether the claim is still held
            catalog.settle(quiet=True)  # the unpin's unlock, under way beside the claim's release


def _usable_secondary(manifest: SavepointManifest, storage_options: dict[str, Any] | None) -> Store | None:
    """The manifest's secondary copy if it is reachable here and its ``_metadata`` is the same savepoint's."""
    if not manifest.secondary:
        return None
    try:
        secondary = Store(manifest.secondary, storage_options)
        copy = parse_manifest(secondary.read_known(MANIFEST_FILE, "manifest"), secondary.url_of(MANIFEST_FILE))
    except Exception as exc:  # noqa: BLE001 - absent on this machine, unreadable: use the primary
        log.info("secondary copy %s not used (%s)", manifest.secondary, getattr(exc, "message", exc))
        return None
    same = (copy.savepoint_id, copy.query_id, copy.batch_id, [(e.path, e.size, e.checksum) for e in copy.files]) == \
        (manifest.savepoint_id, manifest.query_id, manifest.batch_id, [(e.path, e.size, e.checksum) for e in manifest.files])
    return secondary if same else None


def _restore_pinned(location: Store, manifest: SavepointManifest, destination: Store, request: RestoreRequest,
                    on_event: Notify | None = None, rescale: RescalePlan | None = None,
                    listed: Future[dict[str, FileStat]] | None = None) -> RestoreResult:
    """Copy and check the savepoint's files, rewrite the paths Spark stores, write ``metadata`` last, then
    rescale the copy if asked; on any failure remove what was written (Spark's files too). ``listed``:
    the location's listing, under way."""
    before = manifest.state_partitions()
    if rescale is not None and rescale.trailing:  # the planned, uncommitted batch stays out of the copy
        kept = [e for e in manifest.files if e.path not in rescale.trailing]
        manifest = manifest.model_copy(update={"files": kept, "total_bytes": sum(e.size for e in kept)})
    listing = location.list_files() if listed is None else listed.result()
    missing = [e.path for e in manifest.files if e.path not in listing]
    if missing:
        raise VerificationError(
            f"savepoint {location.url} is damaged: {', '.join(missing[:10])} missing",
            "do not restore it; use another savepoint of the job",
        )
    notify = on_event or (lambda event, data: None)
    try:
        _copy_checked(location, manifest, destination, request, listing, notify)
        rewritten = [e.path for e in manifest.files if _rewritable(e.path)]
        for entry in manifest.files:
            if _rewritable(entry.path):
                _restore_rewritten(location, destination, entry, manifest)
        query_id = _write_identity(location, manifest, destination, request.new_query_id)
        _check_complete(destination, manifest, rewritten)
        rescaled, after = None, before
        if rescale is not None and not rescale.noop:
            notify("rescaling", {"partitions": rescale.partitions})
            rescaler = request.rescaler or functools.partial(repartition, spark=request.spark_session)
            rescaled, after = rescaler(destination, rescale, manifest, spark_conf_to_set(manifest), file_sink=_file_sink(request))
    except BaseException:
        _undo(destination, [e.path for e in manifest.files if e.path != MANIFEST_FILE] + _unclaimed(destination))
        raise
    return RestoreResult(
        pointer=location.url, checkpoint=destination.url, batch_id=manifest.batch_id, query_id=query_id,
        new_query_id=request.new_query_id, files=len(manifest.files), bytes=manifest.total_bytes,
        rewritten=rewritten, state_store=manifest.state_store, spark_conf_to_set=spark_conf_to_set(manifest),
        partitions_before=before, partitions_after=after, rescaled=rescaled is not None, repartition_batch_id=rescaled,
        dropped_trailing_batch=manifest.batch_id + 1 if rescale is not None and rescale.trailing else None,
    )


def _copy_checked(location: Store, manifest: SavepointManifest, destination: Store, request: RestoreRequest,
                  listing: Mapping[str, FileStat], notify: Notify) -> None:
    """Copy every file but ``metadata`` and the rewritten ones, each checked against the manifest."""
    body = [e for e in manifest.files
            if e.path not in (CHECKPOINT_METADATA, MANIFEST_FILE) and not _rewritable(e.path)]
    notify("planned", {"files": len(body), "bytes": sum(e.size for e in body)})
    try:
        options = CopyOptions(request.parallelism, request.copy_mode,
                              on_file=lambda c: notify("file_done", {"path": c.path, "bytes": c.size}))
        copied = copy_many(location, destination, [e.path for e in body], options, stats=listing,
                           algorithms={e.path: e.algorithm for e in body})
    except (SourceChangedError, FileNotFoundError) as exc:
        raise VerificationError(f"savepoint {location.url} changed while it was restored: {exc}",
                                "nothing was restored; retry, or use another savepoint of the job") from exc
    _raise_if([_mismatch(e, copied[e.path].size, copied[e.path].crc) for e in body], location)


def _file_sink(request: RestoreRequest) -> Store | None:
    """The job's file sink (``sink_path`` holding a ``_spark_metadata`` log), if the restore was given one."""
    if not request.sink_path:
        return None
    sink = Store(request.sink_path, request.sink_storage_options)
    return sink if file_sink_latest_batch(sink) is not None else None


def _write_identity(location: Store, manifest: SavepointManifest, destination: Store, new_query_id: bool) -> str:
    """Write the checkpoint's ``metadata`` (its query id, a new one if asked), last; returns the query id."""
    entry = next(e for e in manifest.files if e.path == CHECKPOINT_METADATA)
    data = location.read_known(CHECKPOINT_METADATA, "spark_metadata")
    _raise_if([_bytes_mismatch(entry, data)], location)
    query_id = manifest.query_id
    if new_query_id:
        query_id = str(uuid.uuid4())
        data = json.dumps({"id": query_id}).encode() + b"\n"
    destination.write_bytes_atomic(CHECKPOINT_METADATA, data)
    return query_id


def spark_conf_to_set(manifest: SavepointManifest) -> dict[str, str]:
    """Settings Spark does not persist in the checkpoint; the restarted query must use them."""
    conf = {"spark.sql.streaming.stateStore.checkpointFormatVersion":
            str(manifest.state_store.checkpoint_format_version)}
    if manifest.state_store.changelog_checkpointing is not None and manifest.state_store.provider and \
            "RocksDB" in manifest.state_store.provider:
        conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = \
            str(manifest.state_store.changelog_checkpointing).lower()
    return conf


def _raise_if(problems: list[str | None], location: Store) -> None:
    problems = [p for p in problems if p]
    if problems:
        raise VerificationError(
            f"savepoint {location.url} is damaged: " + "; ".join(problems[:10]),
            "nothing was restored; use another savepoint of the job",
        )


def _rewritable(path: str) -> bool:
    """transformWithState operator metadata v2 (and its Spark checksum file) holds absolute paths."""
    main = path[: -len(formats.SPARK_SIDECAR_SUFFIX)] if path.endswith(formats.SPARK_SIDECAR_SUFFIX) else path
    return path.startswith("state/") and OPERATOR_METADATA_V2 in main and main.rsplit("/", 1)[-1].isdigit()


def _restore_rewritten(location: Store, destination: Store, entry: FileEntry, manifest: SavepointManifest) -> None:
    if entry.path.endswith(formats.SPARK_SIDECAR_SUFFIX):
        return  # regenerated together with its main file below
    data = location.read_known(entry.path, "spark_log")
    _raise_if([_bytes_mismatch(entry, data)], location)
    op = entry.path.split("/")[1]
    new = formats.rewrite_schema_file_paths(data, destination.spark_url_of("state"), op, entry.path)
    destination.write_bytes_atomic(entry.path, new)
    sidecar = entry.path + formats.SPARK_SIDECAR_SUFFIX
    if any(e.path == sidecar for e in manifest.files):
        old = location.read_json(sidecar, "spark_log")
        crc = google_crc32c.value(new)
        old["value"] = crc - (1 << 32) if crc >= (1 << 31) else crc  # Spark stores a signed int32
        old["mainFileSize"] = len(new)
        destination.write_bytes_atomic(sidecar, json.dumps(old, separators=(",", ":")).encode())


def _undo(destination: Store, paths: list[str]) -> None:
    """Remove what this restore wrote (``paths``: the manifest's files), nothing else."""
    for path in paths:
        try:
            destination.remove_file(path)
        except Exception:  # noqa: BLE001 - best effort; the error that caused the undo is raised
            pass
    folders = {posixpath.dirname(p) for p in paths}  # the folders it made, if nothing else is in them
    destination.remove_empty_folders({f for p in folders for f in _ancestors(p)})


def _unclaimed(destination: Store) -> list[str]:
    """Every file in the target but the restore's claim: the target was empty when claimed, so these are
    this restore's and Spark's (a failed rescale); [] if it cannot be listed."""
    try:
        return [p for p in destination.list_files() if p != CLAIM_FILE and not _HELPER_FILE.match(p)]
    except Exception:  # noqa: BLE001 - best effort, as _undo is
        return []


def _ancestors(folder: str) -> list[str]:
    parts = folder.split("/") if folder else []
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _check_complete(destination: Store, manifest: SavepointManifest, rewritten: list[str]) -> None:
    """The target holds every file of the savepoint at its size (rewritten files: present)."""
    listing = destination.list_files()
    problems = [e.path for e in manifest.files if e.path != MANIFEST_FILE and (
        e.path not in listing or (e.path not in rewritten and e.path != CHECKPOINT_METADATA and listing[e.path].size != e.size))]
    if problems:
        raise VerificationError(
            f"the restore target {destination.url} is incomplete after the copy: {', '.join(problems[:10])}",
            "nothing usable was restored; retry into a new, empty checkpoint location",
        )
