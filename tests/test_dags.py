"""The example DAGs on a real Airflow 3.3 (SQLite metadata database), run with dag.test()."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def dag_files() -> list[Path]:
    return sorted(p for p in (ROOT / "dags").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("path", dag_files(), ids=lambda p: p.name)
def test_every_dag_file_imports_without_errors(path):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(path))
    assert bag.import_errors == {}
    assert bag.dag_ids


def test_periodic_savepoints_dag_takes_a_savepoint_and_emits_an_asset_event(airflow_db, stopped_checkpoint,
                                                                           tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetEvent
    from airflow.models.xcom import XComModel
    from airflow.sdk import DagRunState
    from airflow.utils.session import create_session

    from airflow_savepoints.core import list_savepoints
    from airflow_savepoints.storage import Store

    shutil.copytree(stopped_checkpoint, tmp_path / "checkpoint")
    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", str(tmp_path))
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    run = bag.get_dag("periodic_savepoints").test()
    assert run.state == DagRunState.SUCCESS, {ti.task_id: ti.state for ti in run.get_task_instances()}

    saved = list_savepoints(Store(str(tmp_path / "savepoints")), "demo-dedup")
    assert len(saved) == 1 and saved[0].manifest.type.value == "periodic" and saved[0].manifest.batch_id == 5
    with create_session() as session:
        pushed = session.query(XComModel).filter_by(dag_id="periodic_savepoints", run_id=run.run_id).one()
        events = session.query(AssetEvent).all()
    value = XComModel.deserialize_value(pushed)
    assert value["pointer"] == saved[0].pointer and value["request_id"].startswith("periodic_savepoints/")
    assert [e.extra.get("pointer") for e in events] == [saved[0].pointer]
