"""CancelJobOperator with each checkpoint retention policy, on a real job started with spark-submit."""

from __future__ import annotations

import pytest

import airflow_savepoints.demo.app as demo
from airflow_savepoints.core import list_savepoints, restore_savepoint
from airflow_savepoints.core.termination import CheckpointRetentionPolicy, apply_checkpoint_retention
from airflow_savepoints.errors import InvalidInputError, NotACheckpointError
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.jobs.launch.launcher import process_alive, start_detached, wait_for_commit
from airflow_savepoints.operators.job import CancelJobOperator
from airflow_savepoints.storage import Store
from tests.conftest import tree_snapshot

pytestmark = pytest.mark.slow


def start_demo(tmp_path, policy: str):
    for index in range(2):
        demo.write_events(tmp_path / "input", index)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n  - name: demo\n"
        f"    application: {demo.__file__}\n"
        f"    application_args: ['{tmp_path}/input', '{{checkpoint}}', '{tmp_path}/output']\n"
        "    spark_conf: {spark.ui.enabled: 'false', spark.sql.shuffle.partitions: '2'}\n"
        f"    checkpoint: {tmp_path}/checkpoint\n"
        f"    savepoint_dir: {tmp_path}/savepoints\n"
        f"    checkpoint_retention: {policy}\n")
    command = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false", demo.__file__,
               str(tmp_path / "input"), str(tmp_path / "checkpoint"), str(tmp_path / "output")]
    checkpoint = Store(str(tmp_path / "checkpoint"))
    run = start_detached("demo", command, checkpoint, Store(str(tmp_path / "savepoints" / "demo")), tmp_path / "logs")
    wait_for_commit(run, checkpoint, timeout=240)
    return str(jobs), run


def test_retain_on_cancellation_keeps_and_registers_the_checkpoint(tmp_path):
    jobs, run = start_demo(tmp_path, "RETAIN_ON_CANCELLATION")
    outcome = CancelJobOperator(task_id="cancel", job="demo", jobs_file=jobs, grace=30).execute({})
    assert not process_alive(run.pid)
    assert outcome["action"] == "retained" and (tmp_path / "checkpoint" / "metadata").exists()
    retained = list_savepoints(Store(str(tmp_path / "savepoints")), "demo")
    assert [s.type.value for s in retained] == ["retained_checkpoint"]
    assert outcome["retained_savepoint"]["pointer"] == retained[0].pointer
    result = restore_savepoint(retained[0].pointer, str(tmp_path / "restored"))
    assert result.batch_id == retained[0].batch_id


def test_never_retain_deletes_only_the_live_checkpoint(tmp_path):
    jobs, run = start_demo(tmp_path, "RETAIN_ON_CANCELLATION")
    (tmp_path / "neighbour.txt").write_text("not the checkpoint")
    ignored = ("checkpoint/", "output/", "logs/", "savepoints/demo/_run.json")  # the run record says it was cancelled
    before = {k: v for k, v in tree_snapshot(tmp_path).items() if not k.startswith(ignored)}
    outcome = CancelJobOperator(task_id="cancel", job="demo", jobs_file=jobs, policy="NEVER_RETAIN_AFTER_TERMINATION",
                                grace=30).execute({})
    assert outcome["action"] == "deleted" and not (tmp_path / "checkpoint").exists()
    after = {k: v for k, v in tree_snapshot(tmp_path).items() if not k.startswith(ignored)}
    assert after == before  # savepoints, inputs and the neighbour are untouched
    assert list_savepoints(Store(str(tmp_path / "savepoints")), "demo") == []
    recorded = read_run(Store(str(tmp_path / "savepoints" / "demo")))
    assert recorded.pid == run.pid and recorded.ended == "cancelled" and recorded.termination["action"] == "deleted"


def test_policy_table_and_guards(tmp_path):
    policy = CheckpointRetentionPolicy
    assert [p.retains("cancelled") for p in policy] == [True, False, False]
    assert [p.retains("failed") for p in policy] == [True, True, False]
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(b"\xff")
    with pytest.raises(NotACheckpointError):
        apply_checkpoint_retention(str(photos), "j", "NEVER_RETAIN_AFTER_TERMINATION", "cancelled",
                                   savepoint_dir=str(tmp_path / "sp"))
    with pytest.raises(InvalidInputError, match="unknown checkpoint retention policy"):
        apply_checkpoint_retention(str(photos), "j", "KEEP_FOREVER", "cancelled", savepoint_dir=str(tmp_path / "sp"))
    with pytest.raises(InvalidInputError, match="overlap"):
        apply_checkpoint_retention(str(photos), "j", "NEVER_RETAIN_AFTER_TERMINATION", "cancelled",
                                   savepoint_dir=str(photos / "sp"))
    assert (photos / "cat.jpg").read_bytes() == b"\xff"
