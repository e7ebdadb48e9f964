"""Rescale a restored checkpoint's state with Spark's own offline repartition (Spark 4.2+, RocksDB state).

``restore_savepoint(..., state_partitions=N)`` copies the savepoint into the target as usual, then
this module runs ``StreamingCheckpointManager.repartition`` on the COPY (what Flink calls NO_CLAIM):
Spark writes a new batch holding only the state rewritten into N partitions, and the query continues
after it. The savepoint is never written. What Spark would refuse is refused here before anything
is copied where the manifest tells (HDFS-backed state, no Spark 4.2); Spark's own refusals keep its
message under our error codes (its ``STATE_REPARTITION_*`` and ``STATE_REWRITER_*`` error classes).
pyspark is imported only here, and only when a rescale is asked.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.models import SavepointManifest
from airflow_savepoints.core.spark_cause import spark_cause
from airflow_savepoints.errors import (
    RescaleError,
    RescaleFailedError,
    RescaleRefusedError,
    RescaleUnavailableError,
    RescaleUnsupportedOperatorError,
    RescaleUnsupportedStateError,
    reported,
)
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
MIN_SPARK = (4, 2)
INSTALL_HINT = "pip install 'airflow-savepoints[spark]' (pyspark 4.2 or newer) where the restore runs"
MOVE_TO_ROCKSDB = (
    f"run the job with RocksDB state ({PROVIDER_KEY}={ROCKSDB_PROVIDER}); Spark cannot change the provider of "
    "existing state, so that needs fresh state: a new checkpoint (started from the sources' positions, not this "
    "savepoint's state); savepoints taken after that can be rescaled. Or restore without state_partitions "
    "(--state-partitions) to keep the current partition count; nothing was restored"
)
_SPARK_CONDITION = re.compile(r"\[(STATE_RE(?:PARTITION|WRITER)_[A-Z_]+(?:\.[A-Z_]+)?)\]")


@dataclass(frozen=True)
class RescalePlan:
    """What a restore with ``state_partitions`` will do, decided from the manifest before anything is copied."""

    partitions: int  # asked
    current: int | None  # the shuffle partitions the savepoint's batch ran with
    before: dict[str, int] = field(default_factory=dict)  # operator id -> its state partitions in the savepoint
    trailing: set[str] = field(default_factory=set)  # files of the planned, uncommitted batch left out of the copy

    @property
    def noop(self) -> bool:
        return self.current == self.partitions


def current_partitions(manifest: SavepointManifest) -> int | None:
    """The number of state partitions the savepoint's state has: Spark's recorded shuffle partitions, else counted."""
    recorded = manifest.spark_conf.get(SHUFFLE_PARTITIONS)
    if recorded is not None and str(recorded).isdigit():
        return int(recorded)
    counts = manifest.state_partitions()
    return max(counts.values()) if counts else None


def plan_rescale(manifest: SavepointManifest, partitions: int, where: str, local: bool = True) -> RescalePlan:
    """Check a rescale of the savepoint at ``where`` into ``partitions`` before anything is copied; needs no Spark.

    Already ``partitions``: a no-op (restored as usual). Refused: HDFS-backed state, operators without the
    metadata Spark needs, and (``local``: the rescale runs in this process) no pyspark 4.2+ here."""
    plan = RescalePlan(partitions, current_partitions(manifest), manifest.state_partitions())
    if plan.noop:
        return plan
    provider = manifest.state_store.provider or manifest.spark_conf.get(PROVIDER_KEY)
    if plan.before and provider and "RocksDB" not in provider:
        raise RescaleUnsupportedStateError(
            f"savepoint {where} holds {provider.rsplit('.', 1)[-1]} state, which Spark can rescale only when it is "
            f"RocksDB (Spark's offline repartition refuses it: STATE_REPARTITION_INVALID_CHECKPOINT.UNSUPPORTED_PROVIDER)",
            MOVE_TO_ROCKSDB,
        )
    unlisted = [op for op in plan.before if not _has_operator_metadata(manifest, op)]
    if unlisted:
        raise RescaleRefusedError(
            f"savepoint {where} has no operator metadata for stateful operator(s) {', '.join(unlisted)} (Spark "
            f"{manifest.spark_version or 'before 4.0'} did not write it), which Spark's repartition needs "
            "(STATE_REWRITER_INVALID_CHECKPOINT.MISSING_OPERATOR_METADATA)",
            "restore it without state_partitions (--state-partitions), run the job on Spark 4.2 until it commits a "
            "batch (Spark then writes the metadata), take a new savepoint and rescale that one; nothing was restored")
    if local:
        spark_version()
    return RescalePlan(partitions, plan.current, plan.before, trailing_files(manifest))


def _has_operator_metadata(manifest: SavepointManifest, op: str) -> bool:
    """Spark 4.0+ writes ``state/<op>/_metadata/metadata`` (v1) or ``.../_metadata/v2/<batch>`` for each operator."""
    prefix = f"state/{op}/_metadata/"
    return any(e.path == prefix + "metadata" or e.path.startswith(prefix + "v2/") for e in manifest.files)


def trailing_files(manifest: SavepointManifest) -> set[str]:
    """The savepoint's uncommitted batch N+1: ``offsets/N+1``, the file-source log entries past batch N's
    offsets, and the state it wrote (versions past N+1).

    Spark's repartition needs the last planned batch committed (else ``LAST_BATCH_FAILED``); leaving the
    planned batch out makes the copy end at committed N, and its input is read again after the rescale
    (a file source lists the same files again, so the next batch reads what N+1 would have)."""
    if not manifest.includes_next_offsets:
        return set()
    nxt = manifest.batch_id + 1
    drop = {f"offsets/{nxt}", f"offsets/{nxt}{formats.SPARK_SIDECAR_SUFFIX}"}
    logs: dict[str, dict[str, int]] = {}  # file source -> its log entries (path -> batch id)
    for entry in manifest.files:
        if entry.path.startswith("state/"):
            version = formats.state_file_version(entry.path)
            if version is not None and version > nxt:
                drop.add(entry.path)
        elif entry.path.startswith("sources/") and entry.path.count("/") == 2:
            _, source, name = entry.path.split("/")
            if match := formats.BATCH_FILE.match(name) or formats.COMPACT_FILE.match(name):
                logs.setdefault(source, {})[entry.path] = int(match.group(1))
    for source, entries in logs.items():
        logged = formats.file_source_log_offset(manifest.source_offsets.get(source))
        if logged is not None and _log_covers(entries, logged):
            drop.update(path for path, batch in entries.items() if batch > logged)
    return {e.path for e in manifest.files if e.path in drop}


def _log_covers(entries: dict[str, int], last: int) -> bool:
    """Whether a file-source log's entries up to ``last`` are all there without the later ones (the savepoint
    took the log up to N+1's offset: a compaction at N+1 holds batch N's entries only inside it)."""
    bases = [b for p, b in entries.items() if p.endswith(".compact") and b <= last]
    start = max(bases) + 1 if bases else 0
    return set(range(start, last + 1)) <= {b for p, b in entries.items() if not p.endswith(".compact")}


def spark_version(session: Any = None) -> tuple[int, int]:
    """The Spark that will rescale (the session's, else pyspark's); refused if absent or older than 4.2."""
    try:
        version = session.version if session is not None else __import__("pyspark").__version__
    except ImportError as exc:
        raise RescaleUnavailableError("rescaling state needs Spark 4.2 or newer here, and pyspark is not installed",
                                      INSTALL_HINT) from exc
    found = tuple(int(x) for x in re.findall(r"\d+", str(version))[:2])
    if found < MIN_SPARK:
        raise RescaleUnavailableError(
            f"rescaling state needs Spark's offline state repartition, new in Spark 4.2; this is Spark {version}",
            INSTALL_HINT + "; or restore without state_partitions (--state-partitions); nothing was restored")
    return found  # type: ignore[return-value]


def repartition(destination: Store, plan: RescalePlan, manifest: SavepointManifest, conf: dict[str, str],
                spark: Any = None, file_sink: Store | None = None) -> tuple[int, dict[str, int]]:
    """Run Spark's repartition on the restored copy at ``destination`` in this process (``spark``, else the
    active session, else a local one); the batch it wrote and the partitions after.

    ``conf``: settings Spark does not persist in the checkpoint (its state format), set for the call.
    ``file_sink``: the job's file sink, given its log entry for the repartition batch (see :func:`_record_in_sink`)."""
    batch = manifest.batch_id + 1
    with _session(spark) as session, _conf(session, conf):
        return batch, rewrite(session, destination, plan.partitions, batch, file_sink)


