"""The job's version in the manifests of periodic and retained-checkpoint savepoints, and in ``list``."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core import list_savepoints, take_savepoint
from airflow_savepoints.core.manifest import read_manifest
from airflow_savepoints.core.termination import apply_checkpoint_retention
from airflow_savepoints.errors import NotLiveCheckpointError
from airflow_savepoints.jobs.description.model import JobVersion
from airflow_savepoints.jobs.description.record import JobRun, write_run
from airflow_savepoints.operators.savepoint import TriggerSavepointOperator
from airflow_savepoints.storage import Store
from tests.support.synthetic import write_checkpoint

VERSION = JobVersion(application="/apps/orders-v2.py", application_args=["--fast"],
                     spark_conf={"spark.sql.shuffle.partitions": "4"}).model_dump()


def record_run(root: Store, checkpoint: str) -> None:
    write_run(root.child("orders"), JobRun(job="orders", checkpoint=checkpoint, started_at=datetime.now(UTC),
                                           version=VERSION))


def test_a_periodic_savepoint_records_the_version_of_the_run_writing_its_checkpoint(tmp_path):
    checkpoint = str(write_checkpoint(tmp_path / "ckpt"))
    root = Store(str(tmp_path / "sp"))
    root.makedirs("orders")
    record_run(root, checkpoint + "/")
    trigger = TriggerSavepointOperator(task_id="sp", job="orders", savepoint_dir=root.url)
    summary = trigger.execute({})
    assert summary["job_version_hash"] == VERSION["hash"] and len(VERSION["hash"]) == 12
    assert read_manifest(Store(summary["pointer"])).job_version == VERSION

    record_run(root, str(tmp_path / "another-checkpoint"))  # the recorded run writes elsewhere: refused, no copy
    taken = sorted(p for p in root.child("orders").list_files() if p.endswith("_metadata"))
    with pytest.raises(NotLiveCheckpointError, match="another-checkpoint"):
        TriggerSavepointOperator(task_id="sp2", job="orders", savepoint_dir=root.url, checkpoint=checkpoint).execute({})
    assert sorted(p for p in root.child("orders").list_files() if p.endswith("_metadata")) == taken
    other = TriggerSavepointOperator(task_id="sp3", job="orders", savepoint_dir=root.url, checkpoint=checkpoint,
                                     retired_checkpoint=True)  # asked for on purpose: taken, with no version
    summary = other.execute({})
    manifest = read_manifest(Store(summary["pointer"]))
    assert summary["job_version_hash"] is None and manifest.job_version is None and manifest.retired_checkpoint


def test_a_retained_checkpoint_savepoint_records_the_version(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    outcome = apply_checkpoint_retention(str(checkpoint), "orders", "RETAIN_ON_FAILURE", "failed",
                                         savepoint_dir=str(tmp_path / "sp"), job_version=VERSION)
    retained = outcome["retained_savepoint"]
    assert retained["type"] == "retained_checkpoint" and retained["job_version_hash"] == VERSION["hash"]
    assert read_manifest(Store(retained["pointer"])).job_version == VERSION


def header(table: str) -> str:
    return next(line for line in table.splitlines() if " type " in line and " state " in line)


def test_list_shows_a_version_column_only_when_a_savepoint_has_a_version(tmp_path):
    checkpoint = str(write_checkpoint(tmp_path / "ckpt"))
    sp = str(tmp_path / "sp")
    take_savepoint(checkpoint, "orders", savepoint_dir=sp)
    runner = CliRunner()
    plain = runner.invoke(app, ["list", "--job", "orders", "--dir", sp], env={"COLUMNS": "250"})
    assert plain.exit_code == 0 and " state " in header(plain.stdout) and "version" not in header(plain.stdout)

    take_savepoint(checkpoint, "orders", savepoint_dir=sp, job_version=VERSION)
    table = runner.invoke(app, ["list", "--job", "orders", "--dir", sp], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and " version" in header(table.stdout) and VERSION["hash"] in table.stdout
    listed = json.loads(runner.invoke(app, ["list", "--job", "orders", "--dir", sp, "--json"]).stdout)
    assert [s["job_version_hash"] for s in listed["savepoints"]] == [None, VERSION["hash"]]
    assert {"pointer", "savepoint_id", "batch_id", "type", "state", "spark_version"} <= set(listed["savepoints"][0])
    assert [r.job_version_hash for r in list_savepoints(Store(sp), "orders")] == [None, VERSION["hash"]]
