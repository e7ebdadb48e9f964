"""Read a savepoint's state without running its job (Flink's State Processor API, read side).

A savepoint is a checkpoint copy, so Spark's own read-only sources read it in place (Spark 4.0+):
``state-metadata`` names the stateful operators, their stores and partition counts, and
``statestore`` reads each store at the savepoint's batch (``batchId``): a store by ``storeName``
(a join's four stores each by name), a transformWithState variable by ``stateVarName`` and its
timers with ``readRegisteredTimers``. A join is never read with ``joinSide``: that reader opens the
join's stores for writing (it creates and deletes a temporary file in each store folder), and a
savepoint is never written to. Nothing is written into the savepoint; while Spark reads, the
savepoint is pinned in its job's catalog so that retention does not dispose it underneath.

Spark reads a local savepoint where it is. A savepoint on an object store is copied (its state,
offsets, commits and metadata, never its sources) into a local temporary folder that is removed
afterwards (``read_via="copy"``, the default for a remote store: the local Spark of the CLI has no
object-store connector or credentials); ``read_via="in_place"`` hands Spark the store's own URL for
a session that has them.

pyspark is imported only here, and only when a savepoint is read.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, Literal

from airflow_savepoints.core.catalog import pinned_savepoint
from airflow_savepoints.core.models import SavepointManifest
from airflow_savepoints.core.pointer import resolve_savepoint
from airflow_savepoints.core.spark_cause import spark_cause
from airflow_savepoints.core.state_summary import OperatorState, StateSummary, StoreState, skew, state_files
from airflow_savepoints.errors import (
    InvalidInputError,
    SparkNotInstalledError,
    StateUnreadableError,
)
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

ReadVia = Literal["auto", "in_place", "copy"]
MAX_SAMPLE = 1000
JOIN_INDEX_STORE = "keyToNumValues"  # a join side's key -> count index: its rows are keys, not buffered rows
INSTALL_HINT = "pip install 'airflow-savepoints[spark]' (pyspark 4.0 or newer, and Java 17 or newer)"
Progress = Callable[[str], None]  # one line per step: starting Spark, reading state, counting
# Spark's log4j2 configuration for a session made here: warnings and Spark's start-up lines stay quiet
QUIET_LOG4J = os.path.join(os.path.dirname(__file__), "log4j2-quiet.properties")


# The CLI's local Spark is short-lived and reads small states (a large one is counted on the job's cluster): its
# JVM compiles with C1 only and collects with the serial GC, which halves a cold `inspect` on 2 cores (a 4-partition
# savepoint at load 8: 50-68 s by default, 24-39 s so). A session already running (a job's, a test's) is used as is.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# What the JVM prints on stderr at every start whatever the log level: Spark 4's launcher adds
# --add-modules=jdk.incubator.vector and the JVM announces it; Spark's logging, started as a shell's (pyspark's
# gateway is one), announces the shell's level. Dropped from a quiet session's stderr; everything else passes.
JVM_NOTICES = (b"WARNING: Using incubator modules", b'Setting default log level to "',
               b"To adjust logging level use sc.setLogLevel(")


def _quiet_java_options() -> str:
    return f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}"


def _forward_stderr(read_fd: int) -> None:
    """Copy the JVM's stderr to ours, line by line, without the notices no log level silences."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe, contextlib.suppress(OSError, ValueError):
        for line in iter(pipe.readline, b""):
            if not line.startswith(JVM_NOTICES):
                os.write(2, line)


def _quiet_gateway(conf: Any) -> Any:
    """Spark's py4j gateway (its JVM started as pyspark starts it), with the JVM's stderr going through
    :func:`_forward_stderr` (a daemon thread; the JVM ends with this process, as pyspark's own does)."""
    from pyspark.java_gateway import launch_gateway

    read_fd, write_fd = os.pipe()
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_fd})
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    threading.Thread(target=_forward_stderr, args=(read_fd,), name="spark-stderr", daemon=True).start()
    return gateway


def spark_session(verbose: bool = False):
    """The active Spark session, else a local one (the CLI's in-process Spark), whose JVM logs only errors
    unless ``verbose`` (and whose stderr drops the JVM's module notice: :data:`JVM_NOTICES`)."""
    try:
        import pyspark
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkNotInstalledError("reading a savepoint's state needs pyspark, which is not installed",
                                     INSTALL_HINT) from None
    if int(pyspark.__version__.split(".")[0]) < 4:
        raise SparkNotInstalledError(
            f"reading a savepoint's state needs Spark's state data sources (Spark 4.0+); pyspark is {pyspark.__version__}",
            INSTALL_HINT)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from pyspark import SparkConf, SparkContext

    java_options = SHORT_LIVED_JVM_OPTIONS if verbose else f"{SHORT_LIVED_JVM_OPTIONS} {_quiet_java_options()}"
    # one shuffle partition: each count is grouped by state partition, a handful of rows after the map side
    conf = (SparkConf().setMaster("local[*]").setAppName("airflow-savepoints-inspect")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.sql.session.timeZone", "UTC").set("spark.sql.shuffle.partitions", "1")
            .set("spark.driver.extraJavaOptions", java_options))
    if not verbose and SparkContext._gateway is None:
        SparkContext(conf=conf, gateway=_quiet_gateway(conf))
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    session.sparkContext.setLogLevel("INFO" if verbose else "ERROR")
    return session


