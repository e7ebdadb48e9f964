"""Acting on the autoscaler's decisions without Spark: the upgrade a decision becomes, and the outcomes recorded.

A job "runs" as a driver's side of a run (its lease and heartbeats, ``tests/test_lifecycle.py``'s ``driver``) on a
synthetic checkpoint, with a recorded metric series that calls for a scale-up. The action goes through the real
upgrade path: a check savepoint, a restore into the check's scratch folder and a submitted check driver, here a
process that exits without checking a batch, so the check fails for real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_savepoints.core import list_savepoints
from airflow_savepoints.core.names import AUTOSCALE_FILE, CHECK_FOLDER
from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.description.channel import JobControl
from airflow_savepoints.jobs.description.metrics import read_decisions, write_series
from airflow_savepoints.jobs.description.model import AutoscaleSettings, JobVersion
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.jobs.workflows.autoscale import Decision, act_failures, evaluate, scale_request
from airflow_savepoints.jobs.workflows.run import JobContext, JobState
from airflow_savepoints.storage import Store
from tests.support.synthetic import write_checkpoint
from tests.unit.jobs.test_autoscale import batches

STANDALONE = "spark://127.0.0.1:9"  # nothing listens: no runner call may need it


def step_up_ending_now(**given) -> list:
    series = batches([(1200, 120), (360, 190)], cores=2, **given)
    shift = time.time() - 1 - series[-1].time
    return [p.model_copy(update={"time": p.time + shift}) for p in series]


def running_job(tmp_path: Path, *, master: str = STANDALONE, partitions: int | None = None, **policy):
    """A job with ``mode: act`` whose run beats on a synthetic checkpoint; its series calls for 2 -> 3 cores."""
    from tests.test_lifecycle import running_run

    job = StreamingJob(name="orders", application="app.py", master=master, checkpoint=str(write_checkpoint(tmp_path / "cp")),
                       savepoint_dir=str(tmp_path / "sp"),
                       autoscale=AutoscaleSettings(mode="act", max_executors=4, cooldown=900, **policy))
    ctx = JobContext(job, Store(job.savepoint_dir))
    write_series(ctx.folder, step_up_ending_now(partitions=partitions))
    run = running_run(ctx)
    assert lifecycle.status(ctx).state == "running"
    return ctx, run


class Submitted:
    """The submit builder a check calls: records what it was asked to run, and runs a driver that exits at once."""

    def __init__(self) -> None:
        self.jobs: list[StreamingJob] = []

    def __call__(self, job: StreamingJob):
        self.jobs.append(job)
        return lambda checkpoint, conf: ["sh", "-c", "exit 3"]


def test_a_decision_becomes_a_checked_savepoint_upgrade_to_the_running_version_with_the_new_conf():
    job = StreamingJob(name="orders", application="app.py", spark_conf={"a": "1"}, checkpoint="/cp")
    ctx = JobContext(job, Store("/sp"))
    running = JobVersion.of("v2.py", ["x"], {"a": "2"})  # what the run was started with (an upgrade since)
    state = JobState(job="orders", state="running", version=running.model_dump())
    up = Decision(action="scale_up", reason="scale_up", message="", current_cores=2, target_cores=3,
                  current_partitions=2, target_partitions=3)
    request = scale_request(ctx, state, up, {"spark.cores.max": "3"})
    assert (request.mode, request.check_first, request.rollback, request.state_partitions) == ("savepoint", True, True, 3)
    assert (request.version.application, request.version.application_args) == ("v2.py", ["x"])
    assert request.version.spark_conf == {"a": "2", "spark.cores.max": "3"}
    same = scale_request(ctx, state, up.model_copy(update={"target_partitions": 2}), {})
    assert same.state_partitions is None and same.version.hash == running.hash  # partitions unchanged: not rescaled


def test_a_decisions_upgrade_runs_the_same_code_so_a_rollback_may_use_its_progress_and_a_code_change_does_not():
    from airflow_savepoints.jobs.workflows.upgrade import same_code

    job = StreamingJob(name="orders", application="app.py", application_args=["x"], spark_conf={"a": "1"}, checkpoint="/cp")
    state = JobState(job="orders", state="running", version=job.version().model_dump())
    up = Decision(action="scale_up", reason="scale_up", message="", current_cores=2, target_cores=4,
                  current_partitions=2, target_partitions=4)
    request = scale_request(JobContext(job, Store("/sp")), state, up, {"spark.cores.max": "4", "spark.executor.cores": "2"})
    assert same_code(job.version(), request.version) and request.version.hash != job.version().hash
    for changed in ({"application": "v2.py"}, {"application_args": ["y"]}, {"spark_conf": {"a": "2"}},
                    {"spark_conf": {"a": "1", "spark.sql.shuffle.partitions": "4"}}):
        other = job.model_copy(update=changed).version()
        assert not same_code(job.version(), other), changed  # a change of code: rolled back to the stop savepoint


def test_a_scale_up_that_fails_its_check_is_rolled_back_recorded_and_the_next_decision_waits_out_the_cooldown(tmp_path):
    ctx, run = running_job(tmp_path)
    submitted = Submitted()
    result = evaluate(ctx, dry_run=False, submit_for=submitted, log_dir=tmp_path / "logs")
    assert (result["action"], result["outcome"]) == ("scale_up", "rolled_back"), result
    assert result["error"]["code"] == "autoscale_rolled_back" and "failed its check" in result["error"]["message"]
    assert "exited before it checked a batch" in result["error"]["message"], result["error"]
    assert submitted.jobs[0].spark_conf == {"spark.cores.max": "3", "spark.executor.cores": "1"}  # the new executors
    # the running configuration was not stopped: the same run, no stop request, no scratch left
    state = lifecycle.status(ctx)
    assert (state.state, state.run_id) == ("running", "r1") and JobControl(run.control.folder).stop_requested() is None
    assert ctx.folder.listdir(CHECK_FOLDER) == []
    [recorded] = read_decisions(ctx.folder)
    assert recorded["outcome"] == "rolled_back" and recorded["error"]["code"] == "autoscale_rolled_back"
    assert recorded["current"]["cores"] == 2 and recorded["target"]["cores"] == 3 and recorded["evidence"]
    assert act_failures([result]).code == "autoscale_rolled_back"

    run.beat(last_committed_batch=3)
    checks = len(list_savepoints(ctx.root, "orders"))
    held = evaluate(ctx, dry_run=False, submit_for=Submitted(), log_dir=tmp_path / "logs")
    assert (held["outcome"], held["reason"], held["error"]) == ("held", "cooldown", None), held
    assert held["evidence"]["cooldown_until"] == result["error"]["hint"].split("no decision before ")[1].split(" ")[0]
    assert len(list_savepoints(ctx.root, "orders")) == checks  # nothing tried again
    assert [d["outcome"] for d in read_decisions(ctx.folder)] == ["rolled_back", "held"]


def test_an_upgrade_refused_before_anything_stops_is_recorded_failed_and_holds_the_cooldown(tmp_path):
    """A partition change of HDFS-backed state: refused from the live checkpoint's files, no savepoint taken."""
    ctx, _ = running_job(tmp_path, master="local[2]", partitions=2, min_partitions=2, max_partitions=8)
    result = evaluate(ctx, dry_run=False, submit_for=Submitted(), log_dir=tmp_path / "logs")
    assert (result["outcome"], result["target"]["partitions"]) == ("failed", 3), result
    assert result["error"]["code"] == "autoscale_act_failed" and "rescale_unsupported_state" in result["error"]["message"]
    assert list_savepoints(ctx.root, "orders") == [] and lifecycle.status(ctx).run_id == "r1"
    assert evaluate(ctx, dry_run=False, submit_for=Submitted(), log_dir=tmp_path / "logs")["reason"] == "cooldown"
    assert act_failures([{"error": None}, result]).code == "autoscale_act_failed"


