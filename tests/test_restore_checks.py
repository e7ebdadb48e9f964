"""Restore checks users asked Flink for: a savepoint too old (``max_age``) and input files gone.

Both are refused before anything is written, with a typed error naming the cause; the input check
runs on a real Spark file-source query whose batch failed after it was planned (``offsets/N+1``
without ``commits/N+1``), so its restore re-reads that batch's files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints import core
from airflow_savepoints.cli.main import app
from airflow_savepoints.errors import MissingInputError, SavepointTooOldError
from tests.conftest import tree_snapshot, write_json_inputs
from tests.support.synthetic import write_checkpoint

runner = CliRunner()


def cli(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def _age_manifest(pointer: Path, hours: float) -> None:
    """Make a test savepoint look ``hours`` older (its manifest's creation time)."""
    from datetime import datetime, timedelta

    manifest = json.loads((pointer / "_metadata").read_text())
    created = datetime.fromisoformat(manifest["created_at"]) - timedelta(hours=hours)
    manifest["created_at"] = created.isoformat()
    (pointer / "_metadata").write_text(json.dumps(manifest))


def test_max_age_refuses_an_old_savepoint_in_the_api_and_the_cli(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=3)
    info = core.take_savepoint(str(checkpoint), "orders", savepoint_dir=str(tmp_path / "sp"))
    pointer = Path(info.pointer)
    _age_manifest(pointer, 30)
    before = tree_snapshot(pointer)

    with pytest.raises(SavepointTooOldError) as caught:
        core.restore_savepoint(str(pointer), str(tmp_path / "api"), max_age="1d")
    assert caught.value.code == "savepoint_too_old"
    assert "30.0 h old" in caught.value.message and "max_age 1d" in caught.value.message
    assert not (tmp_path / "api").exists()

    code, body = cli("restore", str(pointer), "--to", str(tmp_path / "cli"), "--max-age", "12h")
    assert code != 0 and body["error"]["code"] == "savepoint_too_old", body
    assert "max_age 12h" in body["error"]["message"] and body["error"]["hint"]
    assert not (tmp_path / "cli").exists()
    assert tree_snapshot(pointer) == before

    code, body = cli("restore", str(pointer), "--to", str(tmp_path / "cli"), "--max-age", "2d")
    assert code == 0 and body["batch_id"] == 2, body
    result = core.restore_savepoint(str(pointer), str(tmp_path / "api"), max_age="31h")
    assert result.batch_id == 2

    code, body = cli("restore", str(pointer), "--to", str(tmp_path / "bad"), "--max-age", "soon")
    assert code != 0 and body["error"]["code"] == "invalid_input" and not (tmp_path / "bad").exists()


def _failed_file_source_query(spark, base: Path, fail_at: int) -> Path:
    """A file-source query (one file per batch) whose sink fails at batch ``fail_at``: the checkpoint
    then holds ``offsets/fail_at`` and its source-log entry, without ``commits/fail_at``."""
    write_json_inputs(base / "input", 0, fail_at + 2)

    def sink(frame, batch_id: int) -> None:
        if batch_id == fail_at:
            raise RuntimeError(f"sink down at batch {batch_id}")
        frame.count()

    frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(str(base / "input"))
    query = frame.writeStream.foreachBatch(sink).option("checkpointLocation", str(base / "checkpoint")).start()
    with pytest.raises(Exception, match="sink down"):
        query.awaitTermination(60)
    return base / "checkpoint"


@pytest.mark.slow
def test_restore_names_input_files_gone_and_refuses_unless_told_to_skip(spark, tmp_path):
    checkpoint = _failed_file_source_query(spark, tmp_path, fail_at=3)
    assert (checkpoint / "offsets" / "3").exists() and not (checkpoint / "commits" / "3").exists()
    info = core.take_savepoint(str(checkpoint), "files", savepoint_dir=str(tmp_path / "sp"))
    assert info.manifest.batch_id == 2 and info.manifest.includes_next_offsets
    pointer = Path(info.pointer)

    # every input file is there: the restore passes the check
    assert core.restore_savepoint(str(pointer), str(tmp_path / "ok")).batch_id == 2

    # batch 3 re-reads part-00003.json; files of committed batches (part-00000..2) do not matter
    (tmp_path / "input" / "part-00000.json").unlink()
    (tmp_path / "input" / "part-00003.json").unlink()
    before = tree_snapshot(pointer)
    with pytest.raises(MissingInputError) as caught:
        core.restore_savepoint(str(pointer), str(tmp_path / "api"))
    message = caught.value.message
    assert caught.value.code == "missing_input" and "1 input file(s)" in message
    assert "part-00003.json" in message and "part-00000.json" not in message
    assert "skip_missing_input" in caught.value.hint
    assert not (tmp_path / "api").exists()

    code, body = cli("restore", str(pointer), "--to", str(tmp_path / "cli"))
    assert code != 0 and body["error"]["code"] == "missing_input" and "part-00003.json" in body["error"]["message"]
    assert not (tmp_path / "cli").exists()
    assert tree_snapshot(pointer) == before

    code, body = cli("restore", str(pointer), "--to", str(tmp_path / "cli"), "--skip-missing-input")
    assert code == 0 and body["batch_id"] == 2, body
    skipped = core.restore_savepoint(str(pointer), str(tmp_path / "api"), skip_missing_input=True)
    assert skipped.batch_id == 2 and (tmp_path / "api" / "offsets" / "3").exists()

    # a job start restores through the same check: refused, nothing started; --skip-missing-input passes it
    app_file = tmp_path / "exits.py"
    app_file.write_text("import sys\nsys.exit(3)\n")  # a driver that ends before any batch
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - name: files\n    application: {app_file}\n    master: local[1]\n"
                    f"    checkpoint: {tmp_path}/live\n    savepoint_dir: {tmp_path}/sp\n")
    start = ("job", "start", "files", "--from", str(pointer), "--jobs-file", str(jobs), "--log-dir", str(tmp_path / "logs"))
    code, body = cli(*start, "--to", str(tmp_path / "live-refused"))
    assert code == 1 and body["error"]["code"] == "missing_input", body
    assert not (tmp_path / "live-refused").exists() and not (tmp_path / "logs").exists()
    code, body = cli(*start, "--to", str(tmp_path / "live-skipped"), "--skip-missing-input")
    assert code == 1 and body["error"]["code"] == "job_failed" and "exited before committing" in body["error"]["message"]
    assert (tmp_path / "live-skipped" / "offsets" / "3").exists()  # restored, then the driver ran (and ended)
    assert tree_snapshot(pointer) == before


