"""Racing Spark's own cleanup: savepoints of a fast query that keeps only 2 batches.

With ``spark.sql.streaming.minBatchesToRetain=2`` and a 50 ms trigger, Spark purges offsets,
commits and state files while a savepoint copies them. Each savepoint must either complete
consistently (retried onto a newer batch if needed) or fail with a clear error; never complete
inconsistent. Consistency is checked by restoring each completed savepoint, running the query on
to the end of the input, and comparing the aggregates with the truth computed from the input.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint
from airflow_savepoints.errors import SavepointRetriesExhaustedError
from tests.support.spark_shapes import DEFAULT_CONF

pytestmark = pytest.mark.slow
FILES, ROWS, KEYS, SAVEPOINTS = 40, 20, 7, 4


def write_input(folder: Path) -> dict[int, tuple[int, int]]:
    """FILES files of ROWS rows; returns the true (count, sum) per key over all of them."""
    folder.mkdir(parents=True)
    truth: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for index in range(FILES):
        rows = [{"k": (index * ROWS + r) % KEYS, "v": index * ROWS + r} for r in range(ROWS)]
        path = folder / f"part-{index:04d}.json"
        path.write_text("\n".join(json.dumps(row) for row in rows))
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
        for row in rows:
            truth[row["k"]][0] += 1
            truth[row["k"]][1] += row["v"]
    return {k: (c, s) for k, (c, s) in truth.items()}


def aggregate(spark, input_dir: Path, files_per_batch: int | None = 1):
    from pyspark.sql import functions as F

    reader = spark.readStream.schema("k int, v long")
    if files_per_batch:
        reader = reader.option("maxFilesPerTrigger", files_per_batch)
    events = reader.json(str(input_dir))
    return events.groupBy("k").agg(F.count("*").alias("c"), F.sum("v").alias("s"))


def test_savepoints_racing_spark_cleanup_complete_consistently_or_fail_clearly(spark, tmp_path):
    truth = write_input(tmp_path / "input")
    for key, value in {**DEFAULT_CONF, "spark.sql.streaming.minBatchesToRetain": "2"}.items():
        spark.conf.set(key, value)
    checkpoint = tmp_path / "checkpoint"
    query = (aggregate(spark, tmp_path / "input").writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", str(checkpoint)).trigger(processingTime="50 milliseconds").start())
    taken, failed = [], []
    try:
        while len(taken) + len(failed) < SAVEPOINTS and query.isActive:
            progress = query.lastProgress
            if progress is None or progress["batchId"] < 2:
                time.sleep(0.1)
                continue
            try:
                taken.append(take_savepoint(str(checkpoint), "race", savepoint_dir=str(tmp_path / "sp"),
                                            parallelism=1, max_attempts=5))
            except SavepointRetriesExhaustedError as exc:
                assert "attempts" in exc.message and exc.hint
                failed.append(exc)
            time.sleep(0.1)
        purged = min(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    finally:
        query.stop()
        spark.conf.set("spark.sql.streaming.minBatchesToRetain", "100")
    attempts = [info.manifest.attempts for info in taken]
    print(f"{len(taken)} savepoints completed (attempts {attempts}), {len(failed)} failed clearly; "
          f"Spark had purged commits below batch {purged}")
    assert taken, "no savepoint completed"
    assert purged > 0, "Spark's cleanup did not run: the race was not exercised"

    for number, info in enumerate(taken):
        restored = tmp_path / f"restored-{number}"
        restore_savepoint(info.pointer, str(restored))
        name = f"race_check_{number}"
        rest = aggregate(spark, tmp_path / "input", files_per_batch=None)  # the remaining files at once
        resumed = (rest.writeStream.outputMode("complete").format("memory").queryName(name)
                   .option("checkpointLocation", str(restored)).trigger(availableNow=True).start())
        resumed.awaitTermination(180)
        assert resumed.exception() is None, resumed.exception()
        result = {row["k"]: (row["c"], row["s"]) for row in spark.sql(f"select * from {name}").collect()}
        first = resumed.recentProgress[0]["batchId"] if resumed.recentProgress else None
        assert first == info.manifest.batch_id + 1, (first, info.manifest.batch_id)  # it resumed right after N
        assert result == truth, f"savepoint of batch {info.manifest.batch_id} restored to wrong aggregates"
