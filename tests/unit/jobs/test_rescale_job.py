"""A declared job's rescale without Spark: its submit command, the errors its application reports, and the
refusal of an unrescalable upgrade from the live checkpoint (Spark 3.5's checkpoints in tests/data)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from airflow_savepoints import errors
from airflow_savepoints.core.rescale import reported_error
from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.driver import rescale_app
from airflow_savepoints.jobs.launch.launcher import spark_submit_command
from airflow_savepoints.jobs.workflows.rescale import JobRescaler, application_command, refuse_unrescalable, rescale_on_the_job
from airflow_savepoints.jobs.workflows.run import JobContext, JobState
from airflow_savepoints.storage import Store

DATA35 = Path(__file__).parents[2] / "data" / "spark35"


def _job(tmp_path: Path) -> StreamingJob:
    return StreamingJob(name="orders", application="/apps/orders.py", application_args=["--in", "/in", "{checkpoint}"],
                        master="spark://master:7077", spark_conf={"spark.executor.memory": "2g"},
                        checkpoint=str(tmp_path / "cp"), savepoint_dir=str(tmp_path / "sp"))


def test_the_rescale_application_takes_the_place_of_the_jobs_own_in_its_submit_command(tmp_path):
    job = _job(tmp_path)
    command = application_command(job, lambda checkpoint, conf: spark_submit_command(job, checkpoint, conf), "/cp-1",
                                  {"spark.sql.streaming.stateStore.checkpointFormatVersion": "1"}, rescale_app.__file__,
                                  ["/cp-1", "8", "5", "/sp/orders/_rescale/x", ""])
    assert command[:7] == ["spark-submit", "--master", "spark://master:7077", "--deploy-mode", "client", "--name", "orders"]
    assert "spark.executor.memory=2g" in command and "spark.sql.streaming.stateStore.checkpointFormatVersion=1" in command
    assert command[-6:] == [rescale_app.__file__, "/cp-1", "8", "5", "/sp/orders/_rescale/x", ""]
    assert "/apps/orders.py" not in command and "--in" not in command


def test_a_submit_command_that_does_not_end_with_the_application_is_refused(tmp_path):
    job = _job(tmp_path)
    with pytest.raises(errors.RescaleFailedError, match="does not end with its application"):
        application_command(job, lambda checkpoint, conf: ["spark-submit", job.application, "--late-option"], "/c", {},
                            "rescale_app.py", [])


@pytest.mark.parametrize("error", [errors.RescaleUnavailableError, errors.RescaleUnsupportedStateError,
                                   errors.RescaleUnsupportedOperatorError, errors.RescaleRefusedError,
                                   errors.RescaleFailedError])
def test_the_error_the_application_reports_is_raised_as_the_same_type(error):
    raised = reported_error(error("[STATE_REPARTITION_X] Spark's words", "what to do").to_dict())
    assert type(raised) is error and raised.message == "[STATE_REPARTITION_X] Spark's words" and raised.hint == "what to do"
    assert type(reported_error({"code": "not_ours", "message": "m"})) is errors.RescaleFailedError


def test_only_a_rescale_gets_the_jobs_rescaler(tmp_path):
    ctx = JobContext(_job(tmp_path), Store(str(tmp_path / "sp")))
    assert rescale_on_the_job(ctx, lambda c, conf: [], tmp_path, {"max_age": "1d"}) == {"max_age": "1d"}
    options = rescale_on_the_job(ctx, lambda c, conf: [], tmp_path, {"state_partitions": 4})
    assert options["state_partitions"] == 4 and isinstance(options["rescaler"], JobRescaler)


@pytest.mark.parametrize(("name", "error", "words"), [
    ("hdfs", errors.RescaleUnsupportedStateError, "HDFSBackedStateStoreProvider state"),
    ("rocksdb", errors.RescaleRefusedError, "no operator metadata"),
])
def test_an_unrescalable_live_state_is_refused_before_anything_stops(tmp_path, name, error, words):
    live = tmp_path / "live"
    shutil.copytree(DATA35 / name, live)
    before = sorted(p.relative_to(live) for p in live.rglob("*"))
    ctx = JobContext(_job(tmp_path), Store(str(tmp_path / "sp")))
    state = JobState(job="orders", state="running", run_id="r1", checkpoint=str(live))
    with pytest.raises(error) as raised:
        refuse_unrescalable(ctx, state, 4)
    assert words in raised.value.message and "refused before anything stopped: run r1 goes on" in raised.value.message
    assert raised.value.hint.endswith("nothing was stopped or restored")
    refuse_unrescalable(ctx, state, 2)  # its count already: nothing to refuse
    assert sorted(p.relative_to(live) for p in live.rglob("*")) == before and not (tmp_path / "sp").exists()


def test_a_standby_that_ends_before_it_is_ready_leaves_the_rescale_to_its_own_application_after_the_stop(tmp_path):
    """An upgrade's standby rescale application whose submit fails (here: a process that exits 3 at once) is not
    waited for: no standby is handed to the restore (the rescale is submitted after the stop, as a ``job start``
    does), the log says so and names the standby's log, and its folder is removed. Without a rescale, none starts."""
    import sys

    from airflow_savepoints.jobs.workflows.upgrade import UpgradeRequest, _rescale_standby

    job, lines = _job(tmp_path), []
    ctx = JobContext(job, Store(str(tmp_path / "sp")), log=lines.append)
    submit = lambda checkpoint, conf: [sys.executable, "-c", "import sys; sys.exit(3)", job.application,  # noqa: E731
                                       *(a.replace("{checkpoint}", checkpoint) for a in job.application_args)]
    request = UpgradeRequest(version=job.version(), state_partitions=3)
    assert _rescale_standby(ctx, request, "savepoint", lambda _: submit, tmp_path / "logs") is None
    assert "was not ready within" in lines[-1] and "runs as its own application after the stop" in lines[-1], lines
    assert str(tmp_path / "logs" / "orders-rescale-") in lines[-1]
    assert not [p for p in (tmp_path / "sp").rglob("*") if p.is_file()]  # nothing left in the job's folder
    assert _rescale_standby(ctx, request.model_copy(update={"state_partitions": None}), "savepoint", lambda _: submit,
                            tmp_path / "logs") is None and len(lines) == 1


