"""Upgrades of a real streaming job (the demo job under spark-submit), through the upgrade_job DAG
on a real Airflow (dag.test(), SQLite): a last-state upgrade that copies no state; versions that cannot
start, change a state key's type or add a stateful operator, each refused by the check on a scratch
copy while the running version goes on (and, with the check off, rolled back after it fails); a checked
savepoint upgrade that adds an output column. The sink holds every event exactly once. In-process: a
check-mode driver's sink swap, and a query raising in its batch reported with Spark's message."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import airflow_savepoints.demo.app as demo
from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.core import list_savepoints, resolve_pointer, take_savepoint
from airflow_savepoints.errors import SavepointTooOldError
from airflow_savepoints.jobs import StreamingJob, load_jobs
from airflow_savepoints.jobs.description import trust
from airflow_savepoints.jobs.description.channel import CHECK_CONF, CHECKPOINT_CONF, JobControl
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.jobs.driver.check_sink import run_check
from airflow_savepoints.jobs.driver.control import claim_run
from airflow_savepoints.jobs.launch.launcher import spark_submit_command
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.jobs.workflows.run import JobContext, stop_process
from airflow_savepoints.jobs.workflows.upgrade import UpgradeRefusedError, UpgradeRequest, new_version, upgrade
from airflow_savepoints.storage import Store
from tests.conftest import ROOT
from tests.support.feeding import Feeder, wait_for_sink

JOB = "demo-dedup"
FIX = {demo.SKIP_BAD_RECORDS_CONF: "true"}


def run_dag(dag_id: str, **conf):
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(ROOT / "dags" / f"{dag_id}.py")).get_dag(dag_id)
    result = dag.test(run_conf=conf or None)
    return result.state, {t.task_id: t.state for t in result.get_task_instances()}


def submit(job: StreamingJob):
    return lambda checkpoint, conf: spark_submit_command(job, checkpoint, conf)


@contextlib.contextmanager
def forging_check_results(job_folder: Store):
    """Meanwhile, a writer of the savepoint folder puts a "passed" ``result.json`` into each check's
    scratch folder as soon as its copy appears (issue 40: it made a crashing version pass)."""
    stop, folder = threading.Event(), Path(job_folder.path_of("_check"))

    def forge() -> None:
        while not stop.wait(0.2):
            for scratch in folder.glob("*/checkpoint"):
                result = scratch.parent / "result.json"
                with contextlib.suppress(OSError):  # the check may have removed its folder meanwhile
                    if not result.exists():
                        result.write_text(json.dumps({"outcome": "passed", "batch_id": 999999}))

    forger = threading.Thread(target=forge, daemon=True)
    forger.start()
    try:
        yield
    finally:
        stop.set()
        forger.join(10)


def checkpoints_of(home: Path) -> list[str]:
    return sorted(p.name for p in home.iterdir() if p.name.startswith("checkpoint"))


def test_refusals_change_nothing(tmp_path):
    """stateless without its flag, and an upgrade of a job that does not run: refused, nothing written."""
    job = StreamingJob(name=JOB, application=demo.__file__, checkpoint=str(tmp_path / "checkpoint"),
                       savepoint_dir=str(tmp_path / "savepoints"))
    ctx = JobContext(job, Store(job.savepoint_dir))
    with pytest.raises(UpgradeRefusedError, match="EMPTY state"):
        upgrade(ctx, UpgradeRequest(version=job.version(), mode="stateless"), submit_for=submit, log_dir=tmp_path)
    with pytest.raises(UpgradeRefusedError, match="not_started, not running"):
        upgrade(ctx, UpgradeRequest(version=job.version()), submit_for=submit, log_dir=tmp_path)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - name: {JOB}\n    application: {demo.__file__}\n    checkpoint: {tmp_path}/checkpoint\n"
                    f"    savepoint_dir: {tmp_path}/savepoints\n")
    for extra, words in ((["--mode", "stateless"], "EMPTY state"), (["--conf", "nokey"], "not KEY=VALUE"),
                         (["--mode", "blue-green"], "unknown upgrade mode")):
        result = CliRunner().invoke(cli_app, ["job", "upgrade", JOB, "--jobs-file", str(jobs), *extra])
        assert result.exit_code == 1 and words in result.output, result.output
    assert not (tmp_path / "savepoints").exists()


@pytest.mark.slow
def test_last_state_upgrade_then_bad_versions_rolled_back_then_a_new_column(airflow_db, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", str(tmp_path))
    monkeypatch.setenv("SAVEPOINTS_DEMO_APP", demo.__file__)
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    root = Store(str(tmp_path / "savepoints"))
    job_folder = root.child(JOB)
    live = str(tmp_path / "checkpoint")
    try:
        job = load_jobs(ROOT / "dags" / "jobs.yaml")[JOB]
        ctx = JobContext(job, root)
        lifecycle.start(ctx, submit_command=submit(job), log_dir=tmp_path / "logs", fresh=True, wait_timeout=240)
        first = read_run(job_folder)
        assert first.version["hash"] and first.version["spark_conf"][demo.SKIP_BAD_RECORDS_CONF] == "false"

        # last-state: stop cleanly (a stop savepoint is recorded), the fixed version resumes on the same checkpoint
        with Feeder(tmp_path / "input", sent, 2) as feeder:
            state, tasks = run_dag("upgrade_job", job=JOB, mode="last-state", spark_conf=json.dumps(FIX),
                                   health_timeout=120)
        assert state == "success", tasks
        upgraded = read_run(job_folder)
        [stop] = list_savepoints(root, JOB)
        assert stop.type.value == "stop"
        assert upgraded.checkpoint == live and checkpoints_of(tmp_path) == ["checkpoint"]  # nothing copied
        assert upgraded.start_batch == stop.batch_id  # it went on from the stop batch, on the live checkpoint
        commits = sorted(int(p.name) for p in Path(live, "commits").iterdir() if p.name.isdigit())
        assert stop.batch_id + 1 in commits
        assert upgraded.version["spark_conf"][demo.SKIP_BAD_RECORDS_CONF] == "true"
        assert upgraded.version["hash"] != first.version["hash"]
        _, manifest = resolve_pointer(stop.pointer)
        assert manifest.format_version == 1 and manifest.job_version == first.version  # the stopped run's
        status = lifecycle.status(ctx)
        assert status.state == "running" and status.version["hash"] == upgraded.version["hash"]

        # versions that do not fit, each refused by its check (by default in savepoint mode) on a scratch copy of
        # the state while the running version goes on committing batches, nothing stopped: an application that
        # does not exist, a changed key type (CLI `job check`), an added stateful operator
        capfd.readouterr()
        with Feeder(tmp_path / "input", sent, feeder.index) as feeder, forging_check_results(job_folder):
            state, tasks = run_dag("upgrade_job", job=JOB, mode="savepoint", application=str(tmp_path / "missing.py"),
                                   spark_conf=json.dumps(FIX), health_timeout=120)
            assert state == "failed" and tasks == {"upgrade": "failed"}
            log = capfd.readouterr().out  # the task's log: the check's error; no stop, no rollback
            assert "UpgradeCheckFailedError" in log and "exited before it checked a batch" in log, log[-3000:]
            assert "not sealed with this check's secret" in log, log[-3000:]  # a forged "passed" was there: ignored
            assert "rolled back" not in log
            assert_untouched(ctx, upgraded, root)
            # a rescale its HDFS-backed state cannot take: refused from the live checkpoint's files before the
            # check's savepoint and the stop, with the check on (the default) and off alike
            taken = len(list_savepoints(root, JOB))
            for check in ("--check-first", "--no-check-first"):
                result = CliRunner().invoke(cli_app, ["job", "upgrade", JOB, "--jobs-file", str(ROOT / "dags" / "jobs.yaml"),
                                                      "--json", "--mode", "savepoint", "--state-partitions", "4", check,
                                                      "--conf", f"{demo.SKIP_BAD_RECORDS_CONF}=true"])
                assert result.exit_code == 1, result.output
                error = json.loads(result.stdout)["error"]
                assert error["code"] == "rescale_unsupported_state", error
                assert "refused before anything stopped" in error["message"] and "nothing was stopped" in error["hint"]
            assert len(list_savepoints(root, JOB)) == taken and read_run(job_folder).run_id == upgraded.run_id
            result = CliRunner().invoke(cli_app, ["job", "check", JOB, "--jobs-file", str(ROOT / "dags" / "jobs.yaml"),
                                                  "--json", "--conf", f"{demo.SKIP_BAD_RECORDS_CONF}=true", "--conf",
                                                  f"{demo.ID_AS_STRING_CONF}=true", "--timeout", "120"])
            assert result.exit_code == 1, result.output
            error = json.loads(result.stdout)["error"]
            assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in error.get("cause", ""), error  # Spark's own words, as said
            assert error["code"] == "upgrade_check_failed" and "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in error["message"], \
                (error, result.output[-3000:])
            assert_untouched(ctx, upgraded, root)
            capfd.readouterr()
            state, tasks = run_dag("upgrade_job", job=JOB, mode="savepoint", health_timeout=120,
                                   spark_conf=json.dumps({**FIX, demo.DEDUP_USERS_CONF: "true"}))
            assert state == "failed" and tasks == {"upgrade": "failed"}
            log = capfd.readouterr().out
            assert "UpgradeCheckFailedError" in log and "rolled back" not in log, log[-3000:]
            assert "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA" in log, log[-3000:]
            assert_untouched(ctx, upgraded, root)
        checks = [s for s in list_savepoints(root, JOB) if s.reason == "upgrade check"]
        assert len(checks) == 3 and {s.type.value for s in checks} == {"manual"}

        # the missing application with check_first off: it fails at start, the fixed version is rolled back
        capfd.readouterr()
        with Feeder(tmp_path / "input", sent, feeder.index) as feeder:
            state, tasks = run_dag("upgrade_job", job=JOB, mode="savepoint", application=str(tmp_path / "missing.py"),
                                   spark_conf=json.dumps(FIX), health_timeout=120, check_first="false")
        assert state == "failed" and tasks == {"upgrade": "failed"}
        log = capfd.readouterr().out  # the task's log: the new version's error, then the rollback
        assert "UpgradeRolledBackError" in log and "exited before committing a batch" in log and "rolled back" in log, log[-3000:]
        back = read_run(job_folder)
        assert back.version == upgraded.version and back.ended is None  # the previous version runs again
        second_stop = list_savepoints(root, JOB)[-1]
        assert second_stop.type.value == "stop" and back.start_batch == second_stop.batch_id
        assert back.checkpoint.startswith(str(tmp_path / "checkpoint-"))  # restored from the stop savepoint

        # a compatible change of the output, a new column, by savepoint: the check passes, then the upgrade
        # proceeds; the column from the stop batch + 1 on
        with Feeder(tmp_path / "input", sent, feeder.index) as feeder:
            state, tasks = run_dag("upgrade_job", job=JOB, mode="savepoint", health_timeout=120,
                                   spark_conf=json.dumps({**FIX, demo.VERSION_COLUMN_CONF: "v2"}))
        assert state == "success", tasks
        v2, last_stop = read_run(job_folder), list_savepoints(root, JOB)[-1]
        last_check = list_savepoints(root, JOB)[-2]
        assert last_check.reason == "upgrade check" and last_check.batch_id <= last_stop.batch_id
        assert not list(Path(job_folder.path_of("_check")).iterdir())
        assert v2.start_batch == last_stop.batch_id and v2.version["spark_conf"][demo.VERSION_COLUMN_CONF] == "v2"
        got = wait_for_sink(tmp_path / "output", sorted(sent))
        rows = demo.committed_rows(tmp_path / "output")
        old = [r["id"] for r in rows if "version" not in r]
        new = [r["id"] for r in rows if r.get("version") == "v2"]
        assert old and new and len(old) + len(new) == len(rows) and max(old) < min(new)
        by_batch = {}  # batch -> whether its rows carry the column, for the sink log's entries not yet compacted
        for entry in (tmp_path / "output" / "_spark_metadata").iterdir():
            rows = demo.sink_log_rows(tmp_path / "output", entry.name) if entry.name.isdigit() else []
            if rows:  # a no-data batch (watermark) writes no file
                by_batch[int(entry.name)] = {"version" in r for r in rows}
        assert any(b > last_stop.batch_id for b in by_batch), by_batch
        assert all(flags == {b > last_stop.batch_id} for b, flags in by_batch.items()), (last_stop.batch_id, by_batch)
    finally:
        last = read_run(job_folder)
        if last is not None:
            stop_process(last, grace=30)
    assert got == sorted(sent)  # every event once: nothing lost or repeated across the upgrade and the rollback


def assert_untouched(ctx: JobContext, run, root: Store, timeout: float = 90) -> None:
    """The run ``run`` still runs as it was (same run id, no stop request, the lease its own), commits a
    batch after the refusal, and no check's scratch is left."""
    state = lifecycle.status(ctx)
    assert state.state == "running" and state.run_id == run.run_id, state
    assert ctx.lease.holder().run_id == run.run_id
    assert JobControl(Store(run.control)).stop_requested() is None
    assert not list(Path(root.child(JOB).path_of("_check")).iterdir())  # the scratch copies are gone
    before = state.last_batch
    deadline = time.monotonic() + timeout
    while (batch := lifecycle.status(ctx).last_batch) == before and time.monotonic() < deadline:
        time.sleep(1)
    assert batch is not None and before is not None and batch > before, (before, batch)


