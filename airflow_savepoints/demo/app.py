"""The demo streaming job: de-duplicate click events by id (stateful) into a JSON file sink.

Runs in-process (``build_query``) or under spark-submit::

    spark-submit airflow_savepoints/demo/app.py INPUT CHECKPOINT OUTPUT
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

EVENT_SCHEMA = "id long, user string, ts timestamp"


def write_events(folder: Path, index: int, per_file: int = 50) -> list[int]:
    """Input file ``index``: events ``index*per_file ..``, re-sending the previous file's last 10 ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = list(range(index * per_file - 10 if index else 0, (index + 1) * per_file))
    path = folder / f"events-{index:05d}.json"
    tmp = folder / f".events-{index:05d}.json.tmp"
    tmp.write_text("\n".join(json.dumps({"id": i, "user": f"u{i % 7}", "ts": f"2026-01-01T00:{(i // 60) % 60:02d}:{i % 60:02d}"})
                             for i in ids))
    # fixed, ordered mtimes: the file source ignores files much older than the newest it saw (maxFileAge)
    os.utime(tmp, (1_700_000_000 + index, 1_700_000_000 + index))
    tmp.rename(path)  # the file source must never see a half-written file
    return ids


class Feeder:
    """Input arriving while something acts on the running demo job (a file every ``every`` seconds), as
    a live stream's would: a file source commits a batch only when input arrives."""

    def __init__(self, folder: Path, sent: set[int], next_index: int, every: float = 2.0) -> None:
        self.folder, self.sent, self.index, self.every = folder, sent, next_index, every
        self._done = threading.Event()
        self._paused = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        while not self._done.wait(self.every):
            if self._paused.is_set():
                continue
            self.sent.update(write_events(self.folder, self.index))
            self.index += 1

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def wait_for_batch(query, batch_id: int, timeout: float = 120) -> int:
    """Wait until ``query`` has committed ``batch_id``; return its newest committed batch id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(f"streaming query {query.name} failed: {query.exception()}")
        progress = query.lastProgress
        if progress and progress["batchId"] >= batch_id:
            return progress["batchId"]
        time.sleep(0.1)
    raise TimeoutError(f"streaming query {query.name} did not commit batch {batch_id} within {timeout}s")


def committed_event_ids(output: Path) -> list[int]:
    """Event ids in the files the file sink committed, as Spark readers see them (``_spark_metadata``).

    Files of a batch that was interrupted are on disk but not committed: they do not count.
    """
    return sorted(row["id"] for row in committed_rows(output))


def committed_rows(output: Path) -> list[dict]:
    """The records in the files the file sink committed (see :func:`committed_event_ids`)."""
    rows: list[dict] = []
    log = Path(output) / "_spark_metadata"
    names = [p.name for p in log.iterdir()] if log.exists() else []
    compact = max((int(n.split(".")[0]) for n in names if n.endswith(".compact")), default=-1)
    entries = ([f"{compact}.compact"] if compact >= 0 else []) + [n for n in names if n.isdigit() and int(n) > compact]
    for name in entries:  # the newest compact file holds every earlier entry
        rows += sink_log_rows(output, name)
    return rows


def sink_log_rows(output: Path, entry: str) -> list[dict]:
    """The records in the files that one entry of the file sink's log (``_spark_metadata/<entry>``) lists."""
    rows: list[dict] = []
    for line in (Path(output) / "_spark_metadata" / entry).read_text().splitlines()[1:]:
        path = Path(json.loads(line)["path"].removeprefix("file://").removeprefix("file:"))
        rows += [json.loads(x) for x in path.read_text().splitlines() if x]
    return rows


SKIP_BAD_RECORDS_CONF = "spark.savepoints.demo.skipBadRecords"
VERSION_COLUMN_CONF = "spark.savepoints.demo.versionColumn"
FAIL_EVERY_BATCH_CONF = "spark.savepoints.demo.failEveryBatch"
STALL_WHILE_CONF = "spark.savepoints.demo.stallWhile"
ID_AS_STRING_CONF = "spark.savepoints.demo.idAsString"
DEDUP_USERS_CONF = "spark.savepoints.demo.dedupUsers"