def test_dry_run_mode_recommend_and_a_local_masters_cores_only_recommend_and_change_nothing(tmp_path):
    ctx, _ = running_job(tmp_path / "a")
    never = Submitted()
    assert evaluate(ctx, dry_run=True, submit_for=never, log_dir=tmp_path)["outcome"] == "recommended"
    ctx.job = ctx.job.model_copy(update={"autoscale": ctx.job.autoscale.model_copy(update={"mode": "recommend"})})
    assert evaluate(ctx, dry_run=False, submit_for=never, log_dir=tmp_path)["outcome"] == "recommended"
    local, _ = running_job(tmp_path / "b", master="local[2]")
    result = evaluate(local, dry_run=False, submit_for=never, log_dir=tmp_path)
    assert (result["action"], result["outcome"], result["spark_conf"]) == ("scale_up", "recommended", {})
    assert "local[N]" in result["warnings"][0]
    assert never.jobs == [] and list_savepoints(ctx.root, "orders") == [] and list_savepoints(local.root, "orders") == []
    history = json.loads(Path(local.folder.path_of(AUTOSCALE_FILE)).read_text())["decisions"]
    assert [d["outcome"] for d in history] == ["recommended"]


@pytest.mark.parametrize("outcome", ["acted", "rolled_back", "failed"])
def test_the_cooldown_counts_from_every_attempt_to_act_and_not_from_a_recommendation(tmp_path, outcome):
    ctx, _ = running_job(tmp_path)
    ctx.folder.write_bytes_atomic(AUTOSCALE_FILE, json.dumps({"decisions": [
        {"at_epoch": time.time() - 60, "outcome": outcome}]}).encode())
    assert evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=tmp_path)["reason"] == "cooldown"
    ctx.folder.write_bytes_atomic(AUTOSCALE_FILE, json.dumps({"decisions": [
        {"at_epoch": time.time() - 60, "outcome": "recommended"}]}).encode())
    assert evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=tmp_path)["reason"] == "scale_up"


def test_a_job_naming_kafka_brokers_says_where_its_backlog_came_from(tmp_path):
    """The brokers are asked only for the Kafka topics the checkpoint's last batch read: none here (a synthetic
    checkpoint of a file source), so no broker is dialled and the progress's backlog decides (tests/test_kafka.py
    reads a real broker's)."""
    from airflow_savepoints.jobs.description.model import KafkaSettings

    ctx, _ = running_job(tmp_path)
    ctx.job = ctx.job.model_copy(update={"kafka": KafkaSettings(bootstrap_servers=STANDALONE.removeprefix("spark://"))})
    began = time.monotonic()
    result = evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=tmp_path)
    assert time.monotonic() - began < 5 and result["warnings"] == [], result["warnings"]
    assert "reads no Kafka topic" in result["evidence"]["backlog_read"]["reason"], result["evidence"]
    ctx.job = ctx.job.model_copy(update={"kafka": None})
    assert "names no Kafka brokers" in evaluate(ctx, dry_run=True, submit_for=Submitted(),
                                                log_dir=tmp_path)["evidence"]["backlog_read"]["reason"]