def inspect_savepoint(pointer: str, *, operator: int | None = None, sample: int = 0, spark: Any = None,
                      storage_options: dict[str, Any] | None = None, read_via: ReadVia = "auto",
                      progress: Progress | None = None, verbose: bool = False, strict: bool = False) -> StateSummary:
    """Per stateful operator of the savepoint at ``pointer``: its stores, schemas, partitions, rows per
    partition, bytes and ``sample`` rows of each store; ``operator``: only that operator id. ``progress``
    gets a line per step; ``strict``: a store Spark cannot read raises ``StateUnreadableError`` (Spark's error
    class and message as its ``cause``) instead of being reported in the summary."""
    say = progress or (lambda line: None)
    if not isinstance(sample, int) or not 0 <= sample <= MAX_SAMPLE:
        raise InvalidInputError(f"invalid sample {sample!r}", f"pass a number of rows from 0 to {MAX_SAMPLE}")
    if operator is not None and (not isinstance(operator, int) or operator < 0):
        raise InvalidInputError(f"invalid operator id {operator!r}", "pass an operator id (0, 1, ...) as inspect lists them")
    if read_via not in ("auto", "in_place", "copy"):
        raise InvalidInputError(f"invalid read_via {read_via!r}", "pass auto, in_place or copy")
    say(f"opening the store: {pointer}")
    location, manifest = resolve_savepoint(pointer, storage_options)
    files = state_files(manifest)
    if operator is not None and str(operator) not in files:
        raise InvalidInputError(
            f"savepoint {location.url} has no stateful operator {operator} "
            f"(its operators: {', '.join(files) or 'none, a stateless query'})",
            "pass one of its operator ids, or leave --operator out")
    if files:
        say("starting Spark (a local JVM: most of a cold run)" if spark is None else "using the given Spark session")
    session = (spark or spark_session(verbose)) if files else None
    if session is not None and spark is None:
        say(f"Spark {session.version} started")
    with pinned_savepoint(location, manifest, "inspect"), \
            _readable(location, manifest, read_via if files else "in_place") as (path, read_from):
        reader = _Reader(session, path, manifest.batch_id, sample, say) if session is not None else None
        operators, limits = reader.operators(files, operator) if reader is not None else ([], [])
    failed = [(op, s) for op in operators for s in op.stores if s.error]
    if strict and failed:
        op, store = failed[0]
        raise StateUnreadableError(
            f"Spark could not read {len(failed)} store(s) of savepoint {location.url}, first operator {op.operator_id} "
            f"store {store.state_var or store.store}", "the savepoint's state is damaged or was written by a Spark this "
            "one cannot read (see cause); verify the savepoint, or inspect another one", cause=store.error)
    if not files:
        limits.append("a stateless query: the savepoint holds no state")
    counted = [op.rows for op in operators if op.rows is not None]
    return StateSummary(
        pointer=location.url, savepoint_id=manifest.savepoint_id, job=manifest.job, batch_id=manifest.batch_id,
        savepoint_spark_version=manifest.spark_version, reader_spark_version=session.version if session else None,
        read_from=read_from, operators=operators, total_rows=sum(counted) if counted else None, limits=limits,
        inspected_at=dt.datetime.now(dt.UTC).isoformat())