def test_new_version_keeps_unset_fields(tmp_path):
    job = StreamingJob(name=JOB, application="app.py", application_args=["a"], spark_conf={"k": "1"},
                       checkpoint=str(tmp_path / "c"))
    version = new_version(job, None, None, {"x": "2"})
    assert (version.application, version.application_args, version.spark_conf) == ("app.py", ["a"], {"k": "1", "x": "2"})
    assert version.hash != job.version().hash and job.with_version(version).version() == version


def test_a_start_refuses_a_savepoint_older_than_max_age_and_changes_nothing(checkpoint, tmp_path):
    """Flink users' restore check: a savepoint past ``max_age`` is refused before anything starts."""
    job = StreamingJob(name=JOB, application=demo.__file__, checkpoint=str(tmp_path / "live"),
                       savepoint_dir=str(tmp_path / "savepoints"))
    ctx = JobContext(job, Store(job.savepoint_dir))
    saved = take_savepoint(str(checkpoint), JOB, savepoint_dir=job.savepoint_dir)
    time.sleep(1.1)
    before = sorted(p.name for p in (tmp_path / "savepoints" / JOB).iterdir())
    with pytest.raises(SavepointTooOldError, match="older than max_age 1s"):  # the restore's own check
        lifecycle.start(ctx, submit_command=submit(job), log_dir=tmp_path / "logs", pointer=saved.pointer, max_age="1s")
    assert sorted(p.name for p in (tmp_path / "savepoints" / JOB).iterdir()) == before  # no run, no lease
    assert not (tmp_path / "logs").exists() and not list(tmp_path.glob("live*"))  # nothing restored