@pytest.mark.parametrize("folder", ["_check", "_rescale"])
def test_a_check_or_rescale_folder_left_by_a_process_that_died_holds_the_autoscaler_only_for_a_while(tmp_path, folder):
    """An upgrade killed mid-way leaves its ``_check/<id>/`` or ``_rescale/<id>/`` (a standby's) folder: the
    autoscaler holds (``in_flight``) while such a folder may belong to a live check or rescale, and, once it is
    older than any of them lasts, no more: it is named in a warning (the job's next such work removes it a day on)."""
    from airflow_savepoints.jobs.description.channel import new_run_id, run_id_time
    from airflow_savepoints.jobs.workflows.autoscale import IN_FLIGHT_LIFETIME, _in_flight

    ctx = JobContext(_job(tmp_path), Store(str(tmp_path / "sp")))
    name = new_run_id()
    ctx.folder.child(folder).child(name).write_bytes_atomic("ready.json", b"{}")
    made, state, warnings = run_id_time(name).timestamp(), JobState(job="orders", state="running"), []
    what = "an upgrade check" if folder == "_check" else "a rescale"
    assert _in_flight(ctx, state, made + 60, warnings) == what and not warnings
    assert _in_flight(ctx, state, made + IN_FLIGHT_LIFETIME - 1, warnings) == what and not warnings
    assert _in_flight(ctx, state, made + IN_FLIGHT_LIFETIME + 1, warnings) is None
    assert len(warnings) == 1 and f"{folder}/{name}" in warnings[0] and "removes it" in warnings[0], warnings
    ctx.folder.child(folder).child("not-a-run-id").write_bytes_atomic("x", b"")  # a name with no time: in flight
    assert _in_flight(ctx, state, made + IN_FLIGHT_LIFETIME + 1, []) == what


