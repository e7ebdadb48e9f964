"""Reading ``_metadata`` (``core/manifest.py``): each way it can be wrong has its own error."""

from __future__ import annotations

import json

import pytest

from airflow_savepoints.core.manifest import SAVEPOINT_NAME, new_savepoint_id, parse_manifest, read_manifest
from airflow_savepoints.errors import (
    IncompleteSavepointError,
    ManifestCorruptError,
    ManifestVersionError,
)
from airflow_savepoints.storage import Store

GOOD = {"format": "airflow-savepoints/savepoint", "format_version": 1, "savepoint_id": "savepoint-q-0123456789ab",
        "job": "orders", "query_id": "q", "batch_id": 0, "type": "manual", "created_at": "2026-01-01T00:00:00+00:00",
        "tool_version": "0.1.0", "checkpoint": "file:///c", "files": [], "total_bytes": 0}


def test_savepoint_ids_follow_flinks_naming():
    sid = new_savepoint_id("5d5a3b9c-7a3e")
    assert sid.startswith("savepoint-5d5a3b-") and SAVEPOINT_NAME.match(sid)
    assert SAVEPOINT_NAME.match(new_savepoint_id("../..")) and not SAVEPOINT_NAME.match(sid + "\n")


@pytest.mark.parametrize("data, error, says", [
    (b"\xff", ManifestCorruptError, "not valid JSON"),
    (b"[]", ManifestCorruptError, "not an airflow-savepoints manifest"),
    (json.dumps({**GOOD, "format_version": "1"}).encode(), ManifestCorruptError, "no valid format_version"),
    (json.dumps({**GOOD, "format_version": 99}).encode(), ManifestVersionError, "newer than this release"),
    (json.dumps({**GOOD, "batch_id": -1}).encode(), ManifestCorruptError, "batch_id"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "format"}).encode(), ManifestCorruptError, "format marker None"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "format_version"}).encode(), ManifestCorruptError, "no valid"),
    (json.dumps({**GOOD, "files": [{"path": "a", "size": 1, "checksum": "00"}] * 2}).encode(), ManifestCorruptError,
     "files"),
])
def test_each_fault_has_its_error(data, error, says):
    with pytest.raises(error, match=says):
        parse_manifest(data, "x/_metadata")


def test_unknown_keys_of_a_newer_minor_writer_are_kept():
    assert parse_manifest(json.dumps({**GOOD, "later": 1}).encode(), "x").model_extra == {"later": 1}


def test_a_location_without_metadata_is_incomplete(tmp_path):
    with pytest.raises(IncompleteSavepointError, match="incomplete savepoint"):
        read_manifest(Store(str(tmp_path)))
    (tmp_path / "_metadata").write_text(json.dumps(GOOD))
    assert read_manifest(Store(str(tmp_path))).savepoint_id == GOOD["savepoint_id"]
