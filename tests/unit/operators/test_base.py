"""SavepointsBaseOperator / SavepointsBaseSensor: templated connection id and savepoint directory, a hook
built once after rendering, the deferrable default from ``[operators] default_deferrable``."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
from datetime import timedelta
from importlib import import_module

import pytest
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_savepoints.core import take_savepoint
from airflow_savepoints.get_provider_info import get_provider_info
from airflow_savepoints.operators.base import BASE_TEMPLATE_FIELDS, SavepointsBaseOperator, SavepointsBaseSensor
from airflow_savepoints.operators.job import CheckJobOperator
from airflow_savepoints.operators.retention import ApplyRetentionOperator
from airflow_savepoints.sensors.savepoint import BatchCommittedSensor, SavepointCompletedSensor
from airflow_savepoints.triggers.savepoint import BatchCommittedTrigger, SavepointCompletedTrigger
from tests.conftest import ROOT
from tests.support.connections import stored_connection
from tests.support.synthetic import write_checkpoint


def provided_classes(kind: str) -> list[type[BaseOperator]]:
    """The public operator (or sensor) classes of the modules the provider lists under ``kind``."""
    modules = [import_module(m) for entry in get_provider_info()[kind] for m in entry["python-modules"]]
    return [obj for module in modules for name, obj in vars(module).items()
            if inspect.isclass(obj) and issubclass(obj, BaseOperator) and obj.__module__ == module.__name__
            and not name.startswith("_")]


def test_every_operator_and_sensor_is_built_on_the_base_with_its_templated_fields():
    operators, sensors = provided_classes("operators"), provided_classes("sensors")
    assert len(operators) >= 7 and len(sensors) == 2
    for cls in operators + sensors:
        assert issubclass(cls, SavepointsBaseOperator), cls
        assert len(set(cls.template_fields)) == len(cls.template_fields), cls
        assert set(BASE_TEMPLATE_FIELDS) <= set(cls.template_fields), cls
    assert all(issubclass(cls, SavepointsBaseSensor) for cls in sensors)


def test_templates_render_then_the_hook_is_built_once_from_the_rendered_connection(airflow_db, monkeypatch, tmp_path):
    conn_id = stored_connection(monkeypatch, host=str(tmp_path / "from-connection"))
    operator = ApplyRetentionOperator(task_id="r", job="{{ params.job }}", savepoints_conn_id="{{ params.conn }}",
                                      savepoint_dir="{{ params.root }}/savepoints", dry_run="{{ params.dry }}")
    assert "hook" not in vars(operator)  # nothing touches a connection before execute
    operator.render_template_fields({"params": {"job": "orders", "conn": conn_id, "root": str(tmp_path), "dry": True}})
    assert (operator.job, operator.savepoints_conn_id, operator.savepoint_dir, operator.dry_run) == (
        "orders", conn_id, f"{tmp_path}/savepoints", "True")
    hook = operator.hook
    assert operator.hook is hook and hook.savepoints_conn_id == conn_id
    assert operator.savepoint_store().url == f"{tmp_path}/savepoints"
    operator.savepoint_dir = None
    assert operator.savepoint_store().url == str(tmp_path / "from-connection")
    assert operator.savepoint_store(str(tmp_path / "job-default")).url == str(tmp_path / "job-default")
    summary = operator.execute({})
    assert summary["kept"] == [] and summary["disposed"] == []


def test_a_job_operators_savepoint_dir_wins_over_the_jobs_own(tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SAVEPOINTS_DEFAULT", raising=False)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - {{name: orders, application: /app.py, checkpoint: {tmp_path}/ck, "
                    f"savepoint_dir: {tmp_path}/from-job}}\n")
    assert CheckJobOperator(task_id="c", job="orders", jobs_file=str(jobs)).job_context().root.url == (
        f"{tmp_path}/from-job")
    given = CheckJobOperator(task_id="c", job="orders", jobs_file=str(jobs), savepoint_dir=str(tmp_path / "given"))
    assert given.job_context().root.url == str(tmp_path / "given")
    assert given.checkpoint_hook is None


DEFERRABLE_DEFAULTS = """
import json
from airflow_savepoints.sensors.savepoint import BatchCommittedSensor, SavepointCompletedSensor
print(json.dumps([BatchCommittedSensor(task_id="b", job="j").deferrable,
                  SavepointCompletedSensor(task_id="s", pointer="/p").deferrable,
                  SavepointCompletedSensor(task_id="e", pointer="/p", deferrable=False).deferrable]))
"""


def test_deferrable_defaults_to_the_operators_default_deferrable_option():
    """Read when the module is imported, as in every provider: a fresh interpreter with the option set."""
    assert "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE" not in os.environ
    assert [BatchCommittedSensor(task_id="b", job="j").deferrable,
            SavepointCompletedSensor(task_id="s", pointer="/p").deferrable] == [False, False]
    env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "true",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", DEFERRABLE_DEFAULTS], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True, False]


def test_deferrable_sensors_defer_with_a_trigger_naming_the_connection(airflow_db, monkeypatch, tmp_path):
    """Each sensor defers to its trigger; the event that trigger fires, fed to ``execute_complete``, is the result."""
    conn_id = stored_connection(monkeypatch, host=str(tmp_path / "sp"))
    checkpoint = write_checkpoint(tmp_path / "ck")
    info = take_savepoint(str(checkpoint), "orders", savepoint_dir=str(tmp_path / "sp"))
    waits = [SavepointCompletedSensor(task_id="s", pointer=info.pointer,
                                      savepoints_conn_id=conn_id, deferrable=True, timeout=60, poke_interval=5),
             BatchCommittedSensor(task_id="b", job="orders", checkpoint=str(checkpoint), after_batch=1,
                                  savepoints_conn_id=conn_id, deferrable=True, timeout=60, poke_interval=5)]
    results = []
    for sensor, trigger_class in zip(waits, (SavepointCompletedTrigger, BatchCommittedTrigger), strict=True):
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute({})
        assert type(deferred.value.trigger) is trigger_class
        assert (deferred.value.method_name, deferred.value.timeout) == ("execute_complete", timedelta(seconds=60))
        kwargs = deferred.value.trigger.serialize()[1]
        assert kwargs["savepoints_conn_id"] == conn_id and kwargs["poll_interval"] == 5
        event = asyncio.run(asyncio.wait_for(anext(deferred.value.trigger.run()), 60))  # the trigger's own event
        assert event.payload["status"] == "success", event.payload
        results.append(sensor.execute_complete({}, event.payload))
        with pytest.raises(AirflowFailException, match="timed out waiting"):
            sensor.execute_complete({}, {"status": "error", "message": "timed out waiting for it"})
    assert results[0]["pointer"] == info.pointer and results[0]["batch_id"] == info.manifest.batch_id, results[0]
    assert results[1]["batch_id"] == info.manifest.batch_id > 1, results[1]  # the checkpoint's newest committed batch
    assert waits[1].poke({}).xcom_value == results[1]  # the same wait without deferring


def test_a_count_rendered_from_a_param():
    from airflow_savepoints.errors import InvalidInputError
    from airflow_savepoints.operators.base import rendered_count

    assert [rendered_count(v, "n") for v in (None, "", "None", " 5 ", 3)] == [None, None, None, 5, 3]
    with pytest.raises(InvalidInputError, match="invalid n"):
        rendered_count("five", "n")