def test_a_result_not_sealed_with_the_applications_secret_is_not_believed(tmp_path):
    """What a job's one-off application (a rescale, an inspection) reports is believed only when sealed with the
    secret its caller gave it: one written by anyone else (a writer of the savepoint folder) reads as no result."""
    import json

    from airflow_savepoints.jobs.description import trust
    from airflow_savepoints.jobs.workflows.rescale import app_secret_for, read_result

    job, forged = _job(tmp_path), []
    secret, conf, env = app_secret_for(job, "rescale")
    assert conf == {} and env == {trust.APP_SECRET_ENV: secret}  # a client-mode driver reads its environment
    assert app_secret_for(job.model_copy(update={"deploy_mode": "cluster"}), "rescale")[1].keys() == {trust.APP_SECRET_CONF}
    scratch = Store(str(tmp_path / "sp" / "orders" / "_rescale" / "x"))
    said = {"outcome": "rescaled", "partitions": {"0": 3}}
    scratch.write_bytes_atomic("result.json", json.dumps(trust.seal(said, trust.new_secret())).encode())
    assert read_result(scratch, secret, on_forged=forged.append) is None and forged == [scratch.url_of("result.json")]
    scratch.write_bytes_atomic("result.json", json.dumps(said).encode())
    assert read_result(scratch, secret) is None
    scratch.write_bytes_atomic("result.json", json.dumps(trust.seal(said, secret)).encode())
    assert read_result(scratch, secret) == said


def test_a_one_off_application_of_a_job_pinning_its_driver_pod_gets_a_pod_of_its_own(tmp_path):
    """Kubernetes refuses a second pod of a name in use: where a job pins ``spark.kubernetes.driver.pod.name``,
    its rescale, inspection and check runs are submitted with a pod name of their own (a DNS label: at most 63
    characters), one conf entry in the command; elsewhere nothing is added."""
    from airflow_savepoints.jobs.launch.runners import DRIVER_POD_CONF, own_driver_pod
    from airflow_savepoints.jobs.workflows.rescale import app_secret_for

    pinned = {**_job(tmp_path).spark_conf, DRIVER_POD_CONF: "orders-driver"}
    job = _job(tmp_path).model_copy(update={"master": "k8s://https://kube:6443", "deploy_mode": "cluster",
                                            "spark_conf": pinned})
    names = [app_secret_for(job, "rescale")[1][DRIVER_POD_CONF], app_secret_for(job, "inspect")[1][DRIVER_POD_CONF],
             own_driver_pod(job, "check")[DRIVER_POD_CONF]]
    assert [name.rsplit("-", 1)[0] for name in names] == ["orders-driver-rescale", "orders-driver-inspect",
                                                          "orders-driver-check"]
    assert len(set(names)) == 3 and "orders-driver" not in names
    command = application_command(job, lambda checkpoint, conf: spark_submit_command(job, checkpoint, conf), "/cp-1",
                                  app_secret_for(job, "rescale")[1], rescale_app.__file__, [])
    assert len([a for a in command if a.startswith(DRIVER_POD_CONF)]) == 1
    assert f"{DRIVER_POD_CONF}=orders-driver" not in command
    long = job.model_copy(update={"spark_conf": {DRIVER_POD_CONF: "a" * 70}})
    assert len(own_driver_pod(long, "rescale")[DRIVER_POD_CONF]) == 63
    assert own_driver_pod(job.model_copy(update={"spark_conf": {}}), "check") == {}  # spark-submit names each pod
    assert own_driver_pod(job.model_copy(update={"master": "spark://master:7077"}), "check") == {}


