"""The ``airflow-savepoints`` CLI on real checkpoints: the happy path and every documented error.

Each error case checks the message, the exit status, and that nothing changed on disk.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from tests.conftest import ROOT, planned_state_files, tree_snapshot

runner = CliRunner()


def cli(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, [*args, "--json"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {result.exit_code}): {result.stdout!r} {result.stderr!r}") from None


def test_trigger_list_show_verify_restore_dispose(checkpoint, tmp_path):
    sp_dir = tmp_path / "savepoints"
    code, taken = cli("trigger", str(checkpoint), "--job", "orders", "--dir", str(sp_dir), "--type", "periodic",
                      "--reason", "nightly")
    assert code == 0, taken
    assert taken["batch_id"] == 5 and taken["type"] == "periodic" and taken["reason"] == "nightly"
    assert taken["files"] > 5 and taken["bytes"] > 0
    assert json.loads((checkpoint / "metadata").read_text())["id"] == taken["query_id"]
    pointer = Path(taken["pointer"])
    assert pointer.parent == sp_dir / "orders"
    assert pointer.name.startswith(f"savepoint-{taken['query_id'][:6]}-")
    manifest = json.loads((pointer / "_metadata").read_text())
    on_disk = sorted(str(p.relative_to(pointer)) for p in pointer.rglob("*") if p.is_file() and p.name != "_metadata")
    assert sorted(f["path"] for f in manifest["files"]) == on_disk

    code, listed = cli("list", "--job", "orders", "--dir", str(sp_dir))
    assert code == 0 and [s["pointer"] for s in listed["savepoints"]] == [str(pointer)]
    code, shown = cli("show", str(pointer / "_metadata"))
    assert code == 0 and shown["manifest"]["batch_id"] == 5 and shown["pointer"] == str(pointer)
    code, verified = cli("verify", str(pointer))
    assert code == 0 and verified["ok"] is True

    before = tree_snapshot(pointer)
    code, restored = cli("restore", str(pointer), "--to", str(tmp_path / "restored"))
    assert code == 0, restored
    assert restored["batch_id"] == 5 and restored["query_id"] == taken["query_id"]
    assert tree_snapshot(pointer) == before  # restore never modifies the savepoint
    assert json.loads((tmp_path / "restored" / "metadata").read_text())["id"] == taken["query_id"]

    code, again = cli("restore", str(pointer), "--to", str(tmp_path / "restored"))
    assert code == 1 and again["error"]["code"] == "target_not_empty"

    code, forked = cli("restore", str(pointer), "--to", str(tmp_path / "fork"), "--new-query-id")
    assert code == 0 and forked["query_id"] != taken["query_id"]

    code, disposed = cli("dispose", str(pointer), "--dir", str(sp_dir))
    assert code == 0 and disposed["disposed"] == str(pointer) and not pointer.exists()
    code, listed = cli("list", "--job", "orders", "--dir", str(sp_dir))
    assert listed["savepoints"] == []


def test_human_output_and_console_script(checkpoint, tmp_path):
    sp_dir = tmp_path / "sp"
    result = runner.invoke(app, ["trigger", str(checkpoint), "--job", "orders", "--dir", str(sp_dir)])
    assert result.exit_code == 0 and "savepoint completed" in result.stdout
    result = runner.invoke(app, ["list", "--job", "orders", "--dir", str(sp_dir)])
    assert result.exit_code == 0 and "manual" in result.stdout and "savepoint-" in result.stdout


def test_list_fits_an_80_column_terminal(checkpoint, tmp_path, monkeypatch):
    from rich.console import Console

    import airflow_savepoints.cli.main as main

    sp_dir = tmp_path / "sp"
    reason = "before the upgrade of the fraud model to version 7, asked by the on-call engineer"
    runner.invoke(app, ["trigger", str(checkpoint), "--job", "orders", "--dir", str(sp_dir), "--reason", reason])
    code, listed = cli("list", "--job", "orders", "--dir", str(sp_dir))
    taken = listed["savepoints"][0]
    assert taken["reason"] == reason  # whole in --json
    monkeypatch.setattr(main, "out", Console(width=80, highlight=False))
    result = runner.invoke(app, ["list", "--job", "orders", "--dir", str(sp_dir)])
    lines = result.stdout.splitlines()
    assert result.exit_code == 0 and max(len(line) for line in lines) <= 80, result.stdout
    row = next(line for line in lines if taken["savepoint_id"].removeprefix("savepoint-") in line)  # on one line
    assert "manual" in row and "completed" in row and f"{taken['batch_id']}" in row and "before the" in row
    script = Path(sys.executable).parent / "airflow-savepoints"
    proc = subprocess.run([str(script), "show", str(tmp_path / "nowhere")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert "no savepoint at" in proc.stderr and "how to fix" in proc.stderr


@pytest.fixture
def uncommitted_checkpoint(tmp_path) -> Path:
    """A checkpoint whose first batch was planned (offsets/0) but never committed."""
    path = tmp_path / "uncommitted"
    (path / "offsets").mkdir(parents=True)
    (path / "metadata").write_text('{"id":"5d5a3b9c-7a3e-4ad1-9c1e-000000000000"}')
    (path / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n{"logOffset":0}')
    return path


BAD_TRIGGERS = [
    # (case id, arguments after "trigger", expected error code, expected words)
    ("missing-path", ["{tmp}/does-not-exist", "--job", "j", "--dir", "{sp}"], "checkpoint_not_found", "does not exist"),
    ("relative-path", ["relative/checkpoint", "--job", "j", "--dir", "{sp}"], "invalid_path", "relative path"),
    ("not-a-checkpoint", ["{notckpt}", "--job", "j", "--dir", "{sp}"], "not_a_checkpoint", "not a Spark streaming"),
    ("no-committed-batch", ["{uncommitted}", "--job", "j", "--dir", "{sp}"], "no_committed_batch", "no committed"),
    ("unknown-scheme", ["foo://bucket/ckpt", "--job", "j", "--dir", "{sp}"], "unknown_scheme", "unknown URL scheme"),
    ("unknown-scheme-dir", ["{ckpt}", "--job", "j", "--dir", "bogus://x/y"], "unknown_scheme", "unknown URL scheme"),
    ("missing-backend", ["{ckpt}", "--job", "j", "--dir", "gs://bucket/sp"], "missing_backend", "gcsfs"),
    ("job-with-slash", ["{ckpt}", "--job", "a/b", "--dir", "{sp}"], "invalid_job_name", "invalid job name"),
    ("job-dotdot", ["{ckpt}", "--job", "..", "--dir", "{sp}"], "invalid_job_name", "invalid job name"),
    ("job-empty", ["{ckpt}", "--job", "", "--dir", "{sp}"], "invalid_job_name", "invalid job name"),
    ("no-dir-configured", ["{ckpt}", "--job", "j"], "no_savepoint_dir", "no savepoint directory"),
    ("dir-inside-checkpoint", ["{ckpt}", "--job", "j", "--dir", "{ckpt}/sp"], "invalid_input", "overlap"),
]


@pytest.mark.usefixtures("without_cloud_backends")  # the missing-backend case
@pytest.mark.parametrize("case,args,code,words", BAD_TRIGGERS, ids=[c[0] for c in BAD_TRIGGERS])
def test_bad_trigger_input_fails_clearly_and_changes_nothing(case, args, code, words, checkpoint,
                                                            uncommitted_checkpoint, tmp_path):
    not_checkpoint = tmp_path / "photos"
    not_checkpoint.mkdir()
    (not_checkpoint / "cat.jpg").write_bytes(b"\xff\xd8")
    sp = tmp_path / "sp"
    values = {"tmp": tmp_path, "sp": sp, "notckpt": not_checkpoint, "uncommitted": uncommitted_checkpoint,
              "ckpt": checkpoint}
    before = tree_snapshot(tmp_path)
    exit_code, out = cli("trigger", *[a.format(**values) for a in args])
    assert exit_code == 1, out
    assert out["error"]["code"] == code
    assert words in out["error"]["message"] + (out["error"]["hint"] or "")
    assert out["error"]["hint"], "every error says how to fix it"
    assert tree_snapshot(tmp_path) == before
    assert not sp.exists()


@pytest.mark.usefixtures("without_cloud_backends")  # abfs:// without adlfs
def test_pointer_errors_each_have_their_own_message(checkpoint, tmp_path):
    sp = tmp_path / "sp"
    code, taken = cli("trigger", str(checkpoint), "--job", "j", "--dir", str(sp))
    good = Path(taken["pointer"])
    cases = {}

    def variant(name: str, manifest: bytes | None) -> Path:
        target = sp / "j" / f"savepoint-{name[:6]}-0000000000{len(cases):02d}"
        shutil.copytree(good, target)
        if manifest is None:
            (target / "_metadata").unlink()
        else:
            (target / "_metadata").write_bytes(manifest)
        cases[name] = target
        return target

    original = json.loads((good / "_metadata").read_text())
    variant("incomplete", None)
    variant("corrupt", b'{"format": "airflow-savepoints/savepoint", "format_ver')
    variant("foreign", json.dumps({"format": "something-else", "format_version": 1}).encode())
    variant("future", json.dumps({**original, "format_version": 99}).encode())
    variant("invalid", json.dumps({**original, "batch_id": -4}).encode())
    unreadable = variant("unreadable", b"{}")
    (unreadable / "_metadata").unlink()
    (unreadable / "_metadata").mkdir()  # a folder where the file should be: cannot be read as a file
    expected = {
        "incomplete": ("incomplete_savepoint", "has no _metadata"),
        "corrupt": ("manifest_corrupt", "not valid JSON"),
        "foreign": ("manifest_corrupt", "not an airflow-savepoints manifest"),
        "future": ("manifest_version_unsupported", "format version 99, newer than this release"),
        "invalid": ("manifest_corrupt", "batch_id"),
        "unreadable": ("not_a_regular_file", "_metadata is a folder, not a regular file"),  # issue 40: its own code
    }
    before = tree_snapshot(sp)
    for name, (err_code, words) in expected.items():
        for command in ("show", "verify"):
            code, out = cli(command, str(cases[name]))
            assert code == 1 and out["error"]["code"] == err_code, (name, out)
            assert words in out["error"]["message"], (name, out)
        code, out = cli("restore", str(cases[name]), "--to", str(tmp_path / f"r-{name}"))
        assert code == 1 and out["error"]["code"] == err_code
        assert not (tmp_path / f"r-{name}").exists()
    code, out = cli("show", str(tmp_path / "missing"))
    assert out["error"]["code"] == "savepoint_not_found" and "nothing exists there" in out["error"]["message"]
    code, out = cli("show", str(good / "offsets" / "5"))
    assert out["error"]["code"] == "savepoint_not_found" and "is a file" in out["error"]["message"]
    code, out = cli("show", "nope://bucket/sp")
    assert out["error"]["code"] == "unknown_scheme"
    code, out = cli("show", "abfs://container/sp")
    assert out["error"]["code"] == "missing_backend" and "adlfs" in out["error"]["hint"]
    code, out = cli("list", "--job", "j", "--dir", str(sp))
    assert [s["pointer"] for s in out["savepoints"]] == [str(good)]  # none of the broken ones is listed
    assert tree_snapshot(sp) == before


@pytest.mark.s3
def test_missing_credentials_for_s3(s3, monkeypatch, checkpoint, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    import fsspec

    fsspec.get_filesystem_class("s3").clear_instance_cache()
    code, out = cli("show", f"s3://{s3}/sp/j/savepoint-abc123-000000000000")
    assert code == 1 and out["error"]["code"] == "missing_credentials"
    assert "AWS_ACCESS_KEY_ID" in out["error"]["hint"]
    before = tree_snapshot(checkpoint)
    code, out = cli("trigger", str(checkpoint), "--job", "j", "--dir", f"s3://{s3}/sp")
    assert code == 1 and out["error"]["code"] == "missing_credentials"
    assert tree_snapshot(checkpoint) == before


def test_default_dir_from_environment_and_explicit_dir_wins(checkpoint, tmp_path, monkeypatch):
    configured, explicit = tmp_path / "configured", tmp_path / "explicit"
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR", str(configured))
    code, a = cli("trigger", str(checkpoint), "--job", "j")
    code, b = cli("trigger", str(checkpoint), "--job", "j", "--dir", str(explicit))
    assert Path(a["pointer"]).parent == configured / "j"
    assert Path(b["pointer"]).parent == explicit / "j"
    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR")
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text(f"[savepoints]\nsavepoint_dir = {tmp_path / 'from-cfg'}\n")
    monkeypatch.setenv("AIRFLOW_CONFIG", str(cfg))
    code, c = cli("trigger", str(checkpoint), "--job", "j")
    assert code == 0 and Path(c["pointer"]).parent == tmp_path / "from-cfg" / "j"


def test_sink_ahead_is_refused(checkpoint, tmp_path):
    code, taken = cli("trigger", str(checkpoint), "--job", "j", "--dir", str(tmp_path / "sp"))
    sink = tmp_path / "out"
    (sink / "_spark_metadata").mkdir(parents=True)
    for b in range(9):
        (sink / "_spark_metadata" / str(b)).write_text("v1\n")
    code, out = cli("restore", taken["pointer"], "--to", str(tmp_path / "r"), "--sink-path", str(sink))
    assert code == 1 and out["error"]["code"] == "sink_ahead"
    assert "already holds batch 8" in out["error"]["message"] and "new output path" in out["error"]["hint"]
    assert not (tmp_path / "r").exists()
    for b in range(6, 9):
        (sink / "_spark_metadata" / str(b)).unlink()
    code, out = cli("restore", taken["pointer"], "--to", str(tmp_path / "r"), "--sink-path", str(sink))
    assert code == 0, out


def test_corruption_is_named_and_restore_leaves_nothing(checkpoint, tmp_path):
    code, taken = cli("trigger", str(checkpoint), "--job", "j", "--dir", str(tmp_path / "sp"))
    pointer = Path(taken["pointer"])
    victim = pointer / planned_state_files(checkpoint)[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    rel = str(victim.relative_to(pointer))
    code, out = cli("verify", str(pointer))
    assert code == 1 and out["error"]["code"] == "verification_failed" and rel in out["error"]["message"]
    code, out = cli("restore", str(pointer), "--to", str(tmp_path / "r"))
    assert code == 1 and rel in out["error"]["message"]
    assert tree_snapshot(tmp_path / "r") == {}
    truncated = pointer / "offsets" / "5"
    truncated.write_bytes(truncated.read_bytes()[:10])
    code, out = cli("verify", str(pointer))
    assert "offsets/5" in out["error"]["message"] and "truncated" in out["error"]["message"]


def test_dispose_refuses_what_is_not_a_savepoint_under_the_root(checkpoint, tmp_path):
    sp = tmp_path / "sp"
    code, taken = cli("trigger", str(checkpoint), "--job", "j", "--dir", str(sp))
    before = tree_snapshot(tmp_path)
    code, out = cli("dispose", str(checkpoint))  # a live checkpoint is not a savepoint
    assert code == 1 and out["error"]["code"] == "incomplete_savepoint"
    code, out = cli("dispose", taken["pointer"], "--dir", str(tmp_path / "other-root"))
    assert code == 1 and out["error"]["code"] == "outside_root"
    assert tree_snapshot(tmp_path) == before


def test_status_reports_the_recorded_run_and_its_progress(checkpoint, tmp_path):
    import socket
    from datetime import UTC, datetime

    from airflow_savepoints.jobs.description.channel import JobControl
    from airflow_savepoints.jobs.description.record import JobRun
    from airflow_savepoints.storage import Store

    sp_dir = tmp_path / "savepoints"
    code, state = cli("status", "--job", "orders", "--dir", str(sp_dir))
    assert code == 0 and state["running"] is False and state["pid"] is None and state["checkpoint"] is None
    control = Store(str(sp_dir / "orders" / "_control" / "r1"))
    JobControl(control).announce(application_id="app-20261122-0001", pid=1)
    gone = 2 ** 22 + 1  # above Linux's largest pid_max: a run whose process has exited
    run = JobRun(job="orders", pid=gone, host=socket.gethostname(), command=["spark-submit"],
                 log_file=str(tmp_path / "job.log"), checkpoint=str(checkpoint), started_at=datetime.now(UTC),
                 control=control.url, run_id="r1")
    Store(str(sp_dir / "orders")).write_bytes_atomic("_run.json", run.model_dump_json().encode())
    code, state = cli("status", "--job", "orders", "--dir", str(sp_dir))
    assert code == 0, state
    assert state["running"] is False and state["application_id"] == "app-20261122-0001"
    assert state["last_committed_batch"] == 5 and state["checkpoint"] == str(checkpoint)
    code, error = cli("status", "--job", "a/b", "--dir", str(sp_dir))
    assert code == 1 and error["error"]["code"] == "invalid_job_name"


def test_trigger_a_stop_savepoint(checkpoint, tmp_path):
    code, taken = cli("trigger", str(checkpoint), "--job", "orders", "--dir", str(tmp_path / "sp"), "--type", "stop")
    assert code == 0 and taken["type"] == "stop" and taken["batch_id"] == 5
