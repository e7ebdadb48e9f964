"""What a run leaves in the job folder decides nothing dangerous (issue 29).

Each test forges or damages a run's files as a crash, an older release, a hand edit or anyone who
may write the savepoint folder could, then runs the real lifecycle (and CLI) over them: another
job's checkpoint is never deleted or copied, a process is signalled only when host, pid and its
start time match, control files are written only into the run's own control folder, damaged or
impossible files never wedge a command, secrets stay out of every file and answer, a savepoint of
another job needs a switch, and jobs.yaml refuses what would make two jobs share a location.
No Spark runs here: the checkpoints are the Spark 3.5 ones in tests/data.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.core import list_savepoints, take_savepoint
from airflow_savepoints.core.names import HEARTBEAT_FILE, RUN_FILE
from airflow_savepoints.errors import (
    ForeignSavepointError,
    InvalidInputError,
    JobFailedError,
    JobNotStoppedError,
    NoSavepointError,
    UntrustedRunFileError,
)
from airflow_savepoints.jobs import StreamingJob, load_jobs
from airflow_savepoints.jobs.description.channel import JobControl
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.jobs.launch.launcher import spark_submit_command
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.jobs.workflows.run import JobContext
from airflow_savepoints.storage import Store
from tests.conftest import ROOT, tree_snapshot

SPARK35 = ROOT / "tests" / "data" / "spark35" / "hdfs"  # a real checkpoint (6 committed batches)
HOST = socket.gethostname()


def put_tree(local: Path, url: str) -> None:
    """Copy a local folder to ``url`` (a folder on any store)."""
    store = Store(url)
    for path in local.rglob("*"):
        if path.is_file():
            store.write_bytes_atomic(path.relative_to(local).as_posix(), path.read_bytes())


def snapshot(url: str) -> dict[str, int]:
    """What a checkpoint holds (relative path -> size), on any store."""
    return {path: stat.size for path, stat in Store(url).list_files().items()}


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path) -> str:
    """The base URL the job folders and checkpoints live under: local disk, or the moto S3 server."""
    if request.param == "local":
        return str(tmp_path)
    bucket = request.getfixturevalue("s3")
    return f"s3://{bucket}/base"


def context(base: str, name: str = "orders", **fields) -> JobContext:
    job = StreamingJob.model_validate({"name": name, "application": "app.py", "checkpoint": f"{base}/{name}-checkpoint",
                                       "savepoint_dir": f"{base}/savepoints", "lease_timeout": 30, **fields})
    root = Store(job.savepoint_dir)
    return JobContext(job, root, root.options_for(job.checkpoint))


def forge_run(ctx: JobContext, **fields) -> None:
    """A ``_run.json`` as a hand edit (or anyone who may write the job folder) leaves it."""
    record = {"job": ctx.job.name, "checkpoint": ctx.job.checkpoint, "started_at": datetime.now(UTC).isoformat(),
              "run_id": "r1", "host": HOST, **fields}
    ctx.folder.write_bytes_atomic(RUN_FILE, json.dumps(record).encode())


@pytest.fixture
def sleeper():
    """An unrelated process on this host (its own session), that nothing may signal."""
    process = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


# --- 1. the checkpoint to delete, keep or copy is the job's own --------------------------------------
def test_a_run_record_naming_another_jobs_checkpoint_never_deletes_it(where):
    ctx = context(where)
    other = f"{where}/payments-checkpoint"
    put_tree(SPARK35, other)
    before = snapshot(other)
    forge_run(ctx, checkpoint=other)

    cancelled = lifecycle.cancel(ctx, policy="NEVER_RETAIN_AFTER_TERMINATION", grace=1)
    assert cancelled["action"] == "left as it is" and other.rstrip("/") in cancelled["warning"]
    assert snapshot(other) == before  # today: "deleted", 18 files gone


def test_another_jobs_checkpoint_is_not_copied_in_as_a_retained_checkpoint_nor_deleted_by_a_start(tmp_path):
    ctx = context(str(tmp_path))
    other = tmp_path / "payments-checkpoint"
    shutil.copytree(SPARK35, other)
    before = tree_snapshot(other)
    forge_run(ctx, checkpoint=str(other))
    cancelled = lifecycle.cancel(ctx, policy="RETAIN_ON_CANCELLATION", grace=1)
    assert cancelled["action"] == "left as it is" and list_savepoints(ctx.root, "orders") == []

    forge_run(ctx, checkpoint=str(other), run_id="r2")  # a run that failed (it is lost: nothing runs)
    job = ctx.job.model_copy(update={"checkpoint_retention": "NEVER_RETAIN_AFTER_TERMINATION"})
    failing = JobContext(job, ctx.root)
    with pytest.raises(JobFailedError):  # the new run exits at once: the start fails, after the failure handling
        lifecycle.start(failing, submit_command=lambda checkpoint, conf: ["sh", "-c", "exit 3"],
                        log_dir=tmp_path / "logs", fresh=True, wait_timeout=30)
    assert tree_snapshot(other) == before
    assert read_run(ctx.folder).run_id != "r2"  # the lost run was handled, its record replaced by the new run's


def test_a_stop_refuses_a_run_whose_files_name_another_checkpoint_before_it_stops_anything(tmp_path, sleeper):
    ctx = context(str(tmp_path))
    other = tmp_path / "payments-checkpoint"
    shutil.copytree(SPARK35, other)
    from airflow_savepoints.jobs.description.files import process_started

    forge_run(ctx, checkpoint=str(other), pid=sleeper.pid, pid_started=process_started(sleeper.pid))
    with pytest.raises(UntrustedRunFileError) as refused:
        lifecycle.stop(ctx, grace=1, inflight_wait=1)
    assert refused.value.code == "untrusted_run_file" and str(other) in refused.value.message
    assert sleeper.poll() is None and list_savepoints(ctx.root, "orders") == []


# --- 2. a process is signalled only when host, pid and its start time match ---------------------------
def test_a_pid_without_its_start_time_is_never_signalled(tmp_path, sleeper):
    ctx = context(str(tmp_path))
    forge_run(ctx, pid=sleeper.pid, pid_started=None)
    cancelled = lifecycle.cancel(ctx, grace=1)
    assert sleeper.poll() is None  # today: SIGTERM
    assert "never signalled" in cancelled["detail"]

    ctx.folder.remove_file(RUN_FILE)
    assert ctx.lease.acquire("r2", {"host": HOST, "pid": sleeper.pid, "timeout_s": 30}) is None  # the lease's facts
    with pytest.raises(JobNotStoppedError, match="never signalled"):
        lifecycle.stop(ctx, grace=1, inflight_wait=1)
    assert sleeper.poll() is None


def test_a_forged_pid_with_its_real_start_time_is_never_signalled_by_cancel_or_stop(tmp_path, sleeper):
    """Issue 40: anyone can read a pid's start time from /proc; only the run's token, which the
    launcher put in its driver's environment and no file holds, lets a pid be signalled."""
    from airflow_savepoints.jobs.description.files import process_started

    ctx = context(str(tmp_path))
    shutil.copytree(SPARK35, ctx.job.checkpoint)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(json.dumps({"jobs": [ctx.job.model_dump(exclude_none=True)]}))
    forge_run(ctx, pid=sleeper.pid, pid_started=process_started(sleeper.pid))
    with pytest.raises(JobNotStoppedError, match="not a driver this tool started") as refused:
        lifecycle.cancel(ctx, grace=1)  # today: SIGTERM to the sleeper, "cancelled"
    assert "stop the driver yourself" in refused.value.message and sleeper.poll() is None
    result = CliRunner().invoke(cli_app, ["job", "cancel", "orders", "--grace", "1", "--jobs-file", str(jobs), "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["error"]["code"] == "job_not_stopped", result.stdout
    assert sleeper.poll() is None

    ctx.folder.remove_file(RUN_FILE)  # the lease's facts, as a driver started by another tool writes them
    assert ctx.lease.acquire("r2", {"host": HOST, "pid": sleeper.pid, "pid_started": process_started(sleeper.pid),
                                    "timeout_s": 30, "checkpoint": ctx.job.checkpoint}) is None
    with pytest.raises(JobNotStoppedError, match="not a driver this tool started"):
        lifecycle.stop(ctx, grace=1, inflight_wait=1)  # today: SIGTERM, then a stop savepoint
    result = CliRunner().invoke(cli_app, ["job", "stop", "orders", "--grace", "1", "--jobs-file", str(jobs), "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["error"]["code"] == "job_not_stopped", result.stdout
    assert sleeper.poll() is None and list_savepoints(ctx.root, "orders") == []


class Listener:
    """A local HTTP server that counts the requests it gets; ``apps`` is what its ``/json/`` lists (a
    standalone master's web UI)."""

    def __init__(self, apps: list[dict] | None = None) -> None:
        import http.server
        import threading

        self.requests: list[tuple[str, str]] = []
        self.apps = apps or []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                listener.requests.append((self.command, self.path))
                body = json.dumps({"activeapps": listener.apps, "completedapps": []}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def test_run_files_naming_a_master_and_web_ui_make_no_request_from_status_cancel_or_the_console(tmp_path, listener):
    """Issue 40: the runner's addresses are jobs.yaml's (here: a local master); a ``_run.json`` and a
    lease naming a standalone master and web UI send nothing there."""
    from airflow_savepoints.plugins.console import overview

    ctx = context(str(tmp_path))
    shutil.copytree(SPARK35, ctx.job.checkpoint)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(json.dumps({"jobs": [ctx.job.model_dump(exclude_none=True)]}))
    named = {"master": f"spark://127.0.0.1:{listener.url.rsplit(':', 1)[1]}", "master_ui": listener.url,
             "application_id": "app-20260101000000-0001"}
    cli = ["--jobs-file", str(jobs), "--json"]
    for where in ("record", "lease"):
        if where == "record":
            forge_run(ctx, host="worker-a", **named)
        else:
            ctx.folder.remove_file(RUN_FILE)
            assert ctx.lease.acquire("r2", {"host": "worker-a", "timeout_s": 30, **named}) is None
        state = lifecycle.status(ctx)
        answers = [CliRunner().invoke(cli_app, ["job", "status", "orders", *cli]),
                   CliRunner().invoke(cli_app, ["status", "--job", "orders", "--dir", ctx.root.url, "--json"])]
        summary = overview(ctx.root, interval_s=60, jobs_file=str(jobs))  # what the console's API serves
        assert [row["job"] for row in summary["jobs"]] == ["orders"], summary
        summary = overview(ctx.root, interval_s=60, jobs_file=None)  # a job folder the jobs file does not declare
        answers.append(CliRunner().invoke(cli_app, ["job", "cancel", "orders", "--grace", "1", *cli]))
        assert all(answer.exit_code in (0, 1) and answer.stdout.startswith("{") for answer in answers), answers
        assert listener.requests == [], (where, listener.requests)  # today: GET /json/ and POST /app/kill/
        assert state.runner == "local", state


def test_a_standalone_kill_only_of_an_application_the_master_names_after_the_job(tmp_path, listener):
    """Issue 40: the master is jobs.yaml's; the application id a run file names is killed only when
    the master's ``/json/`` lists it under the job's name (spark-submit ``--name <job>``)."""
    port = listener.url.rsplit(":", 1)[1]
    ctx = context(str(tmp_path), master=f"spark://127.0.0.1:{port}", master_ui=listener.url)
    forge_run(ctx, host="worker-a", application_id="app-20260101000000-0007", master=ctx.job.master,
              master_ui=listener.url)  # as a start of this job records it, with another application's id
    listener.apps = [{"id": "app-20260101000000-0007", "name": "payments", "state": "RUNNING"}]
    with pytest.raises(JobNotStoppedError, match="is not job 'orders''s") as refused:
        lifecycle.cancel(ctx, grace=1)  # today: POST /app/kill/ of payments' application, "killed"
    assert "named 'payments'" in refused.value.message
    assert [method for method, _ in listener.requests] == ["GET", "GET"]  # its status, then the kill's look
    listener.apps = [{"id": "app-20260101000000-0007", "name": "orders", "state": "RUNNING"}]
    lifecycle.cancel(ctx, grace=0)
    assert ("POST", "/app/kill/") in listener.requests  # the job's own application is killed


def test_a_run_record_chooses_no_file_whose_lines_status_shows(tmp_path):
    """A failed run's status shows the tail of its driver's log; a ``log_file`` in ``_run.json`` that
    is not a log this tool names, or a link, shows nothing (it read any file the record named)."""
    ctx = context(str(tmp_path))
    secret = tmp_path / "private.key"
    secret.write_text("PRIVATE-KEY-LINE\n")
    linked = tmp_path / "logs" / "orders-20260101T000000.log"
    linked.parent.mkdir()
    linked.symlink_to(secret)
    real = tmp_path / "logs" / "orders-20260101T000001.log"
    real.write_text("the driver's last words\n")
    ended = subprocess.Popen(["true"])
    ended.wait()
    for log_file, shown in ((secret, None), (linked, None), (real, "the driver's last words")):
        forge_run(ctx, pid=ended.pid, pid_started=time.time() - 60, log_file=str(log_file))
        state = lifecycle.status(ctx)
        assert state.state == "failed" and state.detail == shown, state  # today: PRIVATE-KEY-LINE, twice
        assert "PRIVATE-KEY-LINE" not in state.model_dump_json()


# --- 3. control files go only into <job folder>/_control/<run id> -------------------------------------
def test_a_control_folder_named_in_the_lease_is_never_written(where):
    ctx = context(where)
    put_tree(SPARK35, ctx.job.checkpoint)
    outside = Store(f"{where}/outside")
    other_run = Store(f"{where}/savepoints/payments/_control/p1")
    for index, folder in enumerate([outside, other_run]):
        folder.write_bytes_atomic(HEARTBEAT_FILE, json.dumps({"state": "running", "timeout_s": 30}).encode())
        run_id = f"r{index}"
        assert ctx.lease.acquire(run_id, {"host": "worker-a", "control": folder.url, "timeout_s": 1.5,
                                          "checkpoint": ctx.job.checkpoint}) is None
        state = lifecycle.status(ctx)
        assert state.control == ctx.folder.url_of(f"_control/{run_id}")
        assert any(folder.url in warning for warning in state.warnings)
        time.sleep(3)  # the forged run's lease lapses (it never renews it): a stop goes on
        stopped = lifecycle.stop(ctx, grace=1, inflight_wait=1)
        assert stopped["stop_method"] == "lease_lapsed" and stopped["batch_id"] >= 0
        assert not folder.exists("stop-request.json")  # today: written outside the root, and into payments' run


def test_a_forged_heartbeat_or_stop_acknowledgement_is_not_believed(where):
    """Issue 40: a run's control files count only when sealed with its channel secret (derived from
    the run key, never written): forged ones are absent, with a warning."""
    ctx = context(where)
    put_tree(SPARK35, ctx.job.checkpoint)
    assert ctx.lease.acquire("r1", {"host": "worker-a", "timeout_s": 30, "checkpoint": ctx.job.checkpoint}) is None
    control = JobControl(ctx.folder.child("_control/r1"))
    control.beat(state="running", timeout_s=30, last_committed_batch=5)  # the run's own driver
    assert lifecycle.status(ctx).state == "running"
    forged = ctx.folder.child("_control/r1")
    forged.write_bytes_atomic("stopped.json", json.dumps({"request_id": "stop-1", "stopped_at": "now"}).encode())
    state = lifecycle.status(ctx)
    assert state.state == "running", state  # today: stopped ("it acknowledged a stop request")
    assert any("stopped.json" in w and "not sealed" in w for w in state.warnings), state.warnings
    forged.write_bytes_atomic(HEARTBEAT_FILE, json.dumps({"state": "running", "timeout_s": 30,
                                                          "last_committed_batch": 999999}).encode())
    state = lifecycle.status(ctx)  # the lease still holds: starting, with no heartbeat believed
    assert state.state == "starting" and state.last_batch != 999999 and not state.helper, state  # today: running
    assert any(HEARTBEAT_FILE in w and "not sealed" in w for w in state.warnings), state.warnings
    other = JobControl(ctx.folder.child("_control/r2"))
    other.beat(state="stopped")  # sealed, but for another run: copied over, it is still foreign
    forged.write_bytes_atomic(HEARTBEAT_FILE, other.folder.read_bytes(HEARTBEAT_FILE))
    assert lifecycle.status(ctx).state == "starting"
    assert control.wait_until_stopped("stop-1", timeout=0) is None  # a stop waits for the run's own answer


# --- 4./5. damaged or impossible files never wedge a command ------------------------------------------
def test_damaged_run_files_are_ignored_with_a_warning_and_every_command_answers(tmp_path):
    ctx = context(str(tmp_path))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(json.dumps({"jobs": [ctx.job.model_dump(exclude_none=True)]}))
    assert ctx.lease.acquire("r1", {"host": "worker-a", "timeout_s": 30}) is None
    control = ctx.folder.child("_control/r1")
    JobControl(control).beat(state="running", timeout_s="abc", last_committed_batch="x")  # sealed, as the driver does
    state = lifecycle.status(ctx)
    assert state.state == "running" and state.last_batch is None
    assert any(HEARTBEAT_FILE in w and "timeout_s" in w for w in state.warnings)

    ctx.lease.release("r1")
    ctx.folder.write_bytes_atomic(RUN_FILE, b'["not", "a", "run"]')
    shutil.rmtree(tmp_path / "savepoints" / "orders" / "_control")
    state = lifecycle.status(ctx)
    assert state.state == "not_started" and any(RUN_FILE in w for w in state.warnings)
    forge_run(ctx, pid="many", started_at="yesterday")
    assert lifecycle.status(ctx).state == "not_started"  # a record with no usable start time is none
    forge_run(ctx, pid="many", pid_started="early")
    state = lifecycle.status(ctx)
    assert state.state == "lost" and state.pid is None and any("pid" in w for w in state.warnings)

    for command in (["status"], ["cancel", "--grace", "1"]):
        result = CliRunner().invoke(cli_app, ["job", *command, "orders", "--jobs-file", str(jobs), "--json"])
        assert result.exit_code == 0, result.stdout  # today: unexpected_error


def test_a_lease_with_no_live_holder_past_its_timeout_and_a_heartbeat_dated_ahead_are_lapsed(tmp_path):
    ctx = context(str(tmp_path))
    assert ctx.lease.acquire("r1", {"host": "worker-a", "timeout_s": 30}) is None  # a start killed in its restore
    day_ago = time.time() - 86400
    os.utime(Path(ctx.folder.path_of("_lease.json")), (day_ago, day_ago))
    state = lifecycle.status(ctx)
    assert state.state == "lost" and "lapsed" in state.detail  # today: unknown, for ever
    cancelled = lifecycle.cancel(ctx, grace=1)  # today: job_not_stopped
    assert cancelled["stop_method"] in ("lease_lapsed", "not_running") and lifecycle.status(ctx).state == "stopped"

    ctx.folder.remove_file(RUN_FILE)
    assert ctx.lease.acquire("r2", {"host": "worker-a", "timeout_s": 30}) is None
    control = ctx.folder.child("_control/r2")
    JobControl(control).beat(state="running", timeout_s=30)
    day_ahead = time.time() + 86400
    os.utime(Path(control.path_of(HEARTBEAT_FILE)), (day_ahead, day_ahead))
    state = lifecycle.status(ctx)
    assert state.state == "lost" and "ahead" in state.detail  # today: running, for ever
    assert any(HEARTBEAT_FILE in w and "ahead" in w for w in state.warnings)

    ctx.lease.release("r2")
    assert ctx.lease.acquire("r3", {"host": "worker-a", "timeout_s": 30}) is None
    os.utime(Path(ctx.folder.path_of("_lease.json")), (day_ahead, day_ahead))  # a lease dated ahead, too
    assert lifecycle.status(ctx).state == "lost"
    with pytest.raises(JobFailedError, match="exited before committing"):  # a start takes it over and launches
        lifecycle.start(ctx, submit_command=lambda checkpoint, conf: ["sh", "-c", "exit 3"], log_dir=tmp_path / "logs",
                        fresh=True, wait_timeout=30)
    assert read_run(ctx.folder).run_id not in ("r2", "r3")


# --- 6. secrets --------------------------------------------------------------------------------------
def test_secrets_of_the_spark_conf_never_reach_a_file_or_an_answer_and_spark_still_gets_them(tmp_path, monkeypatch):
    monkeypatch.setenv("RS_S3_SECRET", "s3-secret-value-1234")
    monkeypatch.setenv("RS_ENDPOINT_TOKEN", "endpoint-from-env-5678")
    checkpoint = tmp_path / "orders-checkpoint"
    shutil.copytree(SPARK35, checkpoint)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"""
jobs:
  - name: orders
    application: app.py
    checkpoint: {checkpoint}
    savepoint_dir: {tmp_path}/savepoints
    spark_conf:
      spark.hadoop.fs.s3a.secret.key: "${{RS_S3_SECRET}}"
      spark.custom.endpoint: "${{RS_ENDPOINT_TOKEN}}"
      spark.db.password: "plain-password-9999"
      spark.sql.shuffle.partitions: "2"
""")
    secrets = ("s3-secret-value-1234", "endpoint-from-env-5678", "plain-password-9999")
    job = load_jobs(jobs)["orders"]
    ctx = JobContext(job, Store(job.savepoint_dir))
    command = spark_submit_command(job, str(checkpoint), {})
    assert all(any(secret in arg for arg in command) for secret in secrets)  # what Spark is given: the real values

    argv_file = tmp_path / "argv"
    recorder = [sys.executable, "-c", "import sys, time; open(sys.argv[1], 'w').write(repr(sys.argv)); time.sleep(120)",
                str(argv_file)]
    with pytest.raises(JobFailedError, match="committed no batch"):  # it is no Spark job: it never commits
        lifecycle.resume(ctx, str(checkpoint), log_dir=tmp_path / "logs", wait_timeout=3,
                         submit_command=lambda cp, conf: recorder + spark_submit_command(job, cp, conf)[1:])
    deadline = time.monotonic() + 30
    while not argv_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(secret in argv_file.read_text() for secret in secrets)  # the process got them
    answers = [lifecycle.status(ctx).model_dump_json()]
    stopped = lifecycle.stop(ctx, grace=5, inflight_wait=1)
    answers.append(json.dumps(stopped))
    result = CliRunner().invoke(cli_app, ["job", "status", "orders", "--jobs-file", str(jobs), "--json"])
    assert result.exit_code == 0
    answers.append(result.stdout)
    written = [path.read_text(errors="replace") for path in (tmp_path / "savepoints").rglob("*") if path.is_file()]
    assert any("spark.custom.endpoint" in text for text in written)  # the version is recorded, redacted
    for text in answers + written:
        assert not any(secret in text for secret in secrets)
    assert stopped["version"]["spark_conf"]["spark.custom.endpoint"] == "***"


# --- 7. a savepoint of another job needs the switch ---------------------------------------------------
def test_a_start_from_another_jobs_or_another_roots_savepoint_needs_the_switch(tmp_path):
    ctx = context(str(tmp_path))
    theirs = take_savepoint(str(SPARK35), "payments", savepoint_dir=str(tmp_path / "savepoints"))
    elsewhere = take_savepoint(str(SPARK35), "orders", savepoint_dir=str(tmp_path / "other-root"))

    def never(*_):
        raise AssertionError("a refused start launches nothing")

    for info in (theirs, elsewhere):
        with pytest.raises(ForeignSavepointError) as refused:
            lifecycle.start(ctx, submit_command=never, log_dir=tmp_path / "logs", pointer=info.pointer)
        assert refused.value.code == "foreign_savepoint" and "--from-other-job" in refused.value.hint
    assert not list(tmp_path.glob("orders-checkpoint*")) and ctx.lease.holder() is None

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(json.dumps({"jobs": [ctx.job.model_dump(exclude_none=True)]}))
    args = ["job", "start", "orders", "--from", theirs.pointer, "--jobs-file", str(jobs), "--json"]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 1 and json.loads(result.stdout)["error"]["code"] == "foreign_savepoint"
    result = CliRunner().invoke(cli_app, [*args, "--from-other-job", "--to", str(tmp_path / "elsewhere")])
    error = json.loads(result.stdout)["error"]  # past the switch, the target is refused: not the job's checkpoint
    assert error["code"] == "invalid_input" and "elsewhere" in error["message"]

    with pytest.raises(JobFailedError, match="exited before committing"):  # with the switch: restored, then launched
        lifecycle.start(ctx, submit_command=lambda checkpoint, conf: ["sh", "-c", "exit 3"], log_dir=tmp_path / "logs",
                        pointer=theirs.pointer, allow_foreign_savepoint=True, wait_timeout=30)
    assert len(list(tmp_path.glob("orders-checkpoint-*"))) == 1


# --- 8. jobs.yaml ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "named"), [
    ("- name: orders\n  application: a.py\n  checkpoint: {tmp}/c\n  checkpoint: {tmp}/d\n", ("'orders'", "'checkpoint'")),
    ("- name: orders\n  application: a.py\n  checkpoint: {tmp}/c\n  spark_conf:\n    x: '1'\n    x: '2'\n",
     ("'orders'", "'spark_conf.x'")),
    ("- name: orders\n  application: a.py\n  checkpoint: {tmp}/c\n  savepoint_dir: /\n", ("'orders'", "savepoint_dir")),
    ("- name: orders\n  application: a.py\n  checkpoint: {tmp}/sp/c\n  savepoint_dir: {tmp}/sp\n", ("'orders'", "overlap")),
    ("- name: orders\n  application: a.py\n  checkpoint: {tmp}/c\n- name: payments\n  application: a.py\n"
     "  checkpoint: {tmp}/c/\n", ("'orders'", "'payments'")),
    ("- name: orders\n  application: a.py\n  checkpoint: {tmp}/c\n- name: payments\n  application: a.py\n"
     "  checkpoint: {tmp}/c-payments\n", ("'orders'", "'payments'")),
])
def test_jobs_yaml_refuses_what_would_make_locations_shared(tmp_path, text, named):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n" + text.replace("{tmp}", str(tmp_path)))
    with pytest.raises(InvalidInputError) as refused:
        load_jobs(jobs)
    assert all(word in refused.value.message for word in named), refused.value.message


def test_a_fresh_start_refuses_a_checkpoint_inside_the_savepoint_folder(tmp_path):
    job = StreamingJob(name="orders", application="a.py", checkpoint=str(tmp_path / "sp" / "orders-ckpt"))
    ctx = JobContext(job, Store(str(tmp_path / "sp")))  # savepoint_dir from --dir or the configuration

    def never(*_):
        raise AssertionError("a refused start launches nothing")

    with pytest.raises(InvalidInputError, match="overlap"):
        lifecycle.start(ctx, submit_command=never, log_dir=tmp_path / "logs", fresh=True)


def test_a_start_refused_for_want_of_a_savepoint_leaves_no_folder_behind(tmp_path):
    """The run's lease makes the job's folder (and the savepoint root) on a local disk: a start refused after it
    removes what it made, and only that (a root that was there, with another job's folder, stays)."""
    job = StreamingJob(name="orders", application="a.py", checkpoint=str(tmp_path / "orders-ckpt"))

    def never(*_):
        raise AssertionError("a refused start launches nothing")

    for existing in ((), ("payments",)):
        root = tmp_path / f"sp{len(existing)}"
        for other in existing:
            (root / other).mkdir(parents=True)
        with pytest.raises(NoSavepointError, match="no completed savepoint"):
            lifecycle.start(JobContext(job, Store(str(root))), submit_command=never, log_dir=tmp_path / "logs")
        assert (sorted(p.name for p in root.iterdir()) if root.exists() else None) == (list(existing) or None)


def test_the_api_redacts_the_secret_conf_of_a_manifest_an_older_release_wrote(tmp_path):
    from airflow_savepoints.core.pointer import read_manifest
    from airflow_savepoints.plugins.api import Scrubber

    clear = {"application": "app.py", "application_args": [], "hash": "0123456789ab",
             "spark_conf": {"spark.hadoop.fs.s3a.secret.key": "old-clear-secret-42", "spark.sql.shuffle.partitions": "2"}}
    info = take_savepoint(str(SPARK35), "orders", savepoint_dir=str(tmp_path), job_version=clear)
    served = json.dumps(Scrubber()(read_manifest(Store(info.pointer)).model_dump(mode="json")))
    assert "old-clear-secret-42" not in served and '"spark.sql.shuffle.partitions": "2"' in served
