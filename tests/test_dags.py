"""The example DAGs on a real Airflow 3.3 (SQLite metadata database), run with dag.test()."""

from __future__ import annotations

import shutil
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import ROOT, dag_bag_of_own_bundle

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
    from airflow.models.asset import AssetEvent, AssetModel
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
    assert len(saved) == 1 and saved[0].type.value == "periodic" and saved[0].batch_id == 5
    with create_session() as session:
        pushed = session.query(XComModel).filter_by(dag_id="periodic_savepoints", run_id=run.run_id,
                                                    task_id="savepoint_demo_dedup", key="return_value").one()
        events = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                  .filter(AssetModel.uri == "x-savepoints://demo-dedup").all())  # other tests' events aside
    value = XComModel.deserialize_value(pushed)
    assert value["pointer"] == saved[0].pointer and value["request_id"].startswith("periodic_savepoints/")
    assert [e.extra.get("pointer") for e in events] == [saved[0].pointer]


def test_savepoint_retention_dag_plans_in_a_dry_run_then_leaves_the_policys_set(airflow_db, stopped_checkpoint,
                                                                                 tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.sdk import DagRunState
    from airflow.utils.session import create_session

    from airflow_savepoints.core import take_savepoint
    from tests.conftest import tree_snapshot

    shutil.copytree(stopped_checkpoint, tmp_path / "checkpoint")
    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", str(tmp_path))
    root = tmp_path / "savepoints"
    kinds = ["periodic", "periodic", "manual", "periodic", "periodic", "periodic"]
    taken = [(k, take_savepoint(str(tmp_path / "checkpoint"), "demo-dedup", savepoint_dir=str(root),
                                savepoint_type=k).manifest.savepoint_id) for k in kinds]
    orphan = root / "demo-dedup" / "savepoint-crashd-0123456789ab"
    orphan.mkdir()
    (orphan / "offsets").write_text("partial")

    def run(**conf):
        dag = DagBag(dag_folder=str(ROOT / "dags" / "savepoint_retention.py")).get_dag("savepoint_retention")
        result = dag.test(run_conf=conf)
        assert result.state == DagRunState.SUCCESS, {t.task_id: t.state for t in result.get_task_instances()}
        with create_session() as session:
            pushed = session.query(XComModel).filter_by(dag_id="savepoint_retention", run_id=result.run_id).one()
        return XComModel.deserialize_value(pushed)

    before = tree_snapshot(root)
    plan = run(dry_run=True, orphan_timeout="0s")
    assert tree_snapshot(root) == before
    periodic = [sid for kind, sid in taken if kind == "periodic"]
    assert [d["savepoint_id"] for d in plan["decisions"] if d["action"] == "dispose"] == periodic[:2]
    assert [d["savepoint_id"] for d in plan["decisions"] if d["action"] == "remove_orphan"] == [orphan.name]

    report = run(dry_run=False, orphan_timeout="0s")  # jobs.yaml: max_periodic 3
    assert sorted(report["disposed"]) == sorted(periodic[:2]) and report["removed_orphans"] == [orphan.name]
    left = sorted(p.parent.name for p in (root / "demo-dedup").glob("savepoint-*/_metadata"))
    assert left == sorted(periodic[2:] + [taken[2][1]])
    assert sorted(p.name for p in (root / "demo-dedup").glob("savepoint-*")) == left


def test_start_savepoint_stop_and_restore_a_real_job_through_the_dags(airflow_db, tmp_path, monkeypatch):
    """restore_from_savepoint (fresh start) -> periodic_savepoints -> stop_job_with_savepoint ->
    restore_from_savepoint (latest): the job resumes right after the stop savepoint, and every event
    reaches the file sink exactly once."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import DagRunState

    import airflow_savepoints.demo.app as demo
    from airflow_savepoints.core import list_savepoints
    from airflow_savepoints.jobs.description.record import read_run
    from airflow_savepoints.jobs.workflows.lifecycle import job_status
    from airflow_savepoints.jobs.workflows.run import stop_process
    from airflow_savepoints.storage import Store

    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", str(tmp_path))
    monkeypatch.setenv("SAVEPOINTS_DEMO_APP", demo.__file__)
    sent: set[int] = set()
    for index in range(3):
        sent.update(demo.write_events(tmp_path / "input", index))
    job_folder = Store(str(tmp_path / "savepoints" / "demo-dedup"))

    def run(dag_id: str, **conf):
        dag = DagBag(dag_folder=str(ROOT / "dags" / f"{dag_id}.py")).get_dag(dag_id)  # freshly parsed
        result = dag.test(run_conf=conf or None)
        assert result.state == DagRunState.SUCCESS, (dag_id, {t.task_id: t.state for t in result.get_task_instances()})

    try:
        run("restore_from_savepoint", job="demo-dedup", fresh_start=True)
        first_run = read_run(job_folder)
        assert first_run.checkpoint == str(tmp_path / "checkpoint")
        for index in range(3, 6):
            sent.update(demo.write_events(tmp_path / "input", index))
        for _ in range(4):  # retention in the DAG keeps jobs.yaml's max_periodic: 3
            run("periodic_savepoints")
        assert [s.type.value for s in list_savepoints(Store(str(tmp_path / "savepoints")), "demo-dedup")] == ["periodic"] * 3
        run("stop_job_with_savepoint", job="demo-dedup")
        run("savepoint_retention")  # the job is stopped now: the same policy, nothing more to remove
        saved = list_savepoints(Store(str(tmp_path / "savepoints")), "demo-dedup")
        assert [s.type.value for s in saved] == ["periodic"] * 3 + ["stop"]
        assert sorted(p.name for p in Path(job_folder.url).glob("savepoint-*")) == sorted(s.savepoint_id for s in saved)
        stop_batch = saved[-1].batch_id
        # the driver (run_until_stopped) told its Spark version: periodic and stop manifests record it
        assert {s.spark_version for s in saved} == {version("pyspark")}, [(s.savepoint_id, s.spark_version) for s in saved]
        for index in range(6, 9):
            sent.update(demo.write_events(tmp_path / "input", index))
        run("restore_from_savepoint", job="demo-dedup")
        second_run = read_run(job_folder)
        assert second_run.checkpoint.startswith(str(tmp_path / "checkpoint-"))
        commits = sorted(int(p.name) for p in Path(second_run.checkpoint, "commits").iterdir() if p.name.isdigit())
        assert commits[:2] == [stop_batch, stop_batch + 1]  # the savepoint's batch, then the next one
        deadline = time.monotonic() + 180
        while demo.committed_event_ids(tmp_path / "output") != sorted(sent) and time.monotonic() < deadline:
            time.sleep(0.5)
        run("stop_job_with_savepoint", job="demo-dedup")  # the demo's end: a user's stop, not a kill
        assert job_status("demo-dedup", job_folder).state == "stopped"
        last_saved = list_savepoints(Store(str(tmp_path / "savepoints")), "demo-dedup")[-1]
        assert (last_saved.type.value, last_saved.batch_id > stop_batch) == ("stop", True)
    finally:
        last = read_run(job_folder)
        if last is not None and last.ended is None:
            stop_process(last, grace=30)
    # every event exactly once in what the sink committed (files of a killed batch are not committed)
    assert demo.committed_event_ids(tmp_path / "output") == sorted(sent)



ANNOUNCING_DAG = """
import os
import pendulum
from airflow.sdk import DAG
from airflow_savepoints.operators.job import CancelJobOperator
from airflow_savepoints.operators.savepoint import TriggerSavepointOperator

with DAG("announce_savepoints", schedule=None, start_date=pendulum.datetime(2026, 1, 1),
         params={"job": os.environ["ANNOUNCE_TEST_JOB"]}):
    TriggerSavepointOperator(task_id="savepoint", job="{{ params.job }}",
                             checkpoint=os.environ["ANNOUNCE_TEST_CHECKPOINT"],
                             savepoint_dir=os.environ["ANNOUNCE_TEST_SAVEPOINTS"]) >> CancelJobOperator(
        task_id="cancel", job="{{ params.job }}", jobs_file=os.environ["ANNOUNCE_TEST_JOBS"])
"""


def test_a_templated_job_and_a_cancel_that_retains_its_checkpoint_announce_their_savepoints(
        airflow_db, stopped_checkpoint, tmp_path, monkeypatch):
    """A job named by a template (announced through the ``savepoints`` asset alias) and a cancel whose
    retention policy keeps the checkpoint: each savepoint is an event of x-savepoints://<job> with its
    summary; the tasks link to the job's savepoints on the plugin's page."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.xcom import XComModel
    from airflow.sdk import DagRunState
    from airflow.utils.session import create_session

    from airflow_savepoints.core import list_savepoints
    from airflow_savepoints.operators.links import savepoints_page_url
    from airflow_savepoints.storage import Store

    job = "orders-templated"
    shutil.copytree(stopped_checkpoint, tmp_path / "checkpoint")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - name: {job}\n    application: /app.py\n    checkpoint: {tmp_path}/checkpoint\n"
                    f"    savepoint_dir: {tmp_path}/savepoints\n    checkpoint_retention: RETAIN_ON_CANCELLATION\n")
    monkeypatch.setenv("ANNOUNCE_TEST_JOB", job)
    monkeypatch.setenv("ANNOUNCE_TEST_CHECKPOINT", str(tmp_path / "checkpoint"))
    monkeypatch.setenv("ANNOUNCE_TEST_SAVEPOINTS", str(tmp_path / "savepoints"))
    monkeypatch.setenv("ANNOUNCE_TEST_JOBS", str(jobs))
    bag = dag_bag_of_own_bundle(monkeypatch, tmp_path / "dags", "announce-test", {"announce_savepoints.py": ANNOUNCING_DAG})
    run = bag.get_dag("announce_savepoints").test()
    assert run.state == DagRunState.SUCCESS, {ti.task_id: ti.state for ti in run.get_task_instances()}

    saved = {s.type.value: s.pointer for s in list_savepoints(Store(str(tmp_path / "savepoints")), job)}
    assert set(saved) == {"periodic", "retained_checkpoint"}
    with create_session() as session:
        events = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                  .filter(AssetModel.uri == f"x-savepoints://{job}").order_by(AssetEvent.id).all())
        extras = [(e.extra.get("type"), e.extra.get("pointer")) for e in events]
        links = {x.task_id: XComModel.deserialize_value(x) for x in session.query(XComModel).filter_by(
            dag_id="announce_savepoints", run_id=run.run_id, key="_link_SavepointsPageLink")}
    assert extras == [("periodic", saved["periodic"]), ("retained_checkpoint", saved["retained_checkpoint"])]
    assert links == {"savepoint": savepoints_page_url(job), "cancel": savepoints_page_url(job)}
    assert savepoints_page_url(job).endswith(f"/savepoints/ui?job={job}")


