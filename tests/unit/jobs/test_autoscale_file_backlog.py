"""The file sources' backlog, counted by the in-job helper on a real local query (PySpark ``local[2]``).

Spark's progress gives a file source no backlog (its ``latestOffset`` is null), so the helper counts the files of
the source's folder that the source's log does not name yet (``jobs/driver/file_backlog.py``). Here a query reads
one file per trigger from a folder that gets files faster: the recorded series says how many are left after each
batch, exactly, then 0 once it caught up.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_savepoints.jobs.description.metrics import read_series
from airflow_savepoints.jobs.driver.control import MetricsRecorder, _checkpoint_of
from airflow_savepoints.jobs.driver.file_backlog import FileBacklog, _hidden, _log_offset
from airflow_savepoints.storage import Store


def write_files(folder: Path, names: range, stamp: float | None = None) -> None:
    for i in names:
        path = folder / f"part-{i:03d}.txt"
        path.write_text(f"row {i}\n")
        if stamp is not None:
            os.utime(path, (stamp, stamp))


def record_until(query, recorder: MetricsRecorder, done, timeout: float = 180) -> None:
    """Poll as the helper does (observe each trigger, let the count finish, write) until ``done(series)``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recorder.observe(query)
        recorder.file_backlog.wait(10)
        recorder.flush()
        if done(read_series(recorder.job_folder)):
            return
        time.sleep(0.1)
    raise AssertionError(f"not reached in {timeout} s: {[(p.batch_id, p.backlog_files) for p in read_series(recorder.job_folder)]}")


def test_a_file_sources_backlog_is_the_files_not_yet_read_and_0_once_caught_up(spark, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    source.mkdir()
    (source / "_SUCCESS").write_text("")  # hidden files are not input
    (source / ".part-000.txt.crc").write_text("")
    write_files(source, range(6), stamp=time.time() - 60)  # six files of one same modification time
    query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(source))
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="1 second").start())
    found = _checkpoint_of(query, spark)  # as the helper finds it without a start's conf: the query's own root
    assert (found.protocol, found.root) == ("file", str(checkpoint))
    recorder = MetricsRecorder(Store(str(tmp_path / "job")), "run-1", trigger_interval_ms=1000,
                               file_backlog=FileBacklog(found))
    try:
        record_until(query, recorder, lambda series: any(p.backlog_files is not None and p.batch_id >= 1 for p in series))
        write_files(source, range(6, 12))  # six more while it reads one a second: faster than it reads
        record_until(query, recorder, lambda series: any(p.backlog_files == 0 for p in series if p.batch_id >= 11))
    finally:
        query.stop()
    counted = [p for p in read_series(recorder.job_folder) if p.backlog_files is not None and not p.idle]
    assert counted, "no batch of the query got a count"
    for point in counted:  # batch b read one file (oldest first): b + 1 read, of 6 (before the second six) or 12
        assert point.files_read == 1, point
        assert point.backlog_files in ((5 - point.batch_id, 11 - point.batch_id) if point.batch_id < 6
                                       else (11 - point.batch_id,)), point  # files of one millisecond told apart by name
    assert max(p.backlog_files for p in counted) >= 5  # behind: files added faster than read
    assert counted[-1].batch_id == 11 and counted[-1].backlog_files == 0  # caught up: none left


def test_what_spark_logs_and_lists_is_read_as_spark_does():
    assert _log_offset('{"logOffset": 4}') == 4 and _log_offset({"logOffset": 0}) == 0
    assert _log_offset(None) == _log_offset("null") == _log_offset("garbage") == _log_offset({"logOffset": True}) == -1
    assert _hidden("_SUCCESS") and _hidden("a/.x.crc") and _hidden("_spark_metadata/0") and _hidden("f.json._COPYING_")
    assert not _hidden("day=2026-11-28/part-0.json") and not _hidden("_day=1/part-0.json")  # partitions are input


def test_no_file_source_or_no_checkpoint_starts_no_count(tmp_path):
    kafka = {"batchId": 3, "sources": [{"description": "KafkaV2[Subscribe[t]]", "endOffset": {"t": {"0": 5}}}]}
    assert FileBacklog(Store(str(tmp_path))).submit(kafka) is False
    files = {"batchId": 3, "sources": [{"description": "FileStreamSource[file:/x]", "endOffset": '{"logOffset": 0}'}]}
    assert FileBacklog(None).submit(files) is False


