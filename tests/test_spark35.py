"""Checkpoints written by Spark 3.5 (tests/data/spark35, made by make_spark35_checkpoints.py).

A savepoint of a 3.5 checkpoint restores and runs on this package's Spark 4.x, with its state:
the totals after the restart cover all input, not only what came after it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint
from tests.data.make_spark35_checkpoints import INPUT, PROVIDERS, write_input
from tests.support.spark_shapes import DEFAULT_CONF

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data" / "spark35"


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_spark35_checkpoint_saves_restores_and_runs_on_spark4(spark, name, tmp_path):
    from pyspark.sql import functions as F

    assert (DATA / "SPARK_VERSION").read_text().startswith("3.5")
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(DATA / name, checkpoint)
    info = take_savepoint(str(checkpoint), f"legacy-{name}", savepoint_dir=str(tmp_path / "sp"))
    manifest = info.manifest
    assert manifest.batch_id == 4 and manifest.state_store.provider == PROVIDERS[name]
    assert manifest.state_store.checkpoint_format_version == 1
    assert not any(f.path.endswith("_metadata/metadata") for f in manifest.files)  # 3.5 wrote no operator metadata

    shutil.rmtree(INPUT, ignore_errors=True)
    write_input(0, 8)  # the 5 files the 3.5 query read, at the same paths, and 3 new ones
    restored = tmp_path / "restored"
    result = restore_savepoint(info.pointer, str(restored))
    for key in DEFAULT_CONF:  # the session is shared: back to Spark's defaults, which wrote these logs
        spark.conf.unset(key)
    for key, value in result.spark_conf_to_set.items():
        spark.conf.set(key, value)
    latest: dict[str, tuple[int, int]] = {}

    def collect(frame, batch_id):
        for row in frame.collect():
            latest[row.key] = (row.n, row.total)

    frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(str(INPUT))
    query = (frame.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
             .writeStream.outputMode("update").foreachBatch(collect)
             .option("checkpointLocation", str(restored)).start())
    query.processAllAvailable()
    first_batch = query.recentProgress[0]["batchId"]
    query.stop()
    assert first_batch == 5
    expected: dict[str, list[int]] = {}
    for part in sorted(INPUT.glob("part-*.json")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            n, total = expected.get(row["key"], [0, 0])
            expected[row["key"]] = [n + 1, total + row["value"]]
    assert {k: list(v) for k, v in latest.items()} == expected
