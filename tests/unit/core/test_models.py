"""The pydantic models (``core/models.py``): manifest validation, the one savepoint summary, requests."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from airflow_savepoints.core.catalog import SavepointRecord, SavepointState
from airflow_savepoints.core.models import (
    SavepointInfo,
    SavepointManifest,
    SavepointSummary,
    SavepointType,
    validate_job_name,
)
from airflow_savepoints.core.restore import RestoreRequest
from airflow_savepoints.core.savepoint import SavepointRequest
from airflow_savepoints.errors import InvalidInputError, InvalidJobNameError

CREATED = datetime(2026, 11, 22, 21, 17, 14, 514033, tzinfo=UTC)


def manifest(**changes) -> SavepointManifest:
    fields = dict(savepoint_id="savepoint-abc123-0123456789ab", job="orders", query_id="abc123-q", batch_id=4,
                  includes_next_offsets=True, type=SavepointType.PERIODIC, reason="hourly", created_at=CREATED,
                  tool_version="0.1.0", spark_version="4.1.0", checkpoint="file:///ckpt",
                  files=[{"path": "metadata", "size": 45, "checksum": "0badf00d"},
                         {"path": "offsets/4", "size": 300, "checksum": "12345678"}],
                  total_bytes=345)
    return SavepointManifest(**{**fields, **changes})


@pytest.mark.parametrize("job", ["", "a/b", "..", "a..b", "-x", "x\n", "x" * 129, 7])
def test_a_job_name_is_one_plain_folder_name(job):
    with pytest.raises(InvalidJobNameError):
        validate_job_name(job)


def test_valid_job_names_pass():
    assert validate_job_name("orders.eu_1-b") == "orders.eu_1-b"


@pytest.mark.parametrize("files, problem", [
    ([{"path": "a", "size": 1, "checksum": "00"}] * 2, "listed twice"),
    ([{"path": "_metadata", "size": 1, "checksum": "00"}], "lists itself"),
    ([{"path": "a", "size": -1, "checksum": "00"}], "greater than or equal"),
])
def test_a_forged_or_damaged_file_list_is_refused(files, problem):
    with pytest.raises(ValidationError, match=problem):
        manifest(files=files)


def test_a_manifest_names_a_valid_job():
    with pytest.raises(InvalidJobNameError):
        manifest(job="../etc")


def test_manifest_and_catalog_record_summaries_have_the_same_keys_and_values():
    m = manifest()
    from_info = SavepointInfo(pointer="file:///sp/orders/" + m.savepoint_id, manifest=m).summary()
    record = SavepointRecord.from_manifest(m, pointer=from_info["pointer"])
    from_record = record.summary()
    assert list(from_info) == list(from_record) == list(SavepointSummary.model_fields)
    assert from_info == from_record  # list (from the catalog) and trigger (from the manifest) answer alike
    assert from_info["includes_next_offsets"] is True
    earlier = SavepointRecord.model_validate(record.model_dump(exclude={"includes_next_offsets"}))
    assert earlier.summary()["includes_next_offsets"] is None  # a record an earlier release wrote does not know it
    assert from_info["created_at"] == "2026-11-22T21:17:14.514033+00:00"  # isoformat, as every release wrote it
    assert (from_info["type"], from_info["state"], from_info["files"], from_info["bytes"]) == ("periodic", "completed", 2, 345)


def test_a_record_summary_carries_its_state_and_conflict():
    record = SavepointRecord(savepoint_id="savepoint-abc123-0123456789ab", job="orders", type=SavepointType.MANUAL,
                             state=SavepointState.FAILED, created_at=CREATED, updated_at=CREATED, conflict="copied")
    summary = record.summary()
    assert (summary["state"], summary["conflict"], summary["type"]) == ("failed", "copied", "manual")


def test_a_savepoint_request_validates_each_field_with_a_hint():
    with pytest.raises(InvalidInputError, match="unknown savepoint type 'weekly'"):
        SavepointRequest.of("take_savepoint", checkpoint="/c", job="j", savepoint_type="weekly")
    with pytest.raises(InvalidInputError, match="unknown copy mode"):
        SavepointRequest.of("take_savepoint", checkpoint="/c", job="j", copy_mode="teleport")
    with pytest.raises(InvalidInputError, match="at least 1"):
        SavepointRequest.of("take_savepoint", checkpoint="/c", job="j", parallelism=0)
    with pytest.raises(InvalidJobNameError):
        SavepointRequest.of("take_savepoint", checkpoint="/c", job="a/b")
    with pytest.raises(InvalidInputError, match="invalid max_attempts"):
        SavepointRequest.of("take_savepoint", checkpoint="/c", job="j", max_attempts="many")


def test_an_unknown_keyword_is_a_type_error_as_for_any_function():
    with pytest.raises(TypeError, match="take_savepoint.. got an unexpected keyword argument 'savepoint_typ'"):
        SavepointRequest.of("take_savepoint", checkpoint="/c", job="j", savepoint_typ="manual")
    with pytest.raises(TypeError, match="restore_savepoint"):
        RestoreRequest.of("restore_savepoint", pointer="/p", target="/t", copy="stream")


def test_a_request_takes_type_names_and_keeps_defaults():
    request = SavepointRequest.of("take_savepoint", checkpoint="/c", job="j", savepoint_type="stop")
    assert request.savepoint_type is SavepointType.STOP
    assert (request.copy_mode, request.incremental, request.parallelism, request.max_attempts) == ("auto", True, None, 5)
    with pytest.raises(ValidationError):  # frozen: a run cannot change what was asked
        request.job = "other"


def test_the_core_package_exports_each_name_it_loads_on_first_use():
    import airflow_savepoints.core as core

    assert sorted(core.__all__) == sorted(core._MODULE_OF)
    assert all(getattr(core, name).__name__ == name for name in core.__all__)
    with pytest.raises(AttributeError):
        core.no_such_name  # noqa: B018
