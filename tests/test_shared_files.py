"""Nothing on shared storage decides what is read (issue 40, items 3-8), through the CLI.

Someone who may write the savepoint folder puts a folder, a FIFO, a link or deep JSON where a file
of a known name belongs, links a savepoint's ``state/``, ``_metadata`` or ``sources/0/*`` elsewhere,
or breaks a file-source log line: every command answers a typed error naming the file, or goes on
where that is safe (status, retention, the catalog's rebuild). No Spark runs here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.core import take_savepoint
from airflow_savepoints.core.names import HEARTBEAT_FILE, RUN_FILE, RUN_LEASE
from tests.support.synthetic import write_checkpoint
from tests.test_cli import cli
from tests.test_run_files import context, forge_run

DEEP = b"[" * 200000


def special(path: Path, kind: str) -> None:
    """Put ``kind`` (a folder or a FIFO) where the file ``path`` belongs."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir() if kind == "folder" else os.mkfifo(path)


@pytest.mark.timeout(120)  # a FIFO hung status and cancel for ever, before
@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_folder_or_fifo_named_as_a_run_file_never_wedges_job_status(tmp_path, kind):
    ctx = context(str(tmp_path))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(json.dumps({"jobs": [ctx.job.model_dump(exclude_none=True)]}))
    folder = Path(ctx.folder.path_of(""))

    def status() -> dict:
        result = CliRunner().invoke(cli_app, ["job", "status", "orders", "--jobs-file", str(jobs), "--json"])
        assert result.exit_code == 0, result.stdout  # before: storage_error (a folder), or no answer (a FIFO)
        return json.loads(result.stdout)

    special(folder / RUN_FILE, kind)
    answer = status()
    assert answer["state"] == "not_started" and any(RUN_FILE in w for w in answer["warnings"])

    os.remove(folder / RUN_FILE) if kind == "fifo" else shutil.rmtree(folder / RUN_FILE)
    assert ctx.lease.acquire("r1", {"host": "worker-a", "timeout_s": 30}) is None
    special(folder / "_control" / "r1" / HEARTBEAT_FILE, kind)
    answer = status()
    assert answer["state"] != "running" and any(HEARTBEAT_FILE in w for w in answer["warnings"])

    forge_run(ctx)
    special(folder / RUN_LEASE, kind)
    answer = status()  # the lease is no lease of ours: the run lapsed
    assert answer["state"] in ("lost", "stopped", "not_started"), answer


@pytest.fixture
def savepoint(tmp_path) -> tuple[str, Path]:
    checkpoint = write_checkpoint(tmp_path / "checkpoint")
    info = take_savepoint(str(checkpoint), "orders", savepoint_dir=str(tmp_path / "sp"))
    return info.pointer, Path(info.pointer)


def test_deep_json_in_an_uncatalogued_metadata_is_skipped_by_retention_and_the_rebuild(savepoint, tmp_path):
    pointer, location = savepoint
    bad = location.parent / "savepoint-5d5a3b-0123456789ab"
    bad.mkdir()
    (bad / "_metadata").write_bytes(DEEP)
    for command in (["retain", "--job", "orders", "--dir", str(tmp_path / "sp"), "--max-periodic", "1"],
                    ["catalog", "--job", "orders", "--dir", str(tmp_path / "sp"), "--rebuild"]):
        code, answer = cli(*command)
        assert code == 0, answer  # before: unexpected_error (RecursionError) for the whole job
    for command in ("show", "verify", "offsets"):
        code, answer = cli(command, str(bad))
        assert code == 1 and answer["error"]["code"] == "manifest_corrupt", answer  # before: unexpected_error
        assert str(bad / "_metadata") in answer["error"]["message"]
    assert cli("show", pointer)[0] == 0


@pytest.mark.timeout(60)
def test_a_fifo_metadata_is_refused_without_waiting(savepoint):
    pointer, location = savepoint
    special(location / "_metadata", "fifo")
    for command in ("show", "offsets"):
        code, answer = cli(command, pointer)  # before: hung
        assert code == 1 and answer["error"]["code"] == "not_a_regular_file", answer


