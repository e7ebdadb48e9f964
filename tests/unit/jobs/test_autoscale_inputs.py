"""What the autoscaler reads: the ``autoscale:`` policy of jobs.yaml, the metric series the in-job helper
records (bounded, atomic, read tolerantly) and the bounded decision history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_savepoints.core.names import AUTOSCALE_FILE, METRICS_FILE
from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.jobs.description.metrics import (
    MAX_SERIES_BYTES,
    MetricPoint,
    OperatorPoint,
    append_decision,
    append_points,
    backlog_of,
    point_of,
    read_decisions,
    read_series,
    write_series,
)
from airflow_savepoints.jobs.description.model import AutoscaleSettings, load_jobs
from airflow_savepoints.jobs.driver.control import MetricsRecorder
from airflow_savepoints.storage import Store


def jobs_file(tmp_path: Path, autoscale: str) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(f"jobs:\n  - name: orders\n    application: app.py\n    checkpoint: {tmp_path}/ckpt\n"
                    f"    savepoint_dir: {tmp_path}/sp\n    autoscale:\n{autoscale}")
    return path


# --- the policy in jobs.yaml ----------------------------------------------------------------------------
def test_the_policys_defaults():
    policy = AutoscaleSettings()
    assert (policy.target_utilization, policy.utilization_band, policy.mode) == (0.7, 0.2, "recommend")
    assert (policy.min_executors, policy.max_executors, policy.executor_cores) == (1, 8, 1)
    assert (policy.scale_up_after, policy.scale_down_after, policy.cooldown) == (300, 1800, 900)
    assert (policy.min_partitions, policy.max_partitions, policy.max_backlog) == (None, None, None)


def test_a_job_with_an_autoscale_block_loads_it(tmp_path):
    jobs = load_jobs(jobs_file(tmp_path, "      max_executors: 4\n      mode: act\n      target_utilization: 0.5\n"))
    policy = jobs["orders"].autoscale
    assert (policy.max_executors, policy.mode, policy.target_utilization) == (4, "act", 0.5)
    assert load_jobs(jobs_file(tmp_path, "      {}\n"))["orders"].autoscale == AutoscaleSettings()


@pytest.mark.parametrize(("block", "says"), [
    ("      min_executors: 5\n      max_executors: 2\n", "min_executors (5) is above max_executors (2)"),
    ("      min_partitions: 16\n      max_partitions: 8\n", "min_partitions (16) is above max_partitions (8)"),
    ("      min_partitions: 4\n", "min_partitions and max_partitions go together"),
    ("      target_utilization: 0\n", "greater than 0"),
    ("      target_utilization: 1.5\n", "less than or equal to 1"),
    ("      target_utilization: .nan\n", "finite"),
    ("      scale_up_after: -5\n", "greater than 0"),
    ("      mode: maybe\n", "'act' or 'recommend'"),
    ("      max_executor: 4\n", "Extra inputs are not permitted"),
])
def test_a_bad_policy_is_refused_naming_the_job_the_field_and_where_the_fields_are_documented(tmp_path, block, says):
    with pytest.raises(InvalidInputError) as caught:
        load_jobs(jobs_file(tmp_path, block))
    assert caught.value.code == "invalid_input"
    assert "job 'orders': autoscale" in caught.value.message and says in caught.value.message, caught.value.message
    assert "docs/autoscale.md" in caught.value.hint


# --- the metric series ----------------------------------------------------------------------------------
KAFKA_PROGRESS = {
    "id": "q", "runId": "r", "batchId": 7, "timestamp": "2026-11-27T10:00:00.000Z", "numInputRows": 500,
    "inputRowsPerSecond": 50.0, "processedRowsPerSecond": 250.0,
    "durationMs": {"addBatch": 1500, "triggerExecution": 2000},
    "stateOperators": [{"operatorName": "stateStoreSave", "numRowsTotal": 1200, "memoryUsedBytes": 40960,
                        "numShufflePartitions": 4}],
    "sources": [
        {"description": "KafkaV2[Subscribe[orders]]", "startOffset": {"orders": {"0": 100, "1": 200}},
         "endOffset": {"orders": {"0": 350, "1": 450}}, "latestOffset": {"orders": {"0": 400, "1": 1450}}},
        {"description": "FileStreamSource[/in]", "startOffset": {"logOffset": 3}, "endOffset": {"logOffset": 4}},
    ],
}


def test_a_batchs_progress_becomes_a_point_with_the_kafka_backlog():
    point = point_of(KAFKA_PROGRESS, trigger_interval_ms=10_000, cores=4, executors=2, run_id="run-1")
    assert (point.batch_id, point.run_id, point.idle) == (7, "run-1", False)
    assert (point.duration_ms, point.trigger_interval_ms, point.utilization) == (2000, 10_000, 0.2)
    assert (point.input_rows, point.input_rate, point.processed_rate, point.cores) == (500, 50.0, 250.0, 4)
    assert point.backlog == 50 + 1000  # latest minus end, per partition, summed
    assert (point.operators[0].rows, point.operators[0].memory_bytes, point.state_partitions) == (1200, 40960, 4)
    texts = {**KAFKA_PROGRESS, "sources": [{"endOffset": json.dumps({"t": {"0": 5}}), "latestOffset": '{"t": {"0": 9}}'}]}
    assert point_of(texts).backlog == 4  # offsets given as JSON text
    assert backlog_of(KAFKA_PROGRESS["sources"][1:]) is None  # a file source gives none
    assert point_of({**KAFKA_PROGRESS, "sources": []}).backlog is None


def test_an_idle_trigger_is_a_point_of_utilization_zero_and_junk_is_no_point():
    idle = point_of({"batchId": 8, "timestamp": "2026-11-27T10:00:10Z", "numInputRows": 0,
                     "durationMs": {"triggerExecution": 3}})
    assert idle.idle and idle.utilization == 0.0
    for junk in (None, [], {"batchId": "7"}, {"batchId": 1, "timestamp": "yesterday"}, {"batchId": -1, "timestamp": "x"}):
        assert point_of(junk) is None
    assert point_of({**KAFKA_PROGRESS, "processedRowsPerSecond": float("nan")}).processed_rate is None


def points(n: int, start: int = 0) -> list[MetricPoint]:
    return [MetricPoint(batch_id=i, time=1_800_000_000.0 + i, run_id="r", input_rate=1.0) for i in range(start, start + n)]


def test_the_series_keeps_the_last_points_and_is_written_whole(tmp_path):
    store = Store(str(tmp_path))
    append_points(store, points(8), keep=5)
    kept = append_points(store, points(4, start=8) + points(1, start=7), keep=5)  # batch 7 seen again: once
    assert [p.batch_id for p in kept] == [7, 8, 9, 10, 11]
    assert [p.batch_id for p in read_series(store)] == [7, 8, 9, 10, 11]
    assert [p.name for p in tmp_path.iterdir()] == [METRICS_FILE]  # no temporary file left beside it


def test_the_series_stays_below_the_readers_cap_however_many_operators_a_query_has(tmp_path):
    store = Store(str(tmp_path))
    wide = [p.model_copy(update={"operators": [OperatorPoint(name=f"op{i}", rows=10**9, memory_bytes=10**12,
                                                                          partitions=200) for i in range(40)]})
            for p in points(720)]
    kept = write_series(store, wide)
    assert 0 < len(kept) < 720 and kept[-1].batch_id == 719  # the oldest went, the newest stayed
    assert (tmp_path / METRICS_FILE).stat().st_size <= MAX_SERIES_BYTES
    assert [p.batch_id for p in read_series(store)] == [p.batch_id for p in kept]  # and it is still readable


def test_a_missing_or_garbled_series_reads_as_empty_with_a_warning(tmp_path):
    store = Store(str(tmp_path))
    assert read_series(store) == []
    for garbled in (b"{not json", b"[1, 2]", b'{"points": 3}', b"\xff\xfe"):
        (tmp_path / METRICS_FILE).write_bytes(garbled)
        warnings: list[str] = []
        assert read_series(store, warnings) == []
        assert warnings and METRICS_FILE in warnings[0], garbled
    good = points(2)[0].model_dump()
    (tmp_path / METRICS_FILE).write_text(json.dumps({"points": [good, {"batch_id": "x"}, "junk", {**good, "batch_id": 1}]}))
    warnings = []
    assert [p.batch_id for p in read_series(store, warnings)] == [0, 1]
    assert "2 point(s) of the wrong shape ignored" in warnings[0]
    (tmp_path / METRICS_FILE).write_text("{garbled")
    assert [p.batch_id for p in append_points(store, points(1))] == [0]  # a garbled series is replaced, not a failure


def test_the_decision_history_is_bounded_and_tolerant(tmp_path):
    store = Store(str(tmp_path))
    for i in range(7):
        append_decision(store, {"at_epoch": i, "outcome": "held"}, keep=3)
    assert [d["at_epoch"] for d in read_decisions(store)] == [4, 5, 6]
    (tmp_path / AUTOSCALE_FILE).write_text('{"decisions": [{"at_epoch": 1}, 2, "x"]}')
    assert read_decisions(store) == [{"at_epoch": 1}]
    (tmp_path / AUTOSCALE_FILE).write_text("garbled")
    assert read_decisions(store) == []


# --- the in-job helper's recorder ------------------------------------------------------------------------
class FakeQuery:
    def __init__(self) -> None:
        self.recentProgress: list[dict] = []

    @property
    def lastProgress(self):  # noqa: N802 - Spark's name
        return self.recentProgress[-1] if self.recentProgress else None

    def run(self, batch: int) -> None:
        self.recentProgress.append({**KAFKA_PROGRESS, "batchId": batch, "timestamp": f"2026-11-27T10:00:{batch:02d}Z"})


def test_the_recorder_takes_every_new_batch_once_and_writes_them_with_the_heartbeat(tmp_path):
    store = Store(str(tmp_path))
    query = FakeQuery()
    recorder = MetricsRecorder(store, "run-1", trigger_interval_ms=10_000, cores=lambda: 2, keep=4)
    recorder.observe(query)  # no batch yet
    query.run(0)
    recorder.observe(query)
    recorder.observe(query)  # the same batch again
    query.run(1), query.run(2), query.run(3)  # three batches between two polls: all taken
    recorder.observe(query)
    assert read_series(store) == []  # nothing written before the heartbeat
    recorder.flush()
    assert [(p.batch_id, p.cores, p.run_id) for p in read_series(store)] == [(0, 2, "run-1"), (1, 2, "run-1"),
                                                                              (2, 2, "run-1"), (3, 2, "run-1")]
    query.run(4)
    recorder.observe(query)
    recorder.flush()
    assert [p.batch_id for p in read_series(store)] == [1, 2, 3, 4]  # bounded


def test_the_recorder_never_fails_the_run(tmp_path):
    class Broken:
        @property
        def lastProgress(self):  # noqa: N802 - Spark's name
            raise RuntimeError("py4j gone")

    (tmp_path / "file").write_text("")
    recorder = MetricsRecorder(Store(str(tmp_path / "file" / "below")), "run-1")  # a folder that cannot be made
    recorder.observe(Broken())
    query = FakeQuery()
    query.run(0)
    recorder.observe(query)
    recorder.flush()  # the write fails: logged, the point kept for the next write
    assert len(recorder.pending) == 1
