"""A query RUNNING with its checkpoint on S3 through Hadoop's s3a (moto's S3 server, path-style access).

Savepoints are taken again and again while its batches commit to ``s3a://``; the last one is restored
into a fresh S3 location and the query continued there, on s3a. Its sink (batches up to the
savepoint's from the first run, the rest from the continued one) must equal, batch by batch, the
sink of an uninterrupted run. With the HDFS state store (checkpoint format v1) and RocksDB with
checkpoint format v2 (state files named by unique ids).
"""

from __future__ import annotations

import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.storage import Store
from tests.support.emulators import JARS, jar_files
from tests.support.spark_shapes import SHAPES, run_to_end, wait_for_batch

pytestmark = [pytest.mark.slow, pytest.mark.s3]

FIRST_FILES, ALL_FILES = 6, 9


@pytest.fixture
def s3a(spark, s3_endpoint, s3):
    """Hadoop's s3a in the tests' Spark session, reaching moto's S3 server; a fresh bucket."""
    from tests.conftest import require_part

    require_part("s3a", None if any("hadoop-aws" in j for j in jar_files(JARS / "s3a"))
                 else f"hadoop-aws and the AWS SDK are not in {JARS / 's3a'} (make jars)")
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in {"fs.s3a.endpoint": s3_endpoint, "fs.s3a.endpoint.region": "us-east-1",
                       "fs.s3a.path.style.access": "true", "fs.s3a.connection.ssl.enabled": "false",
                       "fs.s3a.access.key": "testing", "fs.s3a.secret.key": "testing",
                       "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}.items():
        conf.set(key, value)
    return s3


@pytest.mark.parametrize("name", ["aggregation_hdfs", "rocksdb_v2"])
def test_a_query_running_on_s3a_is_savepointed_restored_to_new_s3_and_continued(spark, s3a, name, tmp_path):
    savepointed_while_running_restored_and_continued(spark, name, f"s3a://{s3a}", tmp_path)


def savepointed_while_running_restored_and_continued(spark, name: str, base: str, tmp_path, batches_savepointed: int = 2) \
        -> None:
    """A query of shape ``name`` with its checkpoint below ``base`` (a URL Spark and the store both
    reach): savepoints taken while it commits (of at least ``batches_savepointed`` different batches),
    the last restored below ``base`` and continued there; its sink equals an uninterrupted run's.
    Shared by tests/test_hdfs.py."""
    shape, bucket = SHAPES[name], base
    reference_sink = tmp_path / "reference-sink"
    shape.write_input(tmp_path / "reference-input", 0, ALL_FILES)
    reference = shape.start(spark, tmp_path / "reference-input", str(tmp_path / "reference-checkpoint"), reference_sink)
    run_to_end(reference)
    reference.stop()

    inputs, sink, checkpoint = tmp_path / "input", tmp_path / "sink", f"{bucket}/{name}/checkpoint"
    shape.write_input(inputs, 0, FIRST_FILES)
    query = shape.start(spark, inputs, checkpoint, sink)
    taken = []
    try:
        wait_for_batch(query, 1)
        while query.lastProgress["batchId"] < FIRST_FILES - 2:  # while batches commit to s3a
            taken.append(take_savepoint(checkpoint, name, savepoint_dir=f"{bucket}/savepoints", savepoint_type="periodic"))
        wait_for_batch(query, FIRST_FILES - 1)
    finally:
        query.stop()
    assert Store(checkpoint).isfile("commits/0")  # the checkpoint really is on the store
    assert len({info.manifest.batch_id for info in taken}) >= batches_savepointed
    for info in taken:
        verify_savepoint(info.pointer)
    info = taken[-1]
    n = info.manifest.batch_id
    assert info.manifest.checkpoint == checkpoint and n < FIRST_FILES - 1
    assert info.manifest.state_store.checkpoint_format_version == int(
        shape.sql_conf.get("spark.sql.streaming.stateStore.checkpointFormatVersion", "1"))

    shape.write_input(inputs, FIRST_FILES, ALL_FILES)
    restored_checkpoint, restored_sink = f"{bucket}/{name}/restored", tmp_path / "restored-sink"
    restore_savepoint(info.pointer, restored_checkpoint)
    continued = shape.start(spark, inputs, restored_checkpoint, restored_sink)
    run_to_end(continued)
    continued.stop()
    restored = shape.read_sink(restored_sink)
    assert min(restored) == n + 1
    assert {b: rows for b, rows in shape.read_sink(sink).items() if b <= n} | restored == shape.read_sink(reference_sink)
    assert Store(restored_checkpoint).isfile(f"commits/{max(restored)}")  # it went on committing there