def test_a_check_run_swaps_a_foreach_batch_sink_for_noop_and_takes_no_lease(spark, tmp_path, monkeypatch):
    """In check mode the driver's query commits its batch, but the user's sink function is never
    called and no run lease or control folder appears; the result says passed. A query that raises
    in its batch is a failed check with Spark's message."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    monkeypatch.setattr(DataStreamWriter, "start", DataStreamWriter.start)  # undone after the test
    monkeypatch.setattr(DataStreamWriter, "toTable", DataStreamWriter.toTable)
    scratch, checkpoint = tmp_path / "job" / "_check" / "c1", tmp_path / "job" / "_check" / "c1" / "checkpoint"
    settings = {CHECK_CONF: str(scratch), CHECKPOINT_CONF: str(checkpoint), "spark.savepoints.jobFolder": str(tmp_path / "job")}
    for key, value in settings.items():
        spark.conf.set(key, value)
    secret = trust.new_secret()
    monkeypatch.setenv(trust.CHECK_SECRET_ENV, secret)  # as the check hands it to its driver
    try:
        assert claim_run(spark) is None  # check mode: no lease taken, the sink swap installed
        called = []
        query = (spark.readStream.format("rate").option("rowsPerSecond", 5).load().writeStream
                 .foreachBatch(lambda frame, batch: called.append(batch)).option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime="200 milliseconds").start())
        result = run_check(query, spark, str(scratch))
        demo.write_events(tmp_path / "input", 0)
        spark.conf.set(CHECKPOINT_CONF, str(tmp_path / "other"))  # the next check's copy, whatever the query says
        failing = (spark.readStream.schema(demo.EVENT_SCHEMA).json(str(tmp_path / "input"))
                   .select(F.raise_error(F.lit("v3 fails on every batch")))
                   .writeStream.format("console").option("checkpointLocation", str(tmp_path / "live")).start())
        failed = run_check(failing, spark, str(tmp_path / "other-check"))
    finally:
        for key in settings:
            spark.conf.unset(key)
    assert result["outcome"] == "passed" and result["batch_id"] >= 0, result
    written = json.loads((scratch / "result.json").read_text())
    assert written["outcome"] == "passed" and trust.sealed(written, secret)  # only a sealed result counts
    assert called == [] and not query.isActive
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["_check"]  # no _lease.json, no _control
    assert failed["outcome"] == "failed" and "v3 fails on every batch" in failed["error"], failed
    assert "=== Streaming Query ===" not in failed["error"]  # Spark's message, without the plan
    assert (tmp_path / "other" / "offsets").is_dir() and not (tmp_path / "live").exists()