@pytest.mark.parametrize("url", ["file:/data/*/in", "file:/data/{a,b}"])
def test_a_glob_path_gets_no_count(tmp_path, url):
    assert FileBacklog(Store(str(tmp_path))).count(0, url, 0) == (None, None)


def test_a_failing_count_is_no_count_and_never_raises(tmp_path):
    (tmp_path / "cp").write_text("")  # the checkpoint's place is a file: its source log cannot be read
    backlog = FileBacklog(Store(str(tmp_path / "cp")))
    files = {"batchId": 2, "sources": [{"description": f"FileStreamSource[file:{tmp_path}]",
                                        "endOffset": '{"logOffset": 0}'}]}
    assert backlog.submit(files) is True
    backlog.wait(10)
    assert backlog.take() == {2: (None, None)}
    assert backlog.take() == {}  # taken once


def test_counting_takes_at_most_its_share_of_the_run_and_a_batch_between_counts_carries_the_last(tmp_path):
    """A folder of many files: after a count of d seconds none starts for d / COST_SHARE; the points of the batches
    meanwhile carry the last count (their own files read unknown)."""
    from airflow_savepoints.jobs.description.metrics import MetricPoint
    from airflow_savepoints.jobs.driver.file_backlog import COST_SHARE

    source = tmp_path / "in"
    source.mkdir()
    write_files(source, range(600))
    backlog = FileBacklog(Store(str(tmp_path / "cp")))
    batch = {"batchId": 4, "sources": [{"description": f"FileStreamSource[file:{source}]", "endOffset": '{"logOffset": -1}'}]}
    assert backlog.submit(batch) is True
    backlog.wait(30)
    assert backlog.take() == {4: (600, 0)}
    assert backlog.submit({**batch, "batchId": 5}) is False  # within d / COST_SHARE of the last count's start
    time.sleep(backlog.last_count_s / COST_SHARE + 0.05)
    assert backlog.submit({**batch, "batchId": 6}) is True
    backlog.wait(30)

    recorder = MetricsRecorder(Store(str(tmp_path / "job")), "run-1", trigger_interval_ms=1000, file_backlog=backlog)
    recorder.pending = [MetricPoint(batch_id=b, time=time.time(), run_id="run-1") for b in (6, 7)]
    recorder.flush()
    assert [(p.batch_id, p.backlog_files, p.files_read) for p in read_series(recorder.job_folder)] == \
        [(6, 600, 0), (7, 600, None)]


# --- the policy on a file source's backlog (recorded series, no Spark) -------------------------------------
def file_series(backlogs: list[int], *, rate: float = 120, files_per_batch: int = 4):
    """A run at utilization 0.6 (2 cores, within the band) whose batches each read ``files_per_batch`` files, with
    ``backlogs`` files not yet read after them (the last value repeated)."""
    from tests.unit.jobs.test_autoscale import batches

    series = batches([(1800, rate)], cores=2)
    return [p.model_copy(update={"files_read": files_per_batch,
                                 "backlog_files": backlogs[min(i, len(backlogs) - 1)]}) for i, p in enumerate(series)]


def test_files_not_yet_read_above_max_backlog_for_the_window_scale_up_sized_with_the_rows_a_file_holds():
    from airflow_savepoints.jobs.workflows.autoscale import Current, decide
    from tests.unit.jobs.test_autoscale import now_after, policy

    series = file_series([0] * 140 + [60])  # caught up, then 60 files behind for the last 6 minutes
    decision = decide(policy(max_backlog=50), series, Current(cores=2), now_after(series), [])
    assert decision.action == "scale_up", decision
    # 1200 rows a batch in 4 files: 300 rows a file; (120 + 60 x 300 / 300 s) / (0.7 x 100) = 2.57 -> 3 cores
    assert (decision.evidence["backlog_files"], decision.evidence["rows_per_file"]) == (60, 300)
    assert decision.evidence["required_cores"] == pytest.approx(180 / 70, abs=0.001) and decision.target_cores == 3
    assert decide(policy(max_backlog=60), series, Current(cores=2), now_after(series), []).action == "hold"  # not above


def test_a_run_is_caught_up_once_its_files_not_yet_read_are_one_batchs_worth():
    from airflow_savepoints.jobs.workflows.autoscale import catch_up_end
    from tests.unit.jobs.test_autoscale import policy

    series = file_series([40, 30, 20, 9, 4, 3])
    assert catch_up_end(series, policy()) == series[4].time  # 4 files left: what one batch reads