@contextlib.contextmanager
def _readable(location: Store, manifest: SavepointManifest, read_via: ReadVia) -> Iterator[tuple[str, str]]:
    """A path Spark can read the savepoint at: the savepoint itself, or a local copy removed afterwards."""
    if read_via == "in_place" or (read_via == "auto" and location.is_local):
        yield (location.root if location.is_local else location.spark_url_of()), "savepoint"
        return
    folder = tempfile.mkdtemp(prefix="airflow-savepoints-inspect-")
    try:
        wanted = [e.path for e in manifest.files if not e.path.startswith("sources/")]
        copy = Store(folder)  # through the store, like every other read and write
        copy.make_parents(wanted)

        def fetch(path: str) -> None:
            copy.write_bytes_atomic(path, location.read_bytes(path))

        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(fetch, wanted))
        yield folder, "local_copy"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def json_safe(value: Any) -> Any:
    """A Spark row's value as plain JSON: nested rows and maps as objects, times as ISO text, bytes as base64."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def _spark_message(exc: Exception) -> str:
    """Spark's own error class and message, without py4j's "An error occurred while calling" or the JVM stack."""
    return spark_cause(exc)[:500]


class _Reader:
    """Spark's two state sources over one checkpoint path at one batch."""

    def __init__(self, spark: Any, path: str, batch_id: int, sample: int, say: Progress = lambda line: None):
        self.spark, self.path, self.batch_id, self.sample, self.say = spark, path, batch_id, sample, say
        # the state store coordinator is made with the session's StreamingQueryManager; a session that has
        # not run a query yet has none, and RocksDB state then fails to load
        spark.streams.active  # noqa: B018

    def metadata(self) -> list[dict[str, Any]]:
        return [row.asDict() for row in self.spark.read.format("state-metadata").load(self.path).collect()]

    def operators(self, files: dict[str, dict[str, Any]], only: int | None) -> tuple[list[OperatorState], list[str]]:
        limits: list[str] = []
        self.say("reading state: the operators' metadata")
        try:
            metadata = self.metadata()
        except Exception as exc:  # noqa: BLE001 - Spark's refusal is reported, the stores are still read
            metadata = []
            limits.append(f"Spark's state-metadata source could not read the savepoint: {_spark_message(exc)}")
        by_operator: dict[str, list[dict[str, Any]]] = {}
        for row in metadata:
            by_operator.setdefault(str(row["operatorId"]), []).append(row)
        missing = [op for op in files if op not in by_operator]
        if missing:
            limits.append(
                f"operator(s) {', '.join(missing)}: no operator metadata (a checkpoint written before Spark 4.0): their "
                "names are unknown, their stores are read as the folder layout names them, and a transformWithState "
                "operator's variables cannot be found")
        found = []
        for op, state in files.items():
            if only is not None and op != str(only):
                continue
            found.append(self.operator(op, state, by_operator.get(op, [])))
        return found, limits

    def operator(self, op: str, state: dict[str, Any], rows: list[dict[str, Any]]) -> OperatorState:
        first = rows[0] if rows else {}
        partitions = int(first.get("numPartitions") or state["partitions"])
        properties = json.loads(first["operatorProperties"]) if first.get("operatorProperties") else {}
        stores = [self.store(int(op), partitions, store) for store in self._stores(rows, properties, state)]
        counted = [s for s in stores if s.counted and s.rows is not None]
        per_partition = [sum(s.rows_per_partition[p] for s in counted) for p in range(partitions)] if counted else []
        for store in stores:
            store.bytes = state["store_bytes"].get(store.store)
        return OperatorState(operator_id=int(op), name=first.get("operatorName"), partitions=partitions,
                             files=state["files"], bytes=state["bytes"], rows=sum(per_partition) if counted else None,
                             rows_per_partition=per_partition, skew=skew(per_partition), properties=properties,
                             stores=stores)

    @staticmethod
    def _stores(rows: list[dict[str, Any]], properties: dict[str, Any], state: dict[str, Any]) -> list[StoreState]:
        variables = properties.get("stateVariables")
        if isinstance(variables, list):  # transformWithState: one column family per variable in the default store
            stores = [StoreState(store="default", state_var=v.get("stateName"), kind=v.get("stateVariableType"))
                      for v in variables if isinstance(v, dict)]
            if properties.get("timeMode") not in (None, "NoTime"):
                stores.append(StoreState(store="default", kind="timers"))
            return stores
        names = [row["stateStoreName"] for row in rows] or sorted(state["store_bytes"]) or ["default"]
        return [StoreState(store=name, counted=not name.endswith(JOIN_INDEX_STORE)) for name in names]

    def store(self, operator_id: int, partitions: int, store: StoreState) -> StoreState:
        options: dict[str, Any] = {"batchId": self.batch_id, "operatorId": operator_id}
        if store.state_var:
            options["stateVarName"] = store.state_var
        elif store.kind == "timers":
            options["readRegisteredTimers"] = "true"
        elif store.store != "default":
            options["storeName"] = store.store
        self.say(f"reading state: operator {operator_id} store {store.state_var or store.store}"
                 f"{' timers' if store.kind == 'timers' else ''}: counting rows per partition")
        try:
            frame = self.spark.read.format("statestore").options(**options).load(self.path)
            columns = {f.name: f.dataType.simpleString() for f in frame.schema.fields if f.name != "partition_id"}
            counts = [0] * partitions
            for row in frame.groupBy("partition_id").count().collect():
                if row[0] is not None and 0 <= row[0] < partitions:
                    counts[row[0]] = row[1]
            samples = [json_safe(r.asDict(recursive=True)) for r in frame.limit(self.sample).collect()] if self.sample else []
        except Exception as exc:  # noqa: BLE001 - one store Spark cannot read does not hide the others
            log.warning("cannot read store %s of operator %s: %s", store.state_var or store.store, operator_id, exc)
            return store.model_copy(update={"error": _spark_message(exc), "rows": None})
        return store.model_copy(update={"schema_": columns, "rows": sum(counts), "rows_per_partition": counts,
                                        "samples": samples})

