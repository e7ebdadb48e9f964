"""Seven deterministic streaming query shapes on real local Spark, for savepoint round trips.

Each shape reads JSON files with ``maxFilesPerTrigger=1`` (one file per source per batch, files in
mtime order), so batch b always sees the same input; sinks record output per batch id, so a run
stopped and restored from a savepoint can be compared batch by batch with an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z

# Every shape sets all of these (the session is shared and some are not persisted in checkpoints).
DEFAULT_CONF = {
    "spark.sql.streaming.stateStore.providerClass": HDFS,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false",
    "spark.sql.streaming.stateStore.checkpointFormatVersion": "1",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.fileSource.log.compactInterval": "3",
    "spark.sql.streaming.fileSink.log.compactInterval": "1000",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


def make_spark_session(app_name: str = "airflow-savepoints-tests"):
    """The tests' local Spark session; with the jars ``make jars`` fetched (Spark's Kafka connector, s3a, Delta Lake) when
    present. Delta's session extension and catalog are set with its jars (both are fixed when the JVM starts, and the
    suite shares one session: tests/test_delta.py uses it)."""
    from pyspark.sql import SparkSession

    from tests.support.emulators import JARS, jar_files

    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder
    delta = jar_files(JARS / "delta")
    jars = jar_files(JARS / "spark-kafka") + jar_files(JARS / "s3a") + delta
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    if delta:
        builder = (builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
                   .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
                   .config("spark.databricks.delta.snapshotPartitions", "2"))  # the log replay's tasks (50 by default)
    session = (
        builder.master("local[2]").appName(app_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")  # local mode: driver and executors share this JVM
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "2s")  # snapshots appear during tests
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def _iso(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + seconds))


def _write_lines(path: Path, index: int, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    os.utime(tmp, (1_000_000 + index, 1_000_000 + index))  # file order == batch order
    tmp.rename(path)


def _foreach_batch_writer(sink_dir: Path):
    def write(frame, batch_id):
        rows = sorted(json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in frame.collect())
        sink_dir.mkdir(parents=True, exist_ok=True)
        (sink_dir / f"batch-{batch_id}.json").write_text(json.dumps(rows))

    return write


def _read_foreach_sink(sink_dir: Path) -> dict[int, list]:
    out = {}
    for path in sink_dir.glob("batch-*.json"):
        out[int(path.stem.split("-")[1])] = json.loads(path.read_text())
    return out


def _read_file_sink(sink_dir: Path) -> dict[int, list]:
    out: dict[int, list] = {}
    log = sink_dir / "_spark_metadata"
    if not log.exists():
        return out
    for entry in log.iterdir():
        if not entry.name.isdigit():
            continue
        rows: list[str] = []
        for line in entry.read_text().splitlines()[1:]:
            path = json.loads(line)["path"].replace("file://", "").replace("file:", "")
            rows += [json.dumps(json.loads(x), sort_keys=True) for x in Path(path).read_text().splitlines() if x]
        out[int(entry.name)] = sorted(rows)
    return out


@dataclass
class Shape:
    name: str
    sql_conf: dict[str, str]
    inputs: Callable[[int], dict[str, list[dict]]]  # file index -> {sub folder: rows}
    build: Callable  # (spark, input_root) -> streaming DataFrame
    output_mode: str = "update"
    file_sink: bool = False
    schemas: dict[str, str] = field(default_factory=dict)

    def write_input(self, input_root: Path, start: int, stop: int) -> None:
        for index in range(start, stop):
            for folder, rows in self.inputs(index).items():
                _write_lines(Path(input_root) / folder / f"part-{index:05d}.json", index, rows)

    def start(self, spark, input_root: Path, checkpoint: str, sink_dir: Path, trigger_ms: int = 200):
        for key, value in {**DEFAULT_CONF, **self.sql_conf}.items():
            spark.conf.set(key, value)
        frame = self.build(spark, Path(input_root))
        writer = frame.writeStream.outputMode(self.output_mode).option("checkpointLocation", checkpoint)
        writer = writer.trigger(processingTime=f"{trigger_ms} milliseconds").queryName(f"{self.name}-{time.time_ns()}")
        if self.file_sink:
            return writer.format("json").option("path", str(sink_dir)).start()
        return writer.foreachBatch(_foreach_batch_writer(Path(sink_dir))).start()

    def read_sink(self, sink_dir: Path) -> dict[int, list]:
        return _read_file_sink(Path(sink_dir)) if self.file_sink else _read_foreach_sink(Path(sink_dir))


def _stream(spark, folder: Path, schema: str):
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(folder))


EVENTS = "key string, value long, ts timestamp"


def _events(index: int) -> dict[str, list[dict]]:
    return {"events": [{"key": f"k{j % 5}", "value": index * 100 + j, "ts": _iso(index * 60 + j)} for j in range(20)]}


def _aggregate(spark, root: Path):
    from pyspark.sql import functions as F

    return _stream(spark, root / "events", EVENTS).groupBy("key").agg(
        F.count("*").alias("n"), F.sum("value").alias("total"))


def _join_inputs(index: int) -> dict[str, list[dict]]:
    left = [{"id": i, "lts": _iso((i // 5) * 60), "lv": i * 2} for i in range(index * 5, index * 5 + 5)]
    # right rows also match the previous file's left ids: those matches come from join state
    right = [{"rid": i, "rts": _iso((i // 5) * 60 + 30), "rv": i * 3} for i in range(max(0, index * 5 - 3), index * 5 + 2)]
    return {"left": left, "right": right}


def _join(spark, root: Path):
    from pyspark.sql import functions as F

    left = _stream(spark, root / "left", "id long, lts timestamp, lv long").withWatermark("lts", "10 minutes")
    right = _stream(spark, root / "right", "rid long, rts timestamp, rv long").withWatermark("rts", "10 minutes")
    cond = (F.col("id") == F.col("rid")) & (F.col("rts") >= F.col("lts")) & \
        (F.col("rts") <= F.col("lts") + F.expr("INTERVAL 5 MINUTES"))
    return left.join(right, cond, "inner").select("id", "lv", "rv")


def _dedup_inputs(index: int) -> dict[str, list[dict]]:
    return {"events": [{"id": i, "ts": _iso((i // 10) * 60), "v": index} for i in range(index * 10, index * 10 + 15)]}


def _dedup(spark, root: Path):
    return _stream(spark, root / "events", "id long, ts timestamp, v long").withWatermark(
        "ts", "30 minutes").dropDuplicatesWithinWatermark(["id"])


def _transform_with_state(spark, root: Path):
    return _stream(spark, root / "events", EVENTS).groupBy("key").transformWithStateInPandas(
        statefulProcessor=_count_processor(), outputStructType="key string, count long, total long",
        outputMode="Update", timeMode="None")


def _count_processor():
    """A ValueState counter per key (defined in a function, so cloudpickle ships it by value)."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class CountProcessor(StatefulProcessor):
        def init(self, handle) -> None:
            schema = StructType([StructField("count", LongType()), StructField("total", LongType())])
            self.state = handle.getValueState("counts", schema)

        def handleInputRows(self, key, rows, timerValues):
            count, total = self.state.get() if self.state.exists() else (0, 0)
            for frame in rows:
                count += len(frame)
                total += int(frame["value"].sum())
            self.state.update((count, total))
            yield pd.DataFrame({"key": [key[0]], "count": [count], "total": [total]})

        def close(self) -> None:
            pass

    return CountProcessor()


