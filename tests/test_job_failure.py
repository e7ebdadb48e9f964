"""A real job that fails on a bad record: the failure is found, the checkpoint retention policy for a
failure is applied once, and the retained checkpoint restores into the fixed job, which runs on."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import airflow_savepoints.demo.app as demo
from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.core import list_savepoints
from airflow_savepoints.errors import JobFailedError
from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.description.channel import CONTROL_CONF, JobControl
from airflow_savepoints.jobs.description.record import JobRun, read_run
from airflow_savepoints.jobs.launch.launcher import new_control_folder, process_alive, start_detached, wait_for_commit
from airflow_savepoints.jobs.workflows.lifecycle import cancel, handle_failure, status, stop
from airflow_savepoints.jobs.workflows.run import JobContext, stop_process
from airflow_savepoints.storage import Store
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
JOB = "demo-dedup"


@pytest.fixture(scope="module")
def failed_job(tmp_path_factory) -> Path:
    """``demo-dedup`` laid out as dags/jobs.yaml has it under SAVEPOINTS_DEMO_HOME, run until a bad record kills it."""
    home = tmp_path_factory.mktemp("failed-job")
    for index in range(2):
        demo.write_events(home / "input", index)
    job_folder = Store(str(home / "savepoints" / JOB))
    control = new_control_folder(job_folder)
    command = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.sql.shuffle.partitions=2", "--conf", f"{CONTROL_CONF}={control.url}",
               demo.__file__, str(home / "input"), str(home / "checkpoint"), str(home / "output")]
    checkpoint = Store(str(home / "checkpoint"))
    run = start_detached(JOB, command, checkpoint, job_folder, home / "logs", control=control)
    try:
        wait_for_commit(run, checkpoint, timeout=240)
        deadline = time.monotonic() + 120
        while demo.committed_event_ids(home / "output") != list(range(100)) and time.monotonic() < deadline:
            time.sleep(0.5)  # both good files are in before the bad record arrives
        demo.write_bad_record(home / "input", 2)
        deadline = time.monotonic() + 180
        while process_alive(run.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not process_alive(run.pid), "the job did not fail on the bad record"
    finally:
        stop_process(run, grace=10)
    return home


def test_the_failure_is_found_with_its_reason(failed_job):
    run = read_run(Store(str(failed_job / "savepoints" / JOB)))
    failure = JobControl(Store(run.control)).failure()
    assert failure is not None and "bad record: negative id -1" in failure["error"]
    ctx = JobContext(StreamingJob(name=JOB, application=demo.__file__, checkpoint=str(failed_job / "checkpoint")),
                     Store(str(failed_job / "savepoints")))
    seen = status(ctx)
    assert seen.state == "failed" and "bad record: negative id -1" in seen.error, seen


# before the tests below, which record runs after the failed one in the shared failed job
def test_a_failed_run_that_committed_nothing_past_its_start_registers_no_savepoint_and_stays_failed(failed_job, tmp_path):
    """Issue 39: as if the run had been restored at the failed job's last commit and failed on its next batch."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(failed_job / "checkpoint", checkpoint)
    last, _ = checkpoint_progress(Store(str(checkpoint)))
    original = read_run(Store(str(failed_job / "savepoints" / JOB)))
    job_folder = Store(str(tmp_path / "savepoints" / JOB))
    shutil.copytree(failed_job / "savepoints" / JOB / "_control", tmp_path / "savepoints" / JOB / "_control")
    run = JobRun.model_validate({**original.model_dump(), "checkpoint": str(checkpoint), "start_batch": last})
    job_folder.write_bytes_atomic("_run.json", run.model_dump_json().encode())
    ctx = JobContext(StreamingJob(name=JOB, application=demo.__file__, checkpoint=str(checkpoint)),
                     Store(str(tmp_path / "savepoints")))

    with pytest.raises(JobFailedError) as refused:  # a stop of the dead run says so, and changes nothing
        stop(ctx, grace=1, inflight_wait=1)
    assert refused.value.code == "job_failed" and original.run_id in refused.value.message
    assert "bad record" in refused.value.message and f"last committed batch {last}" in refused.value.message
    seen = status(ctx)
    assert (seen.state, seen.last_batch) == ("failed", last) and "bad record" in seen.error
    assert list_savepoints(Store(str(tmp_path / "savepoints")), JOB) == []

    outcome = handle_failure(ctx, seen, "RETAIN_ON_FAILURE")
    assert outcome["action"] == "retained" and outcome["retained_savepoint"] is None and str(last) in outcome["note"]
    assert checkpoint.is_dir() and list_savepoints(Store(str(tmp_path / "savepoints")), JOB) == []
    seen = status(ctx)
    assert (seen.state, seen.last_batch) == ("failed", last) and "bad record" in seen.error  # until a new start


@pytest.mark.parametrize("policy, kept", [("RETAIN_ON_CANCELLATION", True), ("RETAIN_ON_FAILURE", True),
                                          ("NEVER_RETAIN_AFTER_TERMINATION", False)])
