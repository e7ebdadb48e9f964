"""A jobs.yaml job writing a Delta table, through `job start`, `job savepoint`, `job stop` and `job upgrade`
(real Spark under spark-submit with Delta Lake 4.4.0's jars; issue 39): the restore reads the table's
transaction version for the query id before anything is written.

- a start from a savepoint older than what the table holds is refused with the figures, nothing started;
- the newest savepoint continues: every event once;
- a bug-fix rollback: `--reprocess` is refused while the rows of the re-run batches are in the table;
  after a table RESTORE to before them, version 2 re-runs them under a new query id: every event once,
  the re-run batches carry version 2's rows;
- `job upgrade` (savepoint mode) to version 3: every event once."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.cli.main import app as cli_app
from airflow_savepoints.jobs.description.record import read_run
from airflow_savepoints.sinks import DeltaLog
from airflow_savepoints.storage import Store
from tests.conftest import ROOT
from tests.support.emulators import JARS, jar_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def delta_jars():
    from tests.conftest import require_part

    require_part("delta", None if jar_files(JARS / "delta") else f"Delta Lake's jars are not in {JARS / 'delta'} (make jars)")

JOB = "dl"
PER_FILE = 5


def feed(inputs: Path, index: int) -> list[int]:
    """One file of events (ids index*10..): with maxFilesPerTrigger=1, one batch each."""
    ids = [index * 10 + i for i in range(PER_FILE)]
    inputs.mkdir(parents=True, exist_ok=True)
    tmp = inputs / f".{index:03d}.tmp"
    tmp.write_text("".join(json.dumps({"id": i, "ts": "2026-01-01T00:00:00Z"}) + "\n" for i in ids))
    os.utime(tmp, (1_000_000 + index, 1_000_000 + index))
    tmp.rename(inputs / f"{index:03d}.json")
    return ids


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(cli_app, [*args, "--json"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(result.output[-3000:]) from None


def wait_for_batch(checkpoint: str, batch: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while (newest := checkpoint_progress(Store(checkpoint))[0]) is None or newest < batch:
        assert time.monotonic() < deadline, f"{checkpoint} did not commit batch {batch} (newest {newest})"
        time.sleep(0.5)


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    jars = ",".join(str(p) for p in jar_files(JARS / "delta"))
    text = f"""jobs:
  - name: {JOB}
    application: {ROOT / "tests" / "support" / "delta_stream_app.py"}
    application_args: [{tmp_path}/input, "{{checkpoint}}", {tmp_path}/table]
    master: local[2]
    spark_conf:
      spark.jars: "{jars}"
      spark.sql.extensions: io.delta.sql.DeltaSparkSessionExtension
      spark.sql.catalog.spark_catalog: org.apache.spark.sql.delta.catalog.DeltaCatalog
      spark.sql.shuffle.partitions: "2"
      spark.databricks.delta.snapshotPartitions: "2"
      spark.ui.enabled: "false"
      spark.savepoints.test.version: "${{DL_VERSION:-1}}"
    checkpoint: {tmp_path}/checkpoint
    savepoint_dir: {tmp_path}/savepoints
    sink: {{kind: delta, path: {tmp_path}/table}}
