"""A savepoint is of the job's live query, or it is refused (issue 39, item 1), on a real demo job under
spark-submit: the job writes ``<checkpoint>-v1`` while its jobs file names ``<checkpoint>``, a copy it has
left. ``trigger`` of the left checkpoint (CLI and TriggerSavepointOperator) is refused with
``not_live_checkpoint`` and copies nothing; ``job savepoint`` takes the live run's checkpoint at or past
its last commit; a savepoint of the left checkpoint taken on purpose (``--retired-checkpoint``), or by
an older tool without the check, is never the restore default, which the next ``job stop`` moves on."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import airflow_savepoints.demo.app as demo
from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.core import list_savepoints, resolve_pointer, take_savepoint
from airflow_savepoints.errors import NotLiveCheckpointError
from airflow_savepoints.jobs.description.record import read_run, restore_default
from airflow_savepoints.storage import Store
from tests.conftest import ROOT
from tests.support.feeding import Feeder

JOB = "demo-dedup"
JOBS_FILE = str(ROOT / "dags" / "jobs.yaml")


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(cli_app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def wait_for_commit_past(checkpoint: Path, batch: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while (newest := checkpoint_progress(Store(str(checkpoint)))[0]) is None or newest <= batch:
        assert time.monotonic() < deadline, f"no commit past {batch} in {checkpoint}"
        time.sleep(0.5)
    return newest


@pytest.mark.slow
def test_savepoints_only_of_the_live_query(tmp_path, monkeypatch):
    from airflow_savepoints.operators.savepoint import TriggerSavepointOperator

    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", str(tmp_path))
    monkeypatch.setenv("SAVEPOINTS_DEMO_APP", demo.__file__)
    root = Store(str(tmp_path / "savepoints"))
    left, live = tmp_path / "checkpoint", tmp_path / "checkpoint-v1"
    sent: set[int] = set()
    for index in range(2):
        sent.update(demo.write_events(tmp_path / "input", index))
    code, started = cli("job", "start", JOB, "--fresh", "--to", str(live), "--jobs-file", JOBS_FILE,
                        "--log-dir", str(tmp_path / "logs"))
    assert code == 0, started
    try:
        with Feeder(tmp_path / "input", sent, 2) as feeder:
            wait_for_commit_past(live, 1)
            feeder.pause()
            time.sleep(2)  # the batch in flight commits; the copy below is a checkpoint the job has left
            shutil.copytree(live, left)
            feeder.resume()
            wait_for_commit_past(live, checkpoint_progress(Store(str(left)))[0])

            # the jobs file's checkpoint is not the live one: refused, nothing copied (CLI and operator)
            code, body = cli("trigger", str(left), "--job", JOB, "--dir", root.url)
            assert code == 1 and body["error"]["code"] == "not_live_checkpoint", body
            assert str(live) in body["error"]["message"] and f"job savepoint {JOB}" in body["error"]["hint"]
            with pytest.raises(NotLiveCheckpointError):
                TriggerSavepointOperator(task_id="t", job=JOB, checkpoint=str(left), savepoint_dir=root.url).execute({})
            assert list_savepoints(root, JOB) == [] and not [p for p in (tmp_path / "savepoints" / JOB).iterdir()
                                                              if p.name.startswith("savepoint-")]
            # --retired-checkpoint names a checkpoint the job has left, not the live one
            code, body = cli("trigger", str(live), "--job", JOB, "--dir", root.url, "--retired-checkpoint")
            assert code == 1 and body["error"]["code"] == "invalid_input" and "not one job" in body["error"]["message"]

            # the live query's savepoint, from the run record, at or past its last commit when asked
            committed = checkpoint_progress(Store(str(live)))[0]
            code, taken = cli("job", "savepoint", JOB, "--jobs-file", JOBS_FILE, "--reason", "before the release")
            assert code == 0, taken
            assert taken["checkpoint"] == str(live) and taken["batch_id"] >= committed
            assert taken["run_id"] == read_run(root.child(JOB)).run_id and taken["type"] == "manual"

            # the left checkpoint on purpose: taken, marked, never the default; nor one an older tool took
            code, retired = cli("trigger", str(left), "--job", JOB, "--dir", root.url, "--retired-checkpoint")
            assert code == 0, retired
            assert resolve_pointer(retired["pointer"])[1].retired_checkpoint
            unchecked = take_savepoint(str(left), JOB, savepoint_dir=root.url)  # the core alone does not check
            assert [r.savepoint_id for r in list_savepoints(root, JOB)][-1] == unchecked.manifest.savepoint_id
            assert restore_default(root, JOB).pointer == taken["pointer"]
    finally:
        code, stopped = cli("job", "stop", JOB, "--jobs-file", JOBS_FILE)
    assert code == 0, stopped
    assert stopped["checkpoint"] == str(live) and restore_default(root, JOB).pointer == stopped["pointer"]
