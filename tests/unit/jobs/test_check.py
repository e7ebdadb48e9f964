"""The upgrade check's parts without Spark: its refusals (nothing written), Spark's message, check_first."""

from __future__ import annotations

import pytest

from airflow_savepoints.core.spark_cause import spark_message
from airflow_savepoints.errors import UpgradeRefusedError
from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.workflows.check import check_upgrade
from airflow_savepoints.jobs.workflows.run import JobContext
from airflow_savepoints.operators.upgrade import _automatic_or_flag
from airflow_savepoints.storage import Store


def test_a_job_that_does_not_run_is_refused_and_nothing_is_written(tmp_path):
    job = StreamingJob(name="j", application="app.py", checkpoint=str(tmp_path / "cp"),
                       savepoint_dir=str(tmp_path / "savepoints"))
    with pytest.raises(UpgradeRefusedError, match="not_started, not running: nothing to check"):
        check_upgrade(JobContext(job, Store(job.savepoint_dir)), job.version(), submit_for=lambda j: None,
                      log_dir=tmp_path / "logs")
    assert not (tmp_path / "savepoints").exists() and not (tmp_path / "logs").exists()


def test_spark_message_leaves_the_plan_out():
    error = RuntimeError("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match.\n"
                         "=== Streaming Query ===\nIdentifier: [id = 1]\nLogical Plan: ...")
    assert spark_message(error) == "[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match."


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("", None), ("auto", None), ("None", None),
                                                 (True, True), ("true", True), ("False", False), (False, False)])
def test_check_first_auto_or_a_flag(value, expected):
    assert _automatic_or_flag(value) is expected


def test_state_partitions_go_to_the_restore_only_when_given():
    """Without state_partitions the restore gets no such keyword; with it, the restore's own field."""
    from airflow_savepoints.core.restore import RestoreRequest
    from airflow_savepoints.jobs.workflows.check import rescale_options

    assert rescale_options(None) == {}
    assert rescale_options(4) == {"state_partitions": 4}
    assert RestoreRequest.of("restore_savepoint", pointer="p", target="t", **rescale_options(4)).state_partitions == 4


def test_only_a_result_sealed_with_the_checks_secret_counts(tmp_path):
    """Issue 40: a forged ``result.json`` saying "passed" is not the check's answer (a real driver
    process that exits without one: the check fails, naming the forgery); a sealed one is."""
    import json

    from airflow_savepoints.core.redaction import redact_command
    from airflow_savepoints.jobs.description import trust
    from airflow_savepoints.jobs.description.record import read_run
    from airflow_savepoints.jobs.launch.launcher import start_detached
    from airflow_savepoints.jobs.workflows.check import _wait_for_result

    scratch = Store(str(tmp_path / "_check" / "c1"))
    secret = trust.new_secret()
    forged = {"outcome": "passed", "batch_id": 999999}
    scratch.write_bytes_atomic("result.json", json.dumps(forged).encode())
    driver = start_detached("j-check", ["sh", "-c", "sleep 1"], scratch.child("checkpoint"), scratch, tmp_path / "logs",
                            env={trust.CHECK_SECRET_ENV: secret}, secrets=[secret])
    warnings: list[str] = []
    result = _wait_for_result(scratch, driver, 30, poll=0.1, secret=secret, log=warnings.append)
    assert result["outcome"] == "failed" and "not sealed" in result["error"], result  # today: "passed"
    assert warnings and "result.json" in warnings[0]
    sealed = trust.seal({**forged, "batch_id": 7}, secret)
    scratch.write_bytes_atomic("result.json", json.dumps(sealed).encode())
    assert _wait_for_result(scratch, driver, 5, secret=secret) == {"outcome": "passed", "batch_id": 7}
    assert not trust.sealed({**sealed, "batch_id": 8}, secret) and not trust.sealed(sealed, trust.new_secret())
    command = ["spark-submit", "--conf", f"{trust.CHECK_SECRET_CONF}={secret}", "app.py"]
    assert secret not in json.dumps(redact_command(command, [])) and secret not in read_run(scratch).model_dump_json()


def test_a_scratch_folder_someone_writes_into_is_retried_then_left_with_a_warning(tmp_path, monkeypatch):
    """A writer of the savepoint folder racing the removal (a folder not empty) makes the removal fail:
    it is tried again, and a removal that keeps failing is a warning, never the check's error (CI saw a
    storage error replace Spark's own message)."""
    from airflow_savepoints.errors import StorageError
    from airflow_savepoints.jobs.workflows.check import _remove_scratch

    job = StreamingJob(name="j", application="app.py", checkpoint=str(tmp_path / "cp"),
                       savepoint_dir=str(tmp_path / "savepoints"))
    warnings: list[str] = []
    ctx = JobContext(job, Store(job.savepoint_dir), log=warnings.append)
    scratch = ctx.folder.child("_check").child("c1")
    scratch.write_bytes_atomic("checkpoint/offsets/0", b"v1")
    real, failures = Store.remove_tree, iter([True])

    def racing(self, rel):
        if next(failures, False):
            raise StorageError("storage error: folder not empty", "try again")
        real(self, rel)

    monkeypatch.setattr(Store, "remove_tree", racing)
    _remove_scratch(ctx, scratch)
    assert not (tmp_path / "savepoints" / "j" / "_check" / "c1").exists() and not warnings

    scratch.write_bytes_atomic("result.json", b"{}")
    failures = iter([True] * 3)
    _remove_scratch(ctx, scratch)
    assert (tmp_path / "savepoints" / "j" / "_check" / "c1" / "result.json").exists()
    assert len(warnings) == 1 and "not removed" in warnings[0] and scratch.url in warnings[0]
