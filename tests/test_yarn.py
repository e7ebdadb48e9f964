"""Jobs on a real YARN: a ResourceManager and a NodeManager (Hadoop 3.5.0's jars, tests/support/yarn.py) over
the session's HDFS, the demo job submitted with ``master: yarn`` in client deploy mode (the driver here, its
ApplicationMaster and executor in YARN containers), its checkpoint, savepoints and control folder on HDFS.

* Through a Spark connection (host ``yarn``): started by RestoreJobOperator, restarted by ``job start``, both
  with the Spark provider's SparkSubmitHook; ``job status`` names the YARN
  application and says what the ResourceManager says of it; ``job savepoint`` savepoints the live
  checkpoint on HDFS; ``job stop`` stops it between batches with a savepoint (the application ends
  FINISHED); ``job start`` restarts it from that savepoint; a kill of an application named otherwise
  is refused; ``job cancel`` that the run does not answer in time kills it through the ResourceManager
  (KILLED). The sink holds every event once.
* Cluster deploy mode (the driver in the ApplicationMaster's container): started with ``job start``; its node
  lost (the NodeManager and every container SIGKILLed): ``job status`` says failed with YARN's diagnostics;
  a NodeManager back, the watchdog restarts it from its last state; stopped with a savepoint; the sink holds
  every event once.
* A queue the capacity scheduler cannot take is refused at ``job start`` (yarn_queue_unusable).
* Without a yarn-site.xml in YARN_CONF_DIR or HADOOP_CONF_DIR, ``job start`` of a ``master: yarn`` job
  answers yarn_not_configured and starts nothing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import airflow_savepoints.demo.app as demo
from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.jobs.description.record import RunTarget, read_run
from airflow_savepoints.jobs.launch.launcher import spark_submit_command
from airflow_savepoints.jobs.launch.runners import YarnRunner
from airflow_savepoints.jobs.workflows import watchdog
from airflow_savepoints.jobs.workflows.lifecycle import job_status
from airflow_savepoints.jobs.workflows.run import JobContext, stop_process
from airflow_savepoints.operators.job import RestoreJobOperator
from airflow_savepoints.storage import Store
from tests.test_job_control import wait_past as wait_past_in

pytestmark = pytest.mark.yarn

APP_NAME = "airflow-savepoints-demo"  # the demo sets its own (SparkSession.builder.appName): the RM lists it so


def write_yarn_jobs(tmp_path: Path, root: str, deploy_mode: str = "client", queue: str | None = "default",
                    spark_conn_id: str | None = None) -> str:
    """The demo job on YARN: input and output on this machine's disk (file://, the executor runs here),
    checkpoint and savepoints on HDFS; small containers (AM 256 MB, one executor of 512 MB, 1 core);
    Spark's jars from pyspark's folder on the node (``local:``, nothing uploaded), the venv's python.
    ``spark_conn_id``: master (and queue) from that Spark connection, jobs.yaml names no master."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    jobs = tmp_path / "jobs.yaml"
    # client mode: the ApplicationMaster only asks for executors (256 MB); cluster mode: it runs the driver (512 MB)
    memory = {"spark.yarn.am.memory": "256m"} if deploy_mode == "client" else {"spark.driver.memory": "512m"}
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
            **({"spark.yarn.queue": queue} if queue else {}), **memory, "spark.executor.memory": "512m",
            "spark.executor.instances": "1", "spark.executor.cores": "1", "spark.yarn.jars": f"local:{jars}/*",
            "spark.yarn.appMasterEnv.PYSPARK_PYTHON": sys.executable,
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable}
    jobs.write_text(
        "jobs:\n  - name: demo\n"
        f"    application: {demo.__file__}\n"
        f"    application_args: ['file://{tmp_path}/input', '{{checkpoint}}', 'file://{tmp_path}/output']\n"
        + (f"    spark_conn_id: {spark_conn_id}\n" if spark_conn_id else "    master: yarn\n")
        + f"    deploy_mode: {deploy_mode}\n"
        # client mode: the driver's SparkContext registers the application, named as the demo names it; cluster
        # mode: spark-submit does, before the driver runs, with --name (the job's name)
        + (f"    app_name: {APP_NAME}\n" if deploy_mode == "client" else "") +
        f"    spark_conf: {json.dumps(conf)}\n"
        f"    checkpoint: {root}/checkpoint\n"
        f"    savepoint_dir: {root}/savepoints\n"
        "    restart: {enabled: true, max_restarts: 2, backoff: 0, last_state: true}\n")
    return str(jobs)


