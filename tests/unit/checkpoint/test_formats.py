"""Spark checkpoint file formats (``checkpoint/formats.py``): which paths are transient, and the parsers."""

from __future__ import annotations

import json
import re

import pytest

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.errors import CheckpointError


@pytest.mark.parametrize("path", [
    "state/0/1/1.delta", "state/0/1/.1.delta.crc", "state/0/1/.12.delta.3f2a.TID7.tmp", ".hidden/offsets/0",
    "offsets/.0.tmp", "sources/0/0", "x.tmp/y", "a/b.tmpl/c", "a/b.tmp", "tmp/a", "a/.b/c", "a/b./c", "a/b/c.crc",
])
def test_transient_paths_are_those_with_a_hidden_or_tmp_part(path):
    per_part = any(part.startswith(".") or part.endswith(".tmp") for part in path.split("/"))
    assert formats.is_transient_path(path) == per_part


def test_stream_metadata_gives_the_query_id():
    assert formats.parse_stream_metadata(json.dumps({"id": "q-1"}).encode() + b"\n") == "q-1"


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"no_id": 1}'])
def test_stream_metadata_without_an_id_is_refused(data):
    with pytest.raises(CheckpointError):
        formats.parse_stream_metadata(data)


def test_spark_sidecar_gives_the_signed_crc_and_the_main_file_size():
    sidecar = formats.parse_spark_sidecar(b'{"algorithm":"CRC32C","value":-1,"mainFileSize":12}', "x.crc")
    assert (sidecar.value, sidecar.main_file_size) == (0xFFFFFFFF, 12)
    with pytest.raises(CheckpointError):
        formats.parse_spark_sidecar(b'{"algorithm":"ADLER32","value":1}', "x.crc")


@pytest.mark.parametrize(("offset", "expected"), [
    ({"orders": {"0": 15, "2": 7}, "refunds": {"0": 0}}, {"orders": {0: 15, 2: 7}, "refunds": {0: 0}}),
    ({"logOffset": 3}, None),  # a file source
    ({"0": {"value": 5, "runTimeMs": 1}}, None),  # a rate source's per-partition record
    ({"orders": {"0": True}}, None), ({"orders": {"x": 1}}, None), ({"orders": {}}, None), ({}, None), (12, None), (None, None),
])
def test_kafka_source_offsets_are_recognised_by_their_shape(offset, expected):
    assert formats.kafka_source_offsets(offset) == expected


@pytest.mark.parametrize("name", [
    "7.delta", "7.snapshot", "12.metadata", "7.zip", "7.changelog", "7_0a-Bc.zip", "7_u.changelog", "7.x.delta", "7.x.y.delta",
    "7.zip.crc", ".7.delta.crc", "7.delta\n", "x7.delta", "7", "7.", "7_.zip", "7_a.b.zip", "٣.delta", "7.delta.zip", "_metadata",
])
def test_one_state_file_pattern_classifies_as_the_three_did(name):
    old = [re.match(rf"^(\d+){suffix}$", name) for suffix in formats.STATE_FILE_SUFFIXES.values()]
    first = next((i for i, m in enumerate(old) if m), None)
    got = formats.STATE_FILE.match(name)
    assert (got is None) == (first is None)
    if got is not None:
        version, hdfs_kind, v1_kind, unique_id, v2_kind = got.groups()
        m = old[first]
        assert version == m.group(1)
        expected = (None, None, *m.groups()[1:]) if first == 2 else (m.group(2), None) if first == 0 else (None, m.group(2))
        assert (hdfs_kind, v1_kind, unique_id, v2_kind) == (expected + (None, None))[:4]
