"""Take a savepoint of a (running) Spark streaming query.

One attempt: list the live checkpoint once, plan committed batch N, copy the plan into a fresh
``savepoint-<id6>-<random>/`` location (sources first, ``metadata`` last, files in parallel), check
sizes and Spark's own checksums, re-list the checkpoint and compare every copied file's size and
version token, then write ``_metadata`` last. A file that changed or vanished means Spark raced the
copy: the attempt is discarded and retried on a newer N. Any failure disposes the location.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from airflow_savepoints import __version__
from airflow_savepoints.checkpoint import formats
from airflow_savepoints.checkpoint.planner import CheckpointPlan, plan_checkpoint
from airflow_savepoints.core.catalog import Catalog
from airflow_savepoints.core.copier import MODES, CopiedFile, KnownChecksum, copy_many
from airflow_savepoints.core.lock import JobLock
from airflow_savepoints.core.models import (
    MANIFEST_FILE,
    SavepointInfo,
    SavepointManifest,
    SavepointType,
    StateStoreSettings,
    validate_job_name,
)
from airflow_savepoints.core.pointer import new_savepoint_id, refuse_symlinks, savepoint_info
from airflow_savepoints.core.settings import resolve_savepoint_dir
from airflow_savepoints.errors import (
    CheckpointNotFoundError,
    CheckpointRaceError,
    InvalidInputError,
    SavepointInFlightError,
    SavepointRetriesExhaustedError,
)
from airflow_savepoints.storage import FileStat, Store
from airflow_savepoints.storage.store import SourceChangedError

log = logging.getLogger(__name__)


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


def find_by_request_id(root: Store, job: str, request_id: str) -> SavepointInfo | None:
    return Catalog(root.child(job), job).find_request(request_id)


# A Spark checkpoint does not record the Spark version that wrote it, and the worker's pyspark need not be the
# job's: the manifest says "unknown" unless the caller knows (spark_version=).
UNKNOWN_SPARK_VERSION = "unknown"


def take_savepoint(
    checkpoint: str | Store,
    job: str,
    *,
    savepoint_dir: str | Store | None = None,
    savepoint_type: SavepointType | str = SavepointType.MANUAL,
    reason: str | None = None,
    request_id: str | None = None,
    spark_version: str | None = None,
    max_attempts: int = 5,
    parallelism: int = 8,
    storage_options: dict[str, Any] | None = None,
    checkpoint_storage_options: dict[str, Any] | None = None,
    lock_stale_after: float = 120.0,
    wait_for_same_request: float = 600.0,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    copy_mode: str = "auto",
    incremental: bool = True,
    secondary_dir: str | Store | None = None,
    secondary_storage_options: dict[str, Any] | None = None,
    job_version: dict[str, Any] | None = None,
) -> SavepointInfo:
    """Take a savepoint of the newest committed batch of ``checkpoint`` for ``job``.

    With ``request_id``, a retried call returns the savepoint already taken for that id. Files are
    hard-linked when checkpoint and savepoint share a local filesystem, copied inside the store
    on S3, streamed otherwise (``copy_mode="stream"`` always streams). With ``incremental``, files
    that the job's previous savepoint already holds unchanged (same size and version token) are
    taken from it with their recorded checksum, the previous savepoint pinned meanwhile.

    With ``secondary_dir`` (typically local disk of the worker, after Flink's task-local
    recovery), a secondary copy is written in the same pass to ``<secondary_dir>/<job>/<id>/``,
    checked file by file against the primary's checksums; restore prefers it when it is intact.
    A secondary copy that fails is dropped with a warning; the savepoint does not fail for it.
    """
    validate_job_name(job)
    try:
        savepoint_type = SavepointType(savepoint_type)
    except ValueError:
        raise InvalidInputError(
            f"unknown savepoint type {savepoint_type!r}",
            "use one of: " + ", ".join(t.value for t in SavepointType),
        ) from None
    if copy_mode not in MODES:
        raise InvalidInputError(f"unknown copy mode {copy_mode!r}", "use one of: " + ", ".join(MODES))
    if max_attempts < 1 or parallelism < 1:
        raise InvalidInputError("max_attempts and parallelism must be at least 1", "use positive numbers")
    source = _as_store(checkpoint, checkpoint_storage_options)
    root = (
        savepoint_dir if isinstance(savepoint_dir, Store) else Store(resolve_savepoint_dir(savepoint_dir), storage_options)
    )
    check_apart(source, root)
    refuse_symlinks(source, "checkpoint")
    notify = on_event or (lambda event, data: None)
    job_store = root.child(job)

    if request_id:
        done = find_by_request_id(root, job, request_id)
        if done is not None:
            notify("reused", {"pointer": done.pointer})
            return done
    first = _plan_listed(source)  # fail on bad input before anything is written; the first attempt uses it

    lock = JobLock(job_store, request_id=request_id, stale_after=lock_stale_after)
    started = time.monotonic()
    while (holder := lock.try_acquire()) is not None:
        same_request = bool(request_id) and holder.request_id == request_id
        # a lease from the future has no age on the store's clock: it goes stale once seen unchanged
        # for lock_stale_after seconds, so wait that long for it rather than fail
        waited = time.monotonic() - started
        if not ((same_request and waited <= wait_for_same_request)
                or (holder.age_s is None and waited <= lock_stale_after + 5)):
            since = "" if holder.started_at is None else \
                f", started {datetime.fromtimestamp(holder.started_at, UTC).isoformat()}"
            raise SavepointInFlightError(
                f"a savepoint of job '{job}' is already in progress (request {holder.request_id!r}, "
                f"location {holder.savepoint_id!r}, owner {holder.owner}{since})",
                "wait for it to finish, or retry with the same request id to get its result "
                f"(a holder that died is broken after {lock_stale_after:.0f}s)",
            )
        time.sleep(1.0 if same_request else 0.5)  # the same request is in flight elsewhere: wait for its result
        if not same_request:
            continue
        done = find_by_request_id(root, job, request_id)
        if done is not None:
            return done
    try:
        Catalog(job_store, job).reconcile(in_flight=None)  # we hold the lease: other in-progress records are stale
        if request_id:  # it may have completed between our first look and taking the lease
            done = find_by_request_id(root, job, request_id)
            if done is not None:
                return done
        options = {"copy_mode": copy_mode, "first": first, "job_version": job_version,
                   "secondary": None if secondary_dir is None else _as_store(secondary_dir, secondary_storage_options).child(job)}
        with _previous_savepoint(job_store, job, source, incremental and copy_mode == "auto") as previous:
            options["previous"] = previous
            return _take_with_retries(
                source, job_store, job, lock, savepoint_type, reason, request_id, spark_version,
                max_attempts, parallelism, notify, options,
            )
    finally:
        lock.release()


class _Previous:
    """The job's previous completed savepoint, pinned, and the files it can lend (by path)."""

    def __init__(self, location: Store, manifest: SavepointManifest):
        self.location, self.manifest = location, manifest
        self.entries = {e.path: e for e in manifest.files if e.source_version}

    def known(self, plan: CheckpointPlan) -> dict[str, KnownChecksum]:
        """Planned files the previous savepoint holds unchanged: same size, same version token."""
        if plan.query_id != self.manifest.query_id:
            return {}
        found = {}
        for planned in plan.files:
            entry = self.entries.get(planned.path)
            if entry is not None and entry.size == planned.size and entry.source_version == planned.version:
                found[planned.path] = KnownChecksum(self.location, entry.path, entry.size, int(entry.checksum, 16),
                                                    self.manifest.savepoint_id)
        return found