def rewrite(session: Any, destination: Store, partitions: int, batch: int, file_sink: Store | None = None) -> dict[str, int]:
    """Spark's repartition of the checkpoint at ``destination`` into ``partitions``, in ``session``: it must
    commit ``batch``; the state partitions after. Spark's refusals and failures raise as our typed errors
    (:func:`spark_error`). In-process (:func:`repartition`) and in the rescale application a job's own
    submit path runs (``airflow_savepoints/jobs/driver/rescale_app.py``) alike."""
    spark_version(session)
    session.streams  # noqa: B018 - its manager registers the StateStoreCoordinator, which the rewrite needs (a fresh session has none)
    try:
        _interruptible(session, lambda: session._streamingCheckpointManager.repartition(destination.spark_url_of(),
                                                                                        partitions, True))
    except Exception as exc:  # noqa: BLE001 - py4j and pyspark errors: mapped by Spark's error class
        raise spark_error(exc, destination) from exc
    listing = destination.list_files()
    if f"commits/{batch}" not in listing:
        raise RescaleFailedError(f"Spark's repartition of {destination.url} returned without committing batch {batch}",
                                 "nothing was restored; retry into a new, empty checkpoint location")
    _drop_partitions_past(destination, listing, partitions, batch)
    if file_sink is not None:
        _record_in_sink(session, file_sink, batch)
    return formats.state_partitions(listing, version=batch + 1)