def _file_to_file(spark, root: Path):
    from pyspark.sql import functions as F

    return _stream(spark, root / "events", EVENTS).where(F.col("value") % 3 != 0).select(
        "key", "value", (F.col("value") * 2).alias("doubled"))


ROCKS_CHANGELOG = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB,
                   "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}

SHAPES: dict[str, Shape] = {
    "aggregation_hdfs": Shape("aggregation_hdfs", {}, _events, _aggregate),
    "rocksdb_changelog": Shape("rocksdb_changelog", dict(ROCKS_CHANGELOG), _events, _aggregate),
    "rocksdb_v2": Shape("rocksdb_v2", {**ROCKS_CHANGELOG, "spark.sql.streaming.stateStore.checkpointFormatVersion": "2"},
                        _events, _aggregate),
    "stream_join": Shape("stream_join", {}, _join_inputs, _join, output_mode="append"),
    "dedup_watermark": Shape("dedup_watermark", {}, _dedup_inputs, _dedup, output_mode="append"),
    "transform_with_state": Shape("transform_with_state", {"spark.sql.streaming.stateStore.providerClass": ROCKSDB},
                                  _events, _transform_with_state),
    "file_to_file": Shape("file_to_file", {}, _events, _file_to_file, output_mode="append", file_sink=True),
}
SHAPE_NAMES = list(SHAPES)
# The round trips' input (tests/test_roundtrip.py, test_object_stores.py, test_azure_crc64.py): a savepoint taken
# while the first files are read, the restored query run over all of them.
FIRST_FILES, ALL_FILES = 8, 12


def wait_for_batch(query, batch_id: int, timeout: float = 120) -> int:
    """Wait until ``query`` has committed ``batch_id``; return its newest committed batch id.

    Raises ``RuntimeError`` (with ``query.exception()``) if the query died, ``TimeoutError`` on timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"streaming query {query.name} failed: {error}")
        progress = query.lastProgress
        if progress and progress["batchId"] >= batch_id:
            return progress["batchId"]
        if not query.isActive:
            raise RuntimeError(f"streaming query {query.name} stopped before committing batch {batch_id}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"streaming query {query.name} did not commit batch {batch_id} within {timeout}s")
        time.sleep(0.1)


@contextmanager
def session_conf(spark, conf: dict[str, str]) -> Iterator[None]:
    """``conf`` set on the shared session for the block, each key's previous value (or none) put back after."""
    previous = {key: spark.conf.get(key, None) for key in conf}
    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in previous.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)


def restore_session_conf(spark, settings: dict[str, str]) -> None:
    """The session's SQL settings made ``settings`` again: keys set since unset, changed values put back."""
    for key, value in dict(spark.conf.getAll).items():
        if key not in settings:
            spark.conf.unset(key)
        elif settings[key] != value:
            spark.conf.set(key, settings[key])


def run_to_end(query, timeout: float = 180) -> None:
    """Process everything available now; raise if the query failed or took longer than ``timeout``.

    ``processAllAvailable`` has no timeout of its own, so it runs in a helper thread; on timeout the
    query is stopped (which also ends that thread) and ``TimeoutError`` is raised.
    """
    import threading

    outcome: list[BaseException] = []

    def process() -> None:
        try:
            query.processAllAvailable()
        except BaseException as error:  # re-raised in the caller's thread
            outcome.append(error)

    worker = threading.Thread(target=process, name=f"run-to-end-{query.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        query.stop()
        worker.join(30)
        raise TimeoutError(f"streaming query {query.name} did not finish its input within {timeout}s")
    if outcome:
        raise outcome[0]