@contextlib.contextmanager
def _previous_savepoint(job_store: Store, job: str, source: Store, enabled: bool) -> Iterator[_Previous | None]:
    """Pin the job's newest completed savepoint of the same checkpoint for the copy, if there is one."""
    if not enabled:
        yield None
        return
    catalog = Catalog(job_store, job)
    latest, holding = None, None
    try:
        latest = catalog.latest()
        if latest is not None and latest.manifest.checkpoint == source.url:
            holding = catalog.held(latest.manifest.savepoint_id, "incremental savepoint", latest.manifest)
            holding.__enter__()
    except Exception as exc:  # noqa: BLE001 - reuse only saves work; without it every file is copied
        log.info("not reusing the previous savepoint of %s (%s): copying every file", job, exc)
        holding = None
    if latest is None or holding is None:
        yield None
        return
    try:
        yield _Previous(job_store.child(latest.manifest.savepoint_id), latest.manifest)
    finally:
        holding.__exit__(None, None, None)


def _take_with_retries(source, job_store, job, lock, savepoint_type, reason, request_id, spark_version,
                       max_attempts, parallelism, notify, options) -> SavepointInfo:
    state: dict[str, Any] = {"location": None, "attempt": 0}
    try:
        for attempt in Retrying(
            stop=stop_after_attempt(max_attempts),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry=retry_if_exception_type(CheckpointRaceError),
            reraise=False,
        ):
            with attempt:
                state["attempt"] = attempt.retry_state.attempt_number
                return _attempt(source, job_store, job, lock, state, savepoint_type, reason, request_id,
                                spark_version, parallelism, notify, options)
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        _dispose_quietly(state["location"])
        raise SavepointRetriesExhaustedError(
            f"could not take a consistent savepoint of {source.url} in {max_attempts} attempts: "
            f"Spark kept changing the files being copied (last: {cause})",
            "retry later, raise spark.sql.streaming.minBatchesToRetain, or use --max-attempts",
        ) from cause
    except BaseException:
        _dispose_quietly(state["location"])
        raise
    raise AssertionError("unreachable")  # pragma: no cover