"""
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    monkeypatch.setenv("SAVEPOINTS_JOBS_FILE", str(path))
    monkeypatch.setenv("SAVEPOINTS_LOG_DIR", str(tmp_path / "logs"))
    return path


def table_rows(spark, table: Path) -> list[tuple[int, str]]:
    return sorted((r.id, r.version) for r in spark.read.format("delta").load(str(table)).collect())


def test_a_delta_job_restores_exactly_once_and_refuses_what_delta_would_skip(jobs, tmp_path, spark, monkeypatch):
    inputs, table = tmp_path / "input", tmp_path / "table"
    sent = [i for index in range(3) for i in feed(inputs, index)]
    code, started = cli("job", "start", JOB, "--fresh")
    assert code == 0, started
    try:
        wait_for_batch(started["checkpoint"], 2)
        code, older = cli("job", "savepoint", JOB)  # batch N
        assert code == 0, older
        sent += [i for index in range(3, 6) for i in feed(inputs, index)]
        wait_for_batch(started["checkpoint"], 5)
    finally:
        code, stopped = cli("job", "stop", JOB)
    assert code == 0, stopped
    n, m = older["batch_id"], stopped["batch_id"]
    assert m > n

    # an older savepoint: Delta would skip N+1..M; refused with the figures, nothing started
    run_before = read_run(Store(str(tmp_path / "savepoints")).child(JOB))
    code, refused = cli("job", "start", JOB, "--from", older["pointer"])
    assert code == 1 and refused["error"]["code"] == "sink_ahead", refused
    assert str(m) in refused["error"]["message"] and "skip" in refused["error"]["message"], refused
    assert "--reprocess" in refused["error"]["hint"]
    assert read_run(Store(str(tmp_path / "savepoints")).child(JOB)).run_id == run_before.run_id
    # --reprocess while the rows of N+1..M are still in the table: they would be there twice
    code, refused = cli("job", "start", JOB, "--from", older["pointer"], "--reprocess")
    assert code == 1 and refused["error"]["code"] == "sink_ahead" and "still in the table" in refused["error"]["message"]

    # the newest savepoint (the stop's) continues: nothing re-run, every event once
    code, resumed = cli("job", "start", JOB)
    assert code == 0, resumed
    assert resumed["sink"]["kind"] == "delta" and resumed["sink"]["on_rerun"] == "skipped", resumed["sink"]
    try:
        sent += feed(inputs, 6)
        wait_for_batch(resumed["checkpoint"], m + 1)
    finally:
        code, stopped = cli("job", "stop", JOB)
    assert code == 0, stopped
    assert table_rows(spark, table) == sorted((i, "v1") for i in sent)

    # a bug-fix rollback: the table restored to before batch N+1's commit, version 2 re-runs N+1.. under a new id
    query_id = json.loads((Path(started["checkpoint"]) / "metadata").read_text())["id"]
    log = DeltaLog(Store(str(table)))
    commits = log.txn_commits(query_id, n + 1, m, log.snapshot().version)
    first_rerun = min(c.version for c in commits.values() if c is not None)
    spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {first_rerun - 1}")
    kept = {i for i, _ in table_rows(spark, table)}
    assert kept and len(kept) < len(sent)
    monkeypatch.setenv("DL_VERSION", "2")
    code, rolled = cli("job", "start", JOB, "--from", older["pointer"], "--reprocess")
    assert code == 0, rolled
    assert rolled["restored"]["new_query_id"] and rolled["sink"]["on_rerun"] == "written_again", rolled["sink"]
    try:
        deadline = time.monotonic() + 180
        while len(table_rows(spark, table)) < len(sent) and time.monotonic() < deadline:
            time.sleep(1)
        # job upgrade (savepoint mode) to version 3: a stop savepoint, the new version from it, nothing re-run;
        # input keeps arriving meanwhile (the upgrade waits for the new version's first new batch)
        during: list[int] = []
        done = threading.Event()

        def keep_feeding() -> None:
            index = 7
            while not done.wait(3):
                during.extend(feed(inputs, index))
                index += 1

        feeder = threading.Thread(target=keep_feeding, daemon=True)
        feeder.start()
        try:
            code, upgraded = cli("job", "upgrade", JOB, "--mode", "savepoint", "--no-check-first",
                                 "--conf", "spark.savepoints.test.version=3")
        finally:
            done.set()
            feeder.join()
        assert code == 0, upgraded
        last = feed(inputs, 7 + len(during) // PER_FILE)  # after the upgrade: version 3's
        sent += during + last
        deadline = time.monotonic() + 120
        while len(table_rows(spark, table)) < len(sent) and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        code, stopped = cli("job", "stop", JOB)
    assert code == 0, stopped
    rows = table_rows(spark, table)
    assert [i for i, _ in rows] == sorted(sent)  # every event once
    versions = dict(rows)
    assert {versions[i] for i in kept} == {"v1"}  # what the table kept at its RESTORE
    assert {versions[i] for i in set(sent) - kept - set(during) - set(last)} == {"v2"}, versions  # re-run: version 2
    assert {versions[i] for i in during} <= {"v2", "v3"} and {versions[i] for i in last} == {"v3"}