def _held_while(marker: str):
    """A Python UDF passing a value through once the file ``marker`` is gone."""
    from pyspark.sql import functions as F

    def held(value):
        while os.path.exists(marker):
            time.sleep(0.2)
        return value

    return F.udf(held, "long")


def write_bad_record(folder: Path, index: int) -> None:
    """Input file ``index`` holding one event with a negative id, which the job rejects."""
    path = folder / f"events-{index:05d}.json"
    path.write_text(json.dumps({"id": -1, "user": "bad", "ts": "2026-01-01T00:00:00"}))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # in order with write_events' files


def build_query(spark, input_dir: str, checkpoint: str, output: str, trigger_ms: int = 500):
    """A negative id is a bad record: the query fails on it, unless ``spark.savepoints.demo.skipBadRecords``
    is true (the fixed version of the job), which drops such records. Two more versions, for upgrades:
    ``spark.savepoints.demo.versionColumn=V`` adds an output column ``version`` holding V (a compatible
    change: the state is untouched), ``spark.savepoints.demo.failEveryBatch=true`` raises on every record.
    ``spark.savepoints.demo.stallWhile=PATH`` holds each record while the file PATH exists: a batch
    that hangs, input waiting and nothing committed (a stalled job, for the watchdog). Two versions whose
    state does not fit the running one's (an upgrade check refuses them): ``spark.savepoints.demo.idAsString=true``
    de-duplicates on ``id`` as a string (a changed key type), ``spark.savepoints.demo.dedupUsers=true`` adds a
    second de-duplication, by user (an added stateful operator)."""
    from pyspark.sql import functions as F

    events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).json(input_dir)
    if hold := spark.conf.get(STALL_WHILE_CONF, ""):
        events = events.withColumn("id", _held_while(hold)("id"))
    if spark.conf.get(FAIL_EVERY_BATCH_CONF, "false").lower() == "true":
        events = events.withColumn("id", F.raise_error(F.lit("demo: this version fails on every batch")).cast("long"))
    if spark.conf.get(SKIP_BAD_RECORDS_CONF, "false").lower() == "true":
        events = events.where(F.col("id") >= 0)
    else:
        events = events.withColumn(
            "id", F.when(F.col("id") < 0, F.raise_error(F.concat(F.lit("bad record: negative id "), F.col("id").cast("string"))))
            .otherwise(F.col("id")))
    if spark.conf.get(ID_AS_STRING_CONF, "false").lower() == "true":
        events = events.withColumn("id", F.col("id").cast("string"))
    unique = events.withWatermark("ts", "1 hour").dropDuplicatesWithinWatermark(["id"])
    if spark.conf.get(DEDUP_USERS_CONF, "false").lower() == "true":
        unique = unique.dropDuplicatesWithinWatermark(["user"])
    if version := spark.conf.get(VERSION_COLUMN_CONF, ""):
        unique = unique.withColumn("version", F.lit(version))
    return (unique.writeStream.format("json").option("path", output).option("checkpointLocation", checkpoint)
            .queryName("demo-dedup").trigger(processingTime=f"{trigger_ms} milliseconds").start())


def main(argv: list[str]) -> None:
    from pyspark.sql import SparkSession

    input_dir, checkpoint, output = argv[1:4]
    from airflow_savepoints.jobs.driver.control import claim_run, run_until_stopped

    spark = SparkSession.builder.appName("airflow-savepoints-demo").getOrCreate()
    claim_run(spark)  # before the query starts: a stale run (another run holds the job's lease) writes nothing
    run_until_stopped(build_query(spark, input_dir, checkpoint, output), spark)  # stops cleanly when Airflow asks
    spark.stop()


if __name__ == "__main__":
    main(sys.argv)