def abandon_savepoint(location: Store) -> bool:
    """Remove a savepoint location this process is still writing, and its lease (a killed task).

    A location that already has its ``_metadata`` is complete and is left alone. True if removed.
    """
    if location.exists(MANIFEST_FILE):
        return False
    location.parent().remove_tree(location.name)
    Catalog(location.parent()).forget(location.name)
    JobLock.abandon(location.parent(), location.name)
    return True


def _dispose_quietly(location: Store | None) -> None:
    if location is None:
        return
    catalog = Catalog(location.parent())
    try:
        location.parent().remove_tree(location.name)
        catalog.forget(location.name)
    except Exception:  # noqa: BLE001 - retention removes orphans that could not be removed here
        log.warning("could not remove incomplete savepoint %s; retention will clean it", location.url)
        try:
            catalog.mark_failed(location.name)
        except Exception:  # noqa: BLE001 - reconcile settles the record later
            pass


def _attempt(source, job_store, job, lock, state, savepoint_type, reason, request_id, spark_version,
             parallelism, notify, options) -> SavepointInfo:
    first = options.pop("first", None)
    plan, listing = first if first is not None else _plan_listed(source)
    location: Store | None = state["location"]
    if location is None:
        savepoint_id = new_savepoint_id(plan.query_id)
        location = job_store.child(savepoint_id)
        state["location"] = location
        lock.set_savepoint(savepoint_id)
        Catalog(job_store, job).begin(savepoint_id, savepoint_type, reason, request_id)
    else:
        job_store.remove_tree(location.name)  # a retry starts from an empty location
    location.makedirs()
    notify("planned", {"batch_id": plan.batch_id, "files": len(plan.files), "bytes": plan.total_bytes,
                       "attempt": state["attempt"], "location": location.url})

    previous: _Previous | None = options.get("previous")
    known = previous.known(plan) if previous is not None else {}
    copied: dict[str, CopiedFile] = {}
    groups = sorted({f.group for f in plan.files})
    for group in groups:
        paths = [f.path for f in plan.files if f.group == group]
        try:
            copied.update(copy_many(source, location, paths, parallelism, stats=listing, mode=options["copy_mode"],
                                    known=known, on_file=lambda c: notify("file_done", {"path": c.path, "bytes": c.size})))
        except FileNotFoundError as exc:
            raise CheckpointRaceError(f"a planned file vanished during the copy: {exc}") from exc
        except SourceChangedError as exc:
            raise CheckpointRaceError(f"a planned file was replaced during the copy: {exc}") from exc
    _check_copied(plan, copied, location)
    secondary = _write_secondary(source, options.get("secondary"), location.name, plan, listing, copied, parallelism)
    _check_unchanged(plan, copied, source)
    plan_versions = {f.path: f.version for f in plan.files}
    if not lock.still_held():
        raise SavepointInFlightError(
            f"the in-flight lease of job '{job}' was taken over while copying",
            "another trigger judged this one dead; retry later",
        )
    manifest = SavepointManifest(
        savepoint_id=location.name,
        job=job,
        query_id=plan.query_id,
        batch_id=plan.batch_id,
        includes_next_offsets=plan.includes_next_offsets,
        includes_next_state=plan.includes_next_state,
        type=savepoint_type,
        reason=reason,
        request_id=request_id,
        created_at=datetime.now(UTC),
        tool_version=__version__,
        spark_version=spark_version or UNKNOWN_SPARK_VERSION,
        job_version=options.get("job_version"),
        checkpoint=source.url,
        offset_log_version=plan.offset_log_version,
        commit_log_version=plan.commit_log_version,
        state_store=StateStoreSettings(
            provider=plan.state_store_provider,
            checkpoint_format_version=plan.checkpoint_format_version,
            changelog_checkpointing=plan.changelog_checkpointing,
            operators=plan.operators,
        ),
        source_offsets=plan.source_offsets,
        spark_conf=plan.spark_conf,
        files=[{"path": p, "size": c.size, "checksum": c.checksum, "method": c.method,  # validated in one call
                "checksum_source": c.checksum_source, "source_version": plan_versions[p], "reused_from": c.reused_from}
               for p, c in sorted(copied.items())],
        total_bytes=sum(c.size for c in copied.values()),
        attempts=state["attempt"],
        secondary=secondary.url if secondary is not None else None,
    )
    body = manifest.model_dump_json(indent=1).encode()
    location.write_bytes_atomic(MANIFEST_FILE, body)
    if secondary is not None:
        try:
            secondary.write_bytes_atomic(MANIFEST_FILE, body)
        except Exception as exc:  # noqa: BLE001 - the primary is complete; restore falls back to it
            log.warning("secondary copy %s of %s has no _metadata (%s); restore will use the primary",
                        secondary.url, location.url, exc)
    info = savepoint_info(location, manifest)
    try:
        Catalog(job_store, job).complete(manifest)
    except Exception as exc:  # noqa: BLE001 - the savepoint is complete; the next trigger or retention records it
        log.warning("savepoint %s is complete but its catalog record was not updated (%s)", location.url, exc)
    notify("completed", info.summary())
    return info