def test_a_standby_on_another_host_hears_its_upgrade_and_ends_when_it_falls_silent(tmp_path, monkeypatch):
    """A standby whose driver runs on another host (cluster mode) cannot watch its upgrade's process: the upgrade beats
    into the standby's folder (sealed ``owner.json``, a rising count) until it closes the standby, and the standby takes
    it for gone after ``silence`` s without a new beat; a beat sealed with another secret, or an old one written
    again, is no beat. On the upgrade's own host its process is watched."""
    import subprocess
    import sys

    from airflow_savepoints.core.names import RESCALE_OWNER_FILE
    from airflow_savepoints.jobs.description import trust
    from airflow_savepoints.jobs.description.files import process_started
    from airflow_savepoints.jobs.workflows.rescale import RescaleStandby

    monkeypatch.setattr(rescale_app, "OWNER_BEAT_INTERVAL", 0.05)
    job = _job(tmp_path).model_copy(update={"deploy_mode": "cluster"})
    ctx = JobContext(job, Store(str(tmp_path / "sp")))
    submit = lambda checkpoint, conf: [sys.executable, "-c", "import time; time.sleep(60)", job.application,  # noqa: E731
                                       *(a.replace("{checkpoint}", checkpoint) for a in job.application_args)]
    standby, forged = RescaleStandby.start(ctx, submit, tmp_path / "logs"), []
    try:
        watch = rescale_app.OwnerWatch("another-host:1:1.0", standby.folder, standby.secret, silence=0.6,
                                       check_every=0.05, on_forged=forged.append)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert not watch.gone()
            time.sleep(0.05)
        standby.beating.set()
        time.sleep(0.1)
        trust.write_sealed(standby.folder, RESCALE_OWNER_FILE, {"beat": 10**6}, trust.new_secret())
        silent = time.monotonic()
        while not watch.gone():
            assert time.monotonic() - silent < 3, "the standby still takes its silent upgrade for alive"
            time.sleep(0.05)
        assert time.monotonic() - silent >= 0.3 and set(forged) == {standby.folder.url_of(RESCALE_OWNER_FILE)}
        trust.write_sealed(standby.folder, RESCALE_OWNER_FILE, {"beat": 1}, standby.secret)  # an old beat again
        time.sleep(0.1)
        assert watch.gone()
    finally:
        standby.close(grace=1)
    assert not rescale_app.OwnerWatch(rescale_app.owner_of_this_process(), standby.folder, "s").gone()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_started(ended.pid)
    ended.wait()
    assert rescale_app.OwnerWatch(f"{__import__('socket').gethostname()}:{ended.pid}:{started}", standby.folder, "s").gone()


@pytest.mark.parametrize("kind", ["_check", "_rescale", "_inspect"])
def test_a_work_folder_left_over_for_a_day_is_removed_by_the_jobs_next_work_of_its_kind(tmp_path, kind):
    """A check, rescale or inspection killed mid-way leaves its folder (a check's holds a copy of the whole state):
    the job's next one of the same kind removes those made more than a day ago, names each in its log, and leaves
    younger ones (a live one: its timeouts are at most 4 hours), names that are no id and other kinds alone. A timeout
    above 4 hours is refused before anything is done."""
    from datetime import UTC, datetime, timedelta

    from airflow_savepoints.errors import InvalidInputError
    from airflow_savepoints.jobs.workflows.run import WORK_FOLDER_LIFETIME, refuse_long_work
    from airflow_savepoints.jobs.workflows.upgrade import UpgradeRequest

    lines: list[str] = []
    ctx = JobContext(_job(tmp_path), Store(str(tmp_path / "sp")), log=lines.append)
    now = datetime.now(UTC)
    old, young = (f"{now - timedelta(seconds=age):%Y%m%dT%H%M%S}-abcdef" for age in (WORK_FOLDER_LIFETIME + 60,
                                                                                    WORK_FOLDER_LIFETIME - 600))
    for folder in (f"{kind}/{old}", f"{kind}/{young}", f"{kind}/not-an-id", f"_other/{old}"):
        ctx.folder.child(folder).write_bytes_atomic("checkpoint/state/0/1.delta", b"x")
    made = ctx.work_folder(kind)
    assert made.parent().url == ctx.folder.child(kind).url and made.name not in (old, young)
    assert sorted(ctx.folder.listdir(kind)) == sorted([young, "not-an-id"]) and ctx.folder.child("_other").isdir(old)
    assert len(lines) == 1 and f"{kind}/{old}" in lines[0] and "removed" in lines[0], lines
    for timeout in (4 * 3600 + 1, 0, -1):
        with pytest.raises(InvalidInputError, match="at most 14400 s"):
            refuse_long_work(timeout, "the check")
    with pytest.raises(InvalidInputError, match="check_timeout"):
        UpgradeRequest(version=_job(tmp_path).version(), check_timeout=4 * 3600 + 1)