def test_each_policy_on_a_failed_job(failed_job, tmp_path, policy, kept):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(failed_job / "checkpoint", checkpoint)
    original = read_run(Store(str(failed_job / "savepoints" / JOB)))
    job_folder = Store(str(tmp_path / "savepoints" / JOB))
    shutil.copytree(failed_job / "savepoints" / JOB / "_control", tmp_path / "savepoints" / JOB / "_control")  # the
    # run's control folder is always <job folder>/_control/<run id>, whatever the record says
    run = JobRun.model_validate({**original.model_dump(), "checkpoint": str(checkpoint)})
    job_folder.write_bytes_atomic("_run.json", run.model_dump_json().encode())

    ctx = JobContext(StreamingJob(name=JOB, application=demo.__file__, checkpoint=str(checkpoint)),
                     Store(str(tmp_path / "savepoints")))
    outcome = handle_failure(ctx, status(ctx), policy)
    assert outcome["termination"] == "failed" and "bad record" in outcome["reason"]
    assert checkpoint.exists() == kept and outcome["action"] == ("retained" if kept else "deleted")
    saved = list_savepoints(Store(str(tmp_path / "savepoints")), JOB)
    assert [s.type.value for s in saved] == (["retained_checkpoint"] if kept else [])
    assert read_run(job_folder).ended == "failed"
    assert handle_failure(ctx, status(ctx), policy) is None  # once
    assert (failed_job / "checkpoint").exists()  # the original is untouched


def test_a_cancel_of_a_failed_run_records_the_failure_it_was(failed_job, tmp_path):
    """A cancel after the run failed on its own applies the policy as for a failure, once, and the
    run stays failed with its reason: the history never says a crash was a cancellation."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(failed_job / "checkpoint", checkpoint)
    original = read_run(Store(str(failed_job / "savepoints" / JOB)))
    job_folder = Store(str(tmp_path / "savepoints" / JOB))
    shutil.copytree(failed_job / "savepoints" / JOB / "_control", tmp_path / "savepoints" / JOB / "_control")
    job_folder.write_bytes_atomic("_run.json", JobRun.model_validate(
        {**original.model_dump(), "checkpoint": str(checkpoint)}).model_dump_json().encode())
    ctx = JobContext(StreamingJob(name=JOB, application=demo.__file__, checkpoint=str(checkpoint)),
                     Store(str(tmp_path / "savepoints")))

    outcome = cancel(ctx, policy="RETAIN_ON_FAILURE", grace=1)
    assert (outcome["termination"], outcome["stop_method"], outcome["action"]) == ("failed", "not_running", "retained")
    assert "bad record" in outcome["reason"] and "had already failed" in outcome["detail"], outcome
    recorded = read_run(job_folder)
    assert recorded.ended == "failed" and "bad record" in recorded.termination["reason"]
    seen = status(ctx)
    assert seen.state == "failed" and "bad record" in seen.error
    again = cancel(ctx, policy="RETAIN_ON_FAILURE", grace=1)  # the end is recorded: it stays a failure
    assert again["stop_method"] == "not_running" and read_run(job_folder).ended == "failed", again
    assert [s.type.value for s in list_savepoints(Store(str(tmp_path / "savepoints")), JOB)] == ["retained_checkpoint"]


def test_periodic_dag_applies_the_policy_then_the_fixed_job_restores_from_the_retained_checkpoint(
        failed_job, airflow_db, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import DagRunState

    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", str(failed_job))
    monkeypatch.setenv("SAVEPOINTS_DEMO_APP", demo.__file__)
    job_folder = Store(str(failed_job / "savepoints" / JOB))

    def run(dag_id: str, **conf):
        dag = DagBag(dag_folder=str(ROOT / "dags" / f"{dag_id}.py")).get_dag(dag_id)
        result = dag.test(run_conf=conf or None)
        return result.state, {t.task_id: t.state for t in result.get_task_instances()}

    state, tasks = run("periodic_savepoints")
    assert state == DagRunState.FAILED
    assert tasks == {"check_demo_dedup": "failed", "savepoint_demo_dedup": "upstream_failed",
                     "retention_demo_dedup": "upstream_failed"}
    saved = list_savepoints(Store(str(failed_job / "savepoints")), JOB)
    assert [s.type.value for s in saved] == ["retained_checkpoint"]  # jobs.yaml: RETAIN_ON_CANCELLATION
    assert (failed_job / "checkpoint" / "commits").is_dir()  # the live checkpoint is kept
    assert read_run(job_folder).termination["retained_savepoint"]["pointer"] == saved[0].pointer
    state, _ = run("periodic_savepoints")
    assert state == DagRunState.FAILED  # still down: fails again, without a second retained checkpoint
    assert len(list_savepoints(Store(str(failed_job / "savepoints")), JOB)) == 1

    monkeypatch.setenv("SAVEPOINTS_DEMO_SKIP_BAD_RECORDS", "true")  # the fix
    for index in range(3, 7):  # several batches to come, so the restored job keeps committing after its first
        demo.write_events(failed_job / "input", index)
    try:
        state, tasks = run("restore_from_savepoint", job=JOB)
        assert state == DagRunState.SUCCESS, tasks
        restarted = read_run(job_folder)
        assert restarted.checkpoint.startswith(str(failed_job / "checkpoint-")) and restarted.ended is None
        expected = sorted(set(range(100)) | set(range(140, 350)))
        deadline = time.monotonic() + 180
        while demo.committed_event_ids(failed_job / "output") != expected and time.monotonic() < deadline:
            time.sleep(1)
        assert demo.committed_event_ids(failed_job / "output") == expected  # each good event once, none lost
        state, tasks = run("periodic_savepoints")  # running again: savepoints resume
        assert state == DagRunState.SUCCESS, tasks
    finally:
        stop_process(read_run(job_folder), grace=30)