def _write_secondary(source: Store, secondary_root: Store | None, savepoint_id: str, plan: CheckpointPlan,
                     listing: Mapping[str, FileStat], copied: dict[str, CopiedFile], parallelism: int) -> Store | None:
    """Copy the plan to the secondary location and check every file against the primary's CRC32C.

    Linked on the same filesystem as the checkpoint, else streamed. Any failure drops it."""
    if secondary_root is None:
        return None
    secondary = secondary_root.child(savepoint_id)
    try:
        secondary_root.remove_tree(savepoint_id)  # what an earlier attempt left
        secondary.makedirs()
        got = copy_many(source, secondary, [f.path for f in plan.files], parallelism, stats=listing)
        wrong = [p for p, c in got.items() if (c.size, c.crc) != (copied[p].size, copied[p].crc)]
        if wrong:
            raise CheckpointRaceError(f"{len(wrong)} files differ from the primary copy, e.g. {wrong[0]}")
        return secondary
    except Exception as exc:  # noqa: BLE001 - the secondary copy is optional
        log.warning("dropping the secondary copy %s (%s)", secondary.url, exc)
        try:
            secondary_root.remove_tree(savepoint_id)
        except Exception:  # noqa: BLE001
            pass
        return None


def _plan(source: Store) -> CheckpointPlan:
    return _plan_listed(source)[0]


def _plan_listed(source: Store) -> tuple[CheckpointPlan, Mapping[str, FileStat]]:
    """The plan and the one listing it was made from (on a local disk, only planned files are stat'ed)."""
    listing = source.list_files_lazily()
    if not listing and not source.exists():
        raise CheckpointNotFoundError(
            f"checkpoint {source.url} does not exist", "point at the query's checkpointLocation"
        )
    return plan_checkpoint(listing, source.read_bytes, where=source.url), listing


def _check_copied(plan: CheckpointPlan, copied: dict[str, CopiedFile], location: Store) -> None:
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
            sidecar = formats.parse_spark_sidecar(location.read_bytes(planned.path), planned.path)
            main = copied[planned.sidecar_of]
            if sidecar.value != main.crc or sidecar.main_file_size not in (-1, main.size):
                raise CheckpointRaceError(f"{planned.sidecar_of} does not match its Spark checksum file")


def _check_unchanged(plan: CheckpointPlan, copied: dict[str, CopiedFile], source: Store) -> None:
    """Files copied without a known source version (a streamed read of an object store, where a
    replacement mid-read could mix two objects' bytes) must still be as planned after the copy.

    Every other copy already proved it holds the planned version: a link or a local read records
    the inode it got (``_check_copied`` compares it), a server-side copy was made only from the
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
