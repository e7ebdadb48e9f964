"""Rescale planning (``core/rescale.py``) without Spark: what is refused, left out or a no-op, and how
Spark's error classes map to our codes (messages as Spark 4.2 wrote them in tests/test_rescale.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.manifest import parse_manifest
from airflow_savepoints.core.rescale import plan_rescale, spark_error, spark_version, trailing_files
from airflow_savepoints.errors import (
    RescaleFailedError,
    RescaleRefusedError,
    RescaleUnavailableError,
    RescaleUnsupportedOperatorError,
    RescaleUnsupportedStateError,
)
from airflow_savepoints.storage import Store
from tests.support.spark_shapes import HDFS, ROCKSDB
from tests.unit.core.test_models import manifest

STATE = ["state/0/_metadata/metadata", "state/0/0/3.changelog", "state/0/1/3.changelog", "state/0/2/3.changelog",
         "state/0/2/SSTs/000008-a.sst", "state/0/0/4.changelog", "state/0/1/4.changelog", "state/0/2/4.changelog"]


def rocks(provider: str = ROCKSDB, partitions: str = "3", paths: list[str] = STATE, **changes):
    files = [{"path": p, "size": 1, "checksum": "00000000"} for p in ["metadata", "offsets/1", "offsets/2", "offsets/3",
                                                                         *paths]]
    files += [{"path": p, "size": 1, "checksum": "00000000"} for p in ["sources/0/0", "sources/0/1", "sources/0/2.compact",
                                                                          "sources/0/3", "sources/1/3"]]
    fields = dict(batch_id=2, includes_next_offsets=True, files=files, total_bytes=len(files),
                  source_offsets={"0": {"logOffset": 2}, "1": {"kafka": {"0": 7}}},
                  spark_conf={"spark.sql.shuffle.partitions": partitions}, state_store={"provider": provider, "operators": ["0"]})
    return manifest(**{**fields, **changes})


def test_partitions_per_operator_from_the_files_of_an_older_manifest():
    old = rocks()
    assert old.state_store.partitions == {} and old.state_partitions() == {"0": 3}
    assert formats.state_partitions(STATE, version=4) == {"0": 3}
    assert formats.state_partitions(["state/1/4/left-keyToNumValues/7.delta", "state/1/4/.7.delta.crc"]) == {"1": 1}


def test_a_new_manifest_reads_in_a_release_that_does_not_know_partitions():
    data = rocks(state_store={"provider": ROCKSDB, "operators": ["0"], "partitions": {"0": 3}}).model_dump(mode="json")
    assert parse_manifest(json.dumps(data).encode(), "x").state_partitions() == {"0": 3}
    del data["state_store"]["partitions"]  # what an older release's model keeps: the field is simply absent
    assert parse_manifest(json.dumps(data).encode(), "x").state_store.partitions == {}


def test_the_trailing_batch_is_left_out_of_a_rescaled_copy():
    plan = plan_rescale(rocks(), 5, "sp")
    assert not plan.noop and plan.before == {"0": 3} and plan.current == 3
    assert plan.trailing == {"offsets/3", "state/0/0/4.changelog", "state/0/1/4.changelog", "state/0/2/4.changelog",
                             "sources/0/3"}  # the file source's log past batch 2's offset; Kafka's folder is kept
    assert trailing_files(rocks(includes_next_offsets=False)) == set()
    compacted = rocks(paths=[], source_offsets={"0": {"logOffset": 1}})
    compacted = compacted.model_copy(update={"files": [e for e in compacted.files if e.path not in ("sources/0/0", "sources/0/1")]})
    # only 2.compact holds batch 1's entries: the log stays whole (the next batch then reads two files)
    assert trailing_files(compacted) == {"offsets/3"}


def test_the_same_partition_count_is_a_no_op_even_for_hdfs_state():
    plan = plan_rescale(rocks(provider=HDFS), 3, "sp")
    assert plan.noop and plan.trailing == set()


def test_hdfs_state_is_refused_with_the_way_to_rocksdb():
    with pytest.raises(RescaleUnsupportedStateError) as raised:
        plan_rescale(rocks(provider=HDFS), 5, "sp")
    assert "HDFSBackedStateStoreProvider" in raised.value.message
    assert f"spark.sql.streaming.stateStore.providerClass={ROCKSDB}" in raised.value.hint


def test_state_without_operator_metadata_is_refused():
    with pytest.raises(RescaleRefusedError, match="operator metadata"):
        plan_rescale(rocks(paths=STATE[1:], spark_version="3.5.8"), 5, "sp")


@pytest.mark.parametrize("version", ["3.5.8", "4.1.1", "4.0.0-preview2"])
def test_spark_before_4_2_is_refused(version):
    with pytest.raises(RescaleUnavailableError) as raised:
        spark_version(SimpleNamespace(version=version))
    assert "airflow-savepoints[spark]" in raised.value.hint
    assert spark_version(SimpleNamespace(version="4.2.0")) == (4, 2)


def _py4j(line: str) -> Exception:
    return Exception(f"An error occurred while calling o235.repartition.\n: {line}\n\tat org.apache.spark.X(X.scala:1)")


@pytest.mark.parametrize(("line", "error", "code"), [
    ("org.apache.spark.sql.execution.streaming.state.StateRepartitionUnsupportedProviderError: "
     "[STATE_REPARTITION_INVALID_CHECKPOINT.UNSUPPORTED_PROVIDER] The provided checkpoint location 'file:/r' is in an "
     "invalid state. org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider is not supported "
     "SQLSTATE: 55019", RescaleUnsupportedStateError, "rescale_unsupported_state"),
    ("org.apache.spark.sql.execution.streaming.state.StateRepartitionUnsupportedStatefulOperatorError: "
     "[STATE_REPARTITION_INVALID_CHECKPOINT.UNSUPPORTED_STATEFUL_OPERATOR] The provided checkpoint location 'file:/r' "
     "is in an invalid state. Unsupported stateful operator x.", RescaleUnsupportedOperatorError,
     "rescale_unsupported_operator"),
    ("org.apache.spark.sql.execution.streaming.state.StateRepartitionLastBatchFailedError: "
     "[STATE_REPARTITION_INVALID_CHECKPOINT.LAST_BATCH_FAILED] The provided checkpoint location 'file:/r' is in an "
     "invalid state. The last batch ID 10 didn't finish successfully.", RescaleRefusedError, "rescale_refused"),
    ("org.apache.spark.SparkException: [CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT] Error writing state store files",
     RescaleFailedError, "rescale_failed"),
])
def test_spark_error_classes_map_to_our_codes_with_sparks_message(line, error, code):
    mapped = spark_error(_py4j(line), Store("/tmp/r"))
    assert isinstance(mapped, error) and mapped.code == code and mapped.hint
    assert line.split(": ", 1)[1][:40] in mapped.message