def _drop_partitions_past(destination: Store, listing: Iterable[str], partitions: int, batch: int) -> None:
    """After a rescale into fewer partitions, remove from the restored copy the folders of the partitions at or
    past ``partitions`` that hold no state of the repartition ``batch``: the old state only, which Spark never opens
    again, but which every later reader counts (a savepoint of the running job planned the stale partitions and
    failed on their missing versions). The copy's own files only (links or copies): the savepoint is untouched."""
    stale, current = set(), set()
    for path in formats.visible_paths(listing):
        parts = path.split("/")
        if len(parts) >= 4 and parts[0] == "state" and parts[1].isdigit() and parts[2].isdigit() \
                and int(parts[2]) >= partitions:
            folder = "/".join(parts[:3])
            (current if formats.state_file_version(path) == batch + 1 else stale).add(folder)
    gone = sorted(stale - current)
    for folder in gone:
        destination.remove_tree(folder)
    if gone:
        log.info("rescaled %s into %d partitions: removed the old state of %s", destination.url, partitions,
                 ", ".join(gone))


def _interruptible(session: Any, call: Callable[[], Any], grace: float = 120.0) -> Any:
    """``call`` (one blocking py4j call) on a thread of its own, so that SIGTERM or SIGINT interrupt the wait
    here, never a py4j exchange (an interrupted one leaves the main thread's connection to the JVM out of step).
    Interrupted: Spark's jobs are cancelled and the call is waited for (up to ``grace`` seconds), so Spark writes
    nothing more once the caller empties the target."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-call") as pool:
        future = pool.submit(call)
        try:
            return future.result()
        except BaseException:
            deadline = time.monotonic() + grace
            with contextlib.suppress(Exception):
                session.sparkContext.cancelAllJobs()
            with contextlib.suppress(BaseException):
                future.exception(timeout=grace)
            with contextlib.suppress(Exception):  # a failed job's other tasks still write until they stop
                while _running_tasks(session) and time.monotonic() < deadline:
                    time.sleep(0.05)
            raise


def _running_tasks(session: Any) -> int:
    """Tasks still running on the session's executors (an aborted job's tasks end after the job does)."""
    infos = session.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sum(info.numRunningTasks() for info in infos)


def _record_in_sink(session: Any, sink: Store, batch: int) -> None:
    """Give the file sink's ``_spark_metadata`` log an empty entry for the repartition batch, written by
    Spark's own ``FileStreamSinkLog`` (a compaction batch compacts as Spark would). The sink never sees
    that batch, and a gap in its log fails the next compaction (``BATCH_METADATA_NOT_FOUND``)."""
    jvm = session._jvm
    sinks = jvm.org.apache.spark.sql.execution.streaming.sinks
    try:
        log_ = sinks.FileStreamSinkLog(sinks.FileStreamSinkLog.VERSION(), session._jsparkSession,
                                       sink.spark_url_of("_spark_metadata"), jvm.scala.Option.empty())
        log_.add(batch, session.sparkContext._gateway.new_array(sinks.SinkFileStatus, 0))
    except Exception as exc:  # noqa: BLE001 - py4j errors: reported with Spark's message
        raise RescaleFailedError(
            f"could not record the repartition batch {batch} in the file sink's log {sink.url_of('_spark_metadata')}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            "nothing was restored; check access to the sink's output folder and retry") from exc


def spark_error(exc: BaseException, destination: Store) -> Exception:
    """Spark's repartition error as ours: its ``STATE_REPARTITION_*`` class picks the code, its message is kept."""
    text = str(exc)
    match = _SPARK_CONDITION.search(text)
    if match is None:  # py4j: "An error occurred while calling ...\n: java.lang.X: message"
        lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(exc).__name__]
        cause = next((line[2:] for line in lines if line.startswith(": ")), lines[0])
        return RescaleFailedError(f"Spark's repartition of {destination.url} failed: {cause}",
                                  "nothing was restored; fix the cause and retry into a new, empty checkpoint location",
                                  cause=spark_cause(exc))
    line = next(line for line in text.splitlines() if match.group(0) in line)
    message = line[line.index(match.group(0)):].strip()  # Spark's own message, from its error class on
    condition = match.group(1)
    if condition.endswith(".UNSUPPORTED_PROVIDER"):
        return RescaleUnsupportedStateError(message, MOVE_TO_ROCKSDB, cause=message)
    if condition.endswith((".UNSUPPORTED_STATEFUL_OPERATOR", ".UNSUPPORTED_TRANSFORM_WITH_STATE_VARIABLE_TYPE")):
        return RescaleUnsupportedOperatorError(
            message, "Spark cannot repartition this query's state; restore without state_partitions (--state-partitions) "
            "and keep its partition count; nothing was restored", cause=message)
    return RescaleRefusedError(message, "Spark's repartition refused the restored copy for the reason it gives; "
                               "nothing was restored", cause=message)


def reported_error(error: dict[str, Any]) -> RescaleError:
    """The typed error a rescale that ran elsewhere reported (its ``to_dict()``: code, message, hint): a rescale
    error of its code, else ``rescale_failed``."""
    return reported(error, RescaleFailedError, RescaleError, "the rescale failed without a message")  # type: ignore[return-value]


@contextlib.contextmanager
def _session(spark: Any) -> Iterator[Any]:
    """The caller's session, else the active one, else a local one made (and stopped) for this call."""
    if spark is not None:
        yield spark
        return
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise RescaleUnavailableError("rescaling state needs pyspark 4.2 or newer here", INSTALL_HINT) from exc
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    log.info("starting a local Spark session for the rescale")
    session = (SparkSession.builder.master("local[*]").appName("airflow-savepoints-rescale")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    try:
        yield session
    finally:
        session.stop()


@contextlib.contextmanager
def _conf(session: Any, conf: dict[str, str]) -> Iterator[None]:
    """Set ``conf`` on the session for the call, then put back what was there."""
    previous = {key: session.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, value)