def test_missing_input_lists_the_first_ten_and_a_count(tmp_path):
    """Synthetic: 14 planned-not-committed log entries whose files (file:///in/...) do not exist."""
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=3, committed=2)
    entries = "\n".join(json.dumps({"path": f"file:///nonexistent-input/f{i:02d}.json", "timestamp": 1,
                                    "batchId": 2}) for i in range(14))
    (checkpoint / "sources" / "0" / "2").write_text("v1\n" + entries)
    info = core.take_savepoint(str(checkpoint), "orders", savepoint_dir=str(tmp_path / "sp"))
    assert info.manifest.includes_next_offsets
    with pytest.raises(MissingInputError) as caught:
        core.restore_savepoint(info.pointer, str(tmp_path / "restored"))
    assert "14 input file(s)" in caught.value.message and "(+4 more)" in caught.value.message
    assert "f09.json" in caught.value.message and "f10.json" not in caught.value.message
    assert not (tmp_path / "restored").exists()


@pytest.mark.slow
def test_file_source_log_restores_through_two_savepoint_generations(spark, tmp_path):
    """Spark derives a file-source log's compact interval from its two newest ``.compact`` files, or
    guesses from one. A savepoint holding only the newest one made a restored run guess another
    interval (3 -> 6 here); a savepoint of THAT run then restored with the guess 3 and failed reading
    its log (``14.compact doesn't exist``). The savepoint keeps the two newest, so each restore
    derives the interval the run used."""
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.streaming.fileSource.log.compactInterval", "3")
    try:
        seen: list[int] = []

        def run(checkpoint: Path, start: int, stop: int) -> None:
            write_json_inputs(tmp_path / "input", start, stop, rows=2)
            frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(
                str(tmp_path / "input"))
            query = (frame.select((F.col("value") / 100).cast("int").alias("file"))
                     .writeStream.foreachBatch(lambda batch, _: seen.extend(r.file for r in batch.distinct().collect()))
                     .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
            query.awaitTermination(120)
            assert query.exception() is None, query.exception()

        run(tmp_path / "ck0", 0, 7)  # batches 0-6: 2.compact, 5.compact
        first = core.take_savepoint(str(tmp_path / "ck0"), "files", savepoint_dir=str(tmp_path / "sp"))
        core.restore_savepoint(first.pointer, str(tmp_path / "ck1"))
        run(tmp_path / "ck1", 7, 15)  # batches 7-14 on the restored log: 11.compact
        second = core.take_savepoint(str(tmp_path / "ck1"), "files", savepoint_dir=str(tmp_path / "sp"))
        core.restore_savepoint(second.pointer, str(tmp_path / "ck2"))
        run(tmp_path / "ck2", 15, 16)
        assert sorted(seen) == list(range(16))  # every file once, across three runs
    finally:
        spark.conf.unset("spark.sql.streaming.fileSource.log.compactInterval")