def test_demo_console_serves_the_demo_and_stops_on_ctrl_c(stopped_checkpoint, tmp_path):
    """`airflow-savepoints demo --console` on a demo's folder: an API server with the plugin on its
    savepoints, the example DAGs unpaused, a login printed; SIGINT stops it and its workers."""
    import os
    import signal
    import subprocess
    import sys

    import httpx
    import psutil

    from airflow_savepoints.core import take_savepoint
    from airflow_savepoints.demo import install_example_dags
    from tests.support.airflow_cluster import free_port

    workdir = tmp_path / "demo-run"
    install_example_dags(workdir / "dags")
    taken = take_savepoint(str(stopped_checkpoint), "demo-dedup", savepoint_dir=str(workdir / "savepoints"),
                           savepoint_type="stop").manifest.savepoint_id
    port = free_port()
    cli = subprocess.Popen([sys.executable, "-m", "airflow_savepoints.cli.main", "demo", "--console", "--workdir",
                            str(workdir), "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    lines: list[str] = []
    try:
        for line in cli.stdout:
            lines.append(line)
            if line.startswith("log in as admin / "):
                password = line.split(" / ")[1].split(";")[0]
                break
        else:
            raise AssertionError("".join(lines))
        url = f"http://127.0.0.1:{port}"
        assert f"{url}/plugin/savepoints" in lines[-2]
        token = httpx.post(f"{url}/auth/token", json={"username": "admin", "password": password}).json()["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        jobs = httpx.get(f"{url}/savepoints/api/overview", headers=headers, timeout=30).json()["jobs"]
        assert [(j["job"], j["newest"]["savepoint_id"]) for j in jobs] == [("demo-dedup", taken)]
        dags = httpx.get(f"{url}/api/v2/dags", headers=headers, params={"limit": 100}, timeout=30).json()["dags"]
        assert len(dags) >= 5 and not [d["dag_id"] for d in dags if d["is_paused"]], dags
        server = psutil.Process(cli.pid).children(recursive=True)
        listening = [c.laddr.port for p in server for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert port in listening, [p.cmdline() for p in server]  # the API server is a child of the command
        cli.send_signal(signal.SIGINT)  # Ctrl-C
        assert cli.wait(60) == 0, cli.stdout.read()
        assert "stopping the console" in cli.stdout.read()
        assert not [p for p in server if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, timeout=5)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