def cli(*args: str) -> dict:
    """The command's JSON answer: stdout holds it alone (a start through a Spark connection too, whose
    provider hook logs its ``Spark-Submit cmd:`` line: that goes to stderr)."""
    result = CliRunner().invoke(cli_app, [*args, "--json"])
    assert result.exit_code == 0, result.output[-4000:]
    return json.loads(result.stdout)


def wait_past(checkpoint: str, batch: int, timeout: float = 180) -> int:
    """test_job_control's wait, with the longer timeout a YARN container's start needs."""
    return wait_past_in(checkpoint, batch, timeout)


def wait_for_app(job_folder: Store, not_this: str | None = None, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app_id = job_status("demo", job_folder).application_id
        if app_id and app_id != not_this:
            return app_id
        time.sleep(0.5)
    raise TimeoutError(f"no application id in {job_folder.url} within {timeout}s")


def wait_for_state(yarn, app_id: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while (app := yarn.app(app_id))["state"] not in states and time.monotonic() < deadline:
        time.sleep(0.5)
    return app


@pytest.mark.slow
def test_a_job_on_yarn_is_started_savepointed_stopped_restarted_and_cancelled_through_the_resourcemanager(
        yarn_cluster, hdfs_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HADOOP_CONF_DIR", str(yarn_cluster.conf_dir))
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    # the Spark provider's connection names the master (host yarn) and the queue; jobs.yaml names neither
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn",
                                                              "extra": {"queue": "default"}}))
    print(f"YARN test bed (ResourceManager and NodeManager) up in {yarn_cluster.started_in:.1f}s")
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    jobs = write_yarn_jobs(tmp_path, hdfs_root, queue=None, spark_conn_id="spark_yarn")
    job_folder = Store(f"{hdfs_root}/savepoints/demo")
    timings: dict[str, float] = {}
    try:
        began = time.monotonic()
        started = RestoreJobOperator(task_id="start", job="demo", jobs_file=jobs, fresh_start=True,
                                     wait_timeout=300).execute({})
        timings["start"] = time.monotonic() - began
        print(f"started on YARN in {timings['start']:.1f}s")
        app_id = wait_for_app(job_folder)
        assert app_id.startswith("application_"), app_id
        app = yarn_cluster.app(app_id)
        assert (app["state"], app["name"], app["queue"]) == ("RUNNING", APP_NAME, "root.default"), app
        status = cli("job", "status", "demo", "--jobs-file", jobs)
        assert status["state"] == "running" and status["application_id"] == app_id, status
        assert status["runner"] == "yarn" and f"application {app_id} is RUNNING" in status["detail"], status

        for index in range(2, 4):
            sent.update(demo.write_events(tmp_path / "input", index))
        wait_past(started["checkpoint"], started["first_batch"])
        savepoint = cli("job", "savepoint", "demo", "--jobs-file", jobs)
        assert savepoint["batch_id"] >= started["first_batch"] and savepoint["type"] == "manual", savepoint
        assert savepoint["pointer"].startswith(f"{hdfs_root}/savepoints/demo/"), savepoint

        began = time.monotonic()
        stopped = cli("job", "stop", "demo", "--jobs-file", jobs)
        timings["stop"] = time.monotonic() - began
        assert stopped["stop_method"] == "cooperative" and stopped["consistency"] == "clean", stopped
        assert wait_for_state(yarn_cluster, app_id, ("FINISHED", "FAILED", "KILLED"))["state"] == "FINISHED"

        for index in range(4, 6):
            sent.update(demo.write_events(tmp_path / "input", index))
        began = time.monotonic()
        restarted = cli("job", "start", "demo", "--jobs-file", jobs, "--wait-timeout", "300")
        timings["restart"] = time.monotonic() - began
        assert restarted["restored"]["batch_id"] == stopped["batch_id"], restarted
        command = read_run(job_folder).command  # the Spark provider's, from the connection
        assert command[command.index("--master") + 1] == "yarn" and command[command.index("--queue") + 1] == "default"
        new_app = wait_for_app(job_folder, not_this=app_id)
        assert (yarn_cluster.app(new_app)["state"], yarn_cluster.app(new_app)["queue"]) == ("RUNNING", "root.default")
        status = cli("job", "status", "demo", "--jobs-file", jobs)
        assert status["application_id"] == new_app and status["runner"] == "yarn", status
        wait_past(restarted["checkpoint"], stopped["batch_id"])

        # an application id that is not the job's (run files forged or stale) is never killed
        refused = YarnRunner().kill(RunTarget(job="other", application_id=new_app, master="yarn"), grace=5)
        assert refused["killed"] is False and "is not job 'other''s" in refused["detail"], refused
        assert yarn_cluster.app(new_app)["state"] == "RUNNING"

        for index in range(6, 8):
            sent.update(demo.write_events(tmp_path / "input", index))
        wait_committed(tmp_path / "output", sent)  # every input file's batch committed before the cancel
        began = time.monotonic()
        cancelled = cli("job", "cancel", "demo", "--jobs-file", jobs, "--grace", "0")
        timings["cancel"] = time.monotonic() - began
        assert cancelled["stop_method"] == "yarn", cancelled
        killed = wait_for_state(yarn_cluster, new_app, ("FINISHED", "FAILED", "KILLED"))
        assert killed["state"] == "KILLED", killed
        after = cli("job", "status", "demo", "--jobs-file", jobs)
        assert after["state"] not in ("running", "starting", "stopping"), after
    finally:
        last = read_run(job_folder)
        if last is not None:
            stop_process(last, grace=15)
        for app in yarn_cluster.apps(states="RUNNING,ACCEPTED"):
            if app["name"] == APP_NAME:  # this test's, left running by a failure
                YarnRunner().kill(RunTarget(job="demo", app_name=APP_NAME, application_id=app["id"], master="yarn",
                                            master_ui=yarn_cluster.url), grace=10)
    # every event once: de-duplicated across the stop, the restart and the cancel
    assert demo.committed_event_ids(tmp_path / "output") == sorted(sent)
    print("YARN client mode: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


def wait_for_status(jobs: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while (status := cli("job", "status", "demo", "--jobs-file", jobs))["state"] not in states \
            and time.monotonic() < deadline:
        time.sleep(1)
    return status


def wait_committed(output: Path, sent: set[int], timeout: float = 120) -> None:
    """Until the file sink holds every event sent (each input file's batch committed)."""
    deadline = time.monotonic() + timeout
    while demo.committed_event_ids(output) != sorted(sent) and time.monotonic() < deadline:
        time.sleep(1)


@pytest.mark.slow
def test_a_cluster_mode_job_on_yarn_on_a_lost_node_fails_with_yarns_words_is_restarted_by_the_watchdog_and_stops(
        yarn_cluster, hdfs_root, tmp_path, monkeypatch):
    """The driver runs in the ApplicationMaster's container: its heartbeats and stop acknowledgement reach the
    control folder on HDFS from there. The whole node dies (the NodeManager and every container process, the
    driver's too, SIGKILL; the bed has one NodeManager, so the test brings one back on the same addresses):
    the ResourceManager marks the node LOST and fails the application with its own diagnostics, which job
    status says; once a NodeManager is back the watchdog restarts the job from its last state (its live
    checkpoint) as a new application. It stops with a savepoint. Every event is in the sink once."""
    monkeypatch.setenv("HADOOP_CONF_DIR", str(yarn_cluster.conf_dir))
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    jobs = write_yarn_jobs(tmp_path, hdfs_root, deploy_mode="cluster")
    job_folder = Store(f"{hdfs_root}/savepoints/demo")
    timings: dict[str, float] = {}
    try:
        began = time.monotonic()
        started = cli("job", "start", "demo", "--fresh", "--jobs-file", jobs, "--wait-timeout", "300")
        timings["start"] = time.monotonic() - began
        app_id = wait_for_app(job_folder)
        app = yarn_cluster.app(app_id)
        assert (app["state"], app["name"]) == ("RUNNING", "demo"), app
        status = cli("job", "status", "demo", "--jobs-file", jobs)
        assert status["state"] == "running" and f"application {app_id} is RUNNING" in status["detail"], status
        assert status["host"] and started["first_batch"] is not None
        for index in range(2, 4):
            sent.update(demo.write_events(tmp_path / "input", index))
        wait_committed(tmp_path / "output", sent)

        # the node lost: no NodeManager heartbeats; its containers, the driver's too, gone with it
        began = time.monotonic()
        yarn_cluster.lose_node()
        for index in range(4, 6):  # input that arrives while the job is down
            sent.update(demo.write_events(tmp_path / "input", index))
        lost = wait_for_state(yarn_cluster, app_id, ("FINISHED", "FAILED", "KILLED"))
        assert lost["state"] == "FAILED" and "lost" in lost["diagnostics"] and "LOST" in yarn_cluster.node_states(), lost
        status = wait_for_status(jobs, ("failed", "lost"))
        said = " ".join(lost["diagnostics"].split())[:200]  # YARN's own words, as job status passes them on
        assert status["state"] in ("failed", "lost") and said in " ".join(f"{status['error']} {status['detail']}".split()), \
            (status, lost["diagnostics"])
        timings["node lost, seen"] = time.monotonic() - began
        print(f"YARN on the lost node's application: {said}")
        began = time.monotonic()
        yarn_cluster.start_nodemanager()
        timings["NodeManager back"] = time.monotonic() - began
        # the watchdog restarts it (last state: on its live checkpoint), a new application on YARN
        job = load_jobs(jobs)["demo"]
        began = time.monotonic()
        decision = watchdog.supervise(JobContext(job, Store(job.savepoint_dir)), log_dir=tmp_path / "logs",
                                      submit_command=lambda checkpoint, conf: spark_submit_command(job, checkpoint, conf),
                                      wait_timeout=300)
        timings["watchdog restart"] = time.monotonic() - began
        assert decision.action == "restarted" and said in " ".join(decision.reason.split()), decision
        new_app = wait_for_app(job_folder, not_this=app_id)
        assert yarn_cluster.app(new_app)["state"] == "RUNNING"
        wait_committed(tmp_path / "output", sent)

        began = time.monotonic()
        stopped = cli("job", "stop", "demo", "--jobs-file", jobs)
        timings["stop"] = time.monotonic() - began
        assert stopped["stop_method"] == "cooperative" and stopped["consistency"] == "clean", stopped
        assert stopped["type"] == "stop" and stopped["pointer"].startswith(f"{hdfs_root}/savepoints/demo/"), stopped
        assert wait_for_state(yarn_cluster, new_app, ("FINISHED", "FAILED", "KILLED"))["state"] == "FINISHED"
    finally:
        if "RUNNING" not in yarn_cluster.node_states():  # a failure between the loss and the NodeManager's return
            yarn_cluster.start_nodemanager()
        last = read_run(job_folder)
        if last is not None:
            stop_process(last, grace=15)
        for app in yarn_cluster.apps(states="RUNNING,ACCEPTED"):
            if app["name"] == "demo":
                YarnRunner().kill(RunTarget(job="demo", application_id=app["id"], master="yarn",
                                            master_ui=yarn_cluster.url), grace=10)
    # every event once: across the lost node (the driver killed with it) and the watchdog's restart
    assert demo.committed_event_ids(tmp_path / "output") == sorted(sent)
    print("YARN cluster mode: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


def test_a_yarn_job_on_a_queue_the_resourcemanager_cannot_take_is_refused_naming_the_queues(
        yarn_cluster, tmp_path, monkeypatch):
    """The capacity scheduler's queues (/ws/v1/cluster/scheduler): an unknown queue and a parent queue are
    refused at ``job start`` with yarn_queue_unusable, before spark-submit runs."""
    monkeypatch.setenv("HADOOP_CONF_DIR", str(yarn_cluster.conf_dir))
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    submitted = len(yarn_cluster.apps())
    for queue, problem in (("nightly", "it has no such queue"), ("root", "it is a parent queue")):
        jobs = write_yarn_jobs(tmp_path, f"file://{tmp_path}", queue=queue)
        result = CliRunner().invoke(cli_app, ["job", "start", "demo", "--fresh", "--jobs-file", jobs, "--json"])
        error = json.loads(result.stdout)["error"]
        assert result.exit_code != 0 and error["code"] == "yarn_queue_unusable", result.stdout
        assert f"queue {queue!r}" in error["message"] and problem in error["message"], error
        assert "spark.yarn.queue" in error["hint"] and "root.default" in error["hint"], error
        assert read_run(Store(f"file://{tmp_path}/savepoints/demo")) is None  # no spark-submit ran
    assert len(yarn_cluster.apps()) == submitted


def test_a_yarn_job_started_without_a_yarn_site_is_refused_naming_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    jobs = write_yarn_jobs(tmp_path, f"file://{tmp_path}")
    result = CliRunner().invoke(cli_app, ["job", "start", "demo", "--fresh", "--jobs-file", jobs, "--json"])
    error = json.loads(result.stdout)["error"]
    assert result.exit_code != 0 and error["code"] == "yarn_not_configured", result.stdout
    assert "HADOOP_CONF_DIR" in error["hint"] and "nothing was started" in error["message"], error
    assert not (tmp_path / "savepoints" / "demo" / "_run.json").exists()
    assert not (tmp_path / "savepoints" / "demo" / "_lease.json").exists()
