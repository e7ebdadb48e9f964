"""Round trips with real Spark for every query shape: savepoint while running, restore, compare.

For each shape: run it on fixed input; take a savepoint while it runs; keep it running, then stop
it; add the rest of the input; restore the savepoint into a new checkpoint location and run the
restored query to the end. Its sink (batches up to N from the first run, after N from the
restored one) must equal, batch by batch, the sink of an uninterrupted run over all the input.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.demo.app import wait_for_batch
from airflow_savepoints.errors import SinkAheadError
from tests.conftest import remove_checkpoint
from tests.support.spark_shapes import ALL_FILES, FIRST_FILES, SHAPE_NAMES, SHAPES, run_to_end

pytestmark = pytest.mark.slow

SPARK_ONLY_SETTINGS = (
    "spark.sql.streaming.stateStore.checkpointFormatVersion",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
)
# ``references`` (tests/conftest.py): the sink of an uninterrupted run of each shape over ALL_FILES, once a session


def round_trip(spark, name: str, base: Path, savepoint_dir: str) -> tuple[dict, dict, int]:
    shape = SHAPES[name]
    inputs, checkpoint, sink = base / "input", str(base / "checkpoint"), base / "sink"
    shape.write_input(inputs, 0, FIRST_FILES)
    query = shape.start(spark, inputs, checkpoint, sink)
    wait_for_batch(query, 2)
    assert query.isActive
    info = take_savepoint(checkpoint, name, savepoint_dir=savepoint_dir, savepoint_type="periodic")
    n = info.manifest.batch_id
    assert n >= 2
    wait_for_batch(query, min(n + 2, FIRST_FILES - 1))  # it keeps running past the savepoint
    query.stop()
    verify_savepoint(info.pointer)

    shape.write_input(inputs, FIRST_FILES, ALL_FILES)  # the rest of the input
    restored_checkpoint = str(base / "restored-checkpoint")
    if (sink / "_spark_metadata").exists():  # a file sink past the savepoint: restore refuses
        with pytest.raises(SinkAheadError):
            restore_savepoint(info.pointer, restored_checkpoint, sink_path=str(sink))
        assert not Path(restored_checkpoint).exists()
    result = restore_savepoint(info.pointer, restored_checkpoint)
    for key in SPARK_ONLY_SETTINGS:  # the manifest recorded what Spark does not persist
        if key in shape.sql_conf and key in result.spark_conf_to_set:
            assert result.spark_conf_to_set[key] == shape.sql_conf[key], key

    if name == "transform_with_state":  # its operator metadata holds absolute schema paths: rewritten
        assert result.rewritten and all("/_metadata/v2/" in p for p in result.rewritten)
        for rel in result.rewritten:
            text = (Path(restored_checkpoint) / rel).read_text()
            assert f"file:{restored_checkpoint}/state/" in text and checkpoint not in text
    remove_checkpoint(Path(checkpoint))  # the savepoint must be self-contained: the original is gone

    restored_sink = base / "restored-sink"
    query = shape.start(spark, inputs, restored_checkpoint, restored_sink)
    run_to_end(query)
    query.stop()
    first, restored = shape.read_sink(sink), shape.read_sink(restored_sink)
    assert min(restored) == n + 1, "the restored query resumes right after the savepoint's batch"
    combined = {b: rows for b, rows in first.items() if b <= n} | restored
    return combined, info.summary(), n


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_round_trip_local(spark, references, name, tmp_path):
    combined, summary, n = round_trip(spark, name, tmp_path, str(tmp_path / "savepoints"))
    assert combined == references(name)
    assert summary["batch_id"] == n and summary["files"] > 0


@pytest.mark.s3
@pytest.mark.parametrize("name", ["rocksdb_v2", "transform_with_state"])
def test_round_trip_with_savepoints_on_s3(spark, references, name, tmp_path, s3):
    combined, summary, _ = round_trip(spark, name, tmp_path, f"s3a://{s3}/savepoints")
    assert summary["pointer"].startswith(f"s3a://{s3}/savepoints/{name}/savepoint-")
    assert combined == references(name)