def test_show_offsets_and_inspect_refuse_links_out_of_the_savepoint(savepoint, tmp_path):
    pointer, location = savepoint
    other = tmp_path / "other"
    shutil.copytree(location, other)
    shutil.rmtree(location / "state")
    (location / "state").symlink_to(other / "state")  # another job's state shown as this one's, before
    code, answer = cli("inspect", pointer)
    assert code == 1 and answer["error"]["code"] == "symlink_refused" and "state" in answer["error"]["message"]
    (location / "state").unlink()
    shutil.copytree(other / "state", location / "state")

    (location / "sources" / "0" / "1").unlink()
    (location / "sources" / "0" / "1").symlink_to("/etc/passwd")  # read without a word, before
    for command in ("offsets", "show"):
        code, answer = cli(command, pointer)
        assert code == 1 and answer["error"]["code"] == "symlink_refused", answer
    (location / "sources" / "0" / "1").unlink()
    shutil.copy(other / "sources" / "0" / "1", location / "sources" / "0" / "1")
    assert cli("offsets", pointer)[0] == 0

    (location / "_metadata").unlink()
    (location / "_metadata").symlink_to(other / "_metadata")  # the other job's name, before
    for command in ("offsets", "show", "inspect"):
        code, answer = cli(command, pointer)
        assert code == 1 and answer["error"]["code"] == "symlink_refused", answer


def test_a_malformed_line_in_a_file_source_log_is_a_typed_error_naming_the_file(savepoint):
    pointer, location = savepoint
    log = location / "sources" / "0" / "1"
    log.write_text('v1\n{"path":"file:///in/f1.json","timestamp":1,"batchId":1')  # cut short
    code, answer = cli("offsets", pointer)
    assert code == 1 and answer["error"]["code"] == "malformed_file", answer  # before: unexpected_error
    assert str(log) in answer["error"]["message"]


def test_state_partitions_spark_cannot_take_are_refused_before_spark_starts(savepoint, tmp_path):
    pointer, _ = savepoint
    code, answer = cli("restore", pointer, "--to", str(tmp_path / "r1"), "--state-partitions", "2147483648")
    assert code == 1 and answer["error"]["code"] == "invalid_input" and "state_partitions" in answer["error"]["message"]
    code, answer = cli("restore", pointer, "--to", str(tmp_path / "r2"), "--state-partitions", "20000")
    assert code == 1 and answer["error"]["code"] == "invalid_input" and "--many-state-partitions" in answer["error"]["hint"]
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_job_check_refuses_a_timeout_that_never_ends(tmp_path):
    for value in ("nan", "inf", "0", "-1"):
        result = CliRunner().invoke(cli_app, ["job", "check", "orders", "--timeout", value, "--json"])
        assert result.exit_code != 0 and "finite number of seconds" in result.stdout, (value, result.stdout)


@pytest.mark.timeout(60)  # a FIFO summary tied up a console worker per request, before
def test_a_fifo_state_summary_reads_as_none_without_waiting(savepoint):
    from airflow_savepoints.core.names import STATE_SUMMARIES_FOLDER
    from airflow_savepoints.core.state_summary import read_summary
    from airflow_savepoints.storage import Store

    _, location = savepoint
    special(location.parent / STATE_SUMMARIES_FOLDER / f"{location.name}.json", "fifo")
    assert read_summary(Store(str(location.parent)), location.name) is None


def test_job_commands_refuse_waits_that_never_end_or_are_negative_and_change_nothing(tmp_path):
    """A job command's seconds (a stop's grace and in-flight wait, a start's wait, a cancel's grace, an upgrade's
    timeouts) are refused before anything is read or written: a typed error naming the option, a non-zero exit, and no
    folder made. Before, ``--grace -1`` stopped at once and ``--health-timeout -5`` was an unexpected error."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - name: orders\n    application: /apps/orders.py\n    master: local[2]\n"
                    f"    checkpoint: {tmp_path / 'cp'}\n    savepoint_dir: {tmp_path / 'sp'}\n")
    for args in (["stop", "--grace", "-1"], ["stop", "--inflight-wait", "nan"], ["start", "--wait-timeout", "0"],
                 ["cancel", "--grace", "inf"], ["cancel", "--grace", "-0.5"]):
        result = CliRunner().invoke(cli_app, ["job", args[0], "orders", "--jobs-file", str(jobs), *args[1:], "--json"])
        assert result.exit_code == 2 and f"'{args[1]}'" in result.output and "finite number of seconds" in result.output, \
            (args, result.output)
    forced = CliRunner().invoke(cli_app, ["job", "cancel", "orders", "--jobs-file", str(jobs), "--grace", "0", "--json"])
    assert "finite number" not in forced.output, forced.output  # 0: cancel at once (a job not running: nothing to do)
    for option, value, field in (("--health-timeout", "-5", "health_timeout"), ("--check-timeout", "inf", "check_timeout"),
                                 ("--state-partitions", "0", "state_partitions")):
        code, answer = cli("job", "upgrade", "orders", "--jobs-file", str(jobs), option, value)
        assert code == 1 and answer["error"]["code"] == "invalid_input" and field in answer["error"]["message"], answer
    assert not (tmp_path / "sp").exists() and not (tmp_path / "cp").exists()
