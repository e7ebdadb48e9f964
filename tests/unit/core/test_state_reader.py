"""The Spark-free parts of reading a savepoint's state: which stores an operator's metadata names,
the skew, JSON of Spark values, Kafka positions, and the error without pyspark."""

from __future__ import annotations

import datetime as dt
import json
import sys
from decimal import Decimal

import pytest

from airflow_savepoints.core.source_positions import is_kafka_offset, kafka_starting_offsets
from airflow_savepoints.core.state_reader import _Reader, json_safe, spark_session
from airflow_savepoints.core.state_summary import skew
from airflow_savepoints.errors import SparkNotInstalledError

# operatorProperties as Spark 4.2's state-metadata source returned them for a transformWithStateInPandas query
TWS = {"timeMode": "NoTime", "outputMode": "Update",
       "stateVariables": [{"stateName": "counts", "stateVariableType": "ValueState", "ttlEnabled": False}]}
NO_FILES = {"store_bytes": {}}


def test_transform_with_state_is_read_per_variable_and_its_timers_when_it_has_a_time_mode():
    stores = _Reader._stores([{"stateStoreName": "default"}], TWS, NO_FILES)
    assert [(s.store, s.state_var, s.kind) for s in stores] == [("default", "counts", "ValueState")]
    timed = {**TWS, "timeMode": "ProcessingTime", "stateVariables": [
        *TWS["stateVariables"], {"stateName": "seen", "stateVariableType": "ListState", "ttlEnabled": True}]}
    stores = _Reader._stores([{"stateStoreName": "default"}], timed, NO_FILES)
    assert [(s.state_var, s.kind) for s in stores] == [("counts", "ValueState"), ("seen", "ListState"), (None, "timers")]


def test_a_join_is_read_store_by_store_and_its_index_stores_are_not_added():
    names = ["left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues", "right-keyWithIndexToValue"]
    stores = _Reader._stores([{"stateStoreName": n} for n in names], {}, NO_FILES)
    assert [(s.store, s.counted) for s in stores] == [(n, not n.endswith("keyToNumValues")) for n in names]
    # without operator metadata (Spark 3.5): the store folders the manifest lists, else the default store
    legacy = _Reader._stores([], {}, {"store_bytes": {"right-keyToNumValues": 1, "left-keyToNumValues": 1}})
    assert [s.store for s in legacy] == ["left-keyToNumValues", "right-keyToNumValues"]
    assert [s.store for s in _Reader._stores([], {}, NO_FILES)] == ["default"]


def test_skew_is_the_largest_partition_over_the_mean():
    assert skew([3, 2]) == 1.2 and skew([5, 5, 5]) == 1.0 and skew([8, 0, 0, 0]) == 4.0
    assert skew([]) is None and skew([0, 0]) is None


def test_spark_values_become_plain_json():
    value = {"ts": dt.datetime(2026, 1, 1, 0, 0, 30), "day": dt.date(2026, 1, 2), "raw": b"\x00\xff",
             "amount": Decimal("1.50"), "nan": float("nan"), "nested": [{"k": 1}], "span": dt.timedelta(seconds=90)}
    assert json.loads(json.dumps(json_safe(value))) == {
        "ts": "2026-01-01T00:00:30", "day": "2026-01-02", "raw": "AP8=", "amount": "1.50", "nan": "nan",
        "nested": [{"k": 1}], "span": 90.0}


def test_kafka_offsets_are_told_apart_and_written_as_starting_offsets():
    assert is_kafka_offset({"orders": {"1": 5, "0": 7}}) and not is_kafka_offset({"logOffset": 3})
    assert not is_kafka_offset(12) and not is_kafka_offset({}) and not is_kafka_offset({"t": {"x": 1}})
    assert kafka_starting_offsets({"b": {"10": 1, "2": 3}, "a": {"0": 0}}) == '{"a":{"0":0},"b":{"2":3,"10":1}}'


def test_without_pyspark_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError, as without the extra
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)
    with pytest.raises(SparkNotInstalledError) as raised:
        spark_session()
    assert raised.value.code == "spark_not_installed" and "pip install 'airflow-savepoints[spark]'" in raised.value.hint
