"""Savepoints of queries reading a real Kafka topic (one KRaft broker per session, tests/support/kafka.py).

A stateful query (count and sum per key) reads a topic of 3 partitions a few records per batch. A
periodic savepoint is taken while it runs, then it is stopped between batches and a stop savepoint
taken; more records arrive; each savepoint is restored into a new checkpoint and the query continued
from it. Its final counts and sums must be those of an uninterrupted run over all the records, and
those computed from the records themselves: no record read twice or lost (exactly once).

Restore safety ("input gone"): records a savepoint resumes at that Kafka deleted (as retention does,
with the admin API's delete-records) refuse the restore, naming topic, partition and gap, unless the
user accepts the loss (``skip_missing_input``, and the query's ``failOnDataLoss=false``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.core.input_check import kafka_gaps, savepoint_kafka_offsets
from airflow_savepoints.errors import InputCheckFailedError, KafkaOffsetsGoneError
from airflow_savepoints.jobs.description.model import KafkaSettings, StreamingJob
from airflow_savepoints.jobs.driver.control import _stop_between_batches
from airflow_savepoints.jobs.workflows.autoscale import broker_backlog
from airflow_savepoints.jobs.workflows.lifecycle import _prepare_checkpoint
from airflow_savepoints.jobs.workflows.run import JobContext
from airflow_savepoints.storage import Store
from tests.conftest import free_port
from tests.support.spark_shapes import DEFAULT_CONF, run_to_end, wait_for_batch

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

PARTITIONS, KEYS, PER_BATCH = 3, 5, 30
EARLY, FIRST, SECOND = 90, 150, 210  # records: before the first run, before its stop, before the restored runs


def records(start: int, stop: int) -> list[tuple[int, bytes, bytes]]:
    """``(partition, key, value)``: record i goes to partition i % 3 with key k<i % 5> and value i."""
    return [(i % PARTITIONS, f"k{i % KEYS}".encode(), str(i).encode()) for i in range(start, stop)]


def expected_totals(stop: int) -> dict[str, list[int]]:
    counts, sums = Counter(), Counter()
    for i in range(stop):
        counts[f"k{i % KEYS}"] += 1
        sums[f"k{i % KEYS}"] += i
    return {key: [counts[key], sums[key]] for key in counts}


def start_query(spark, bootstrap: str, topic: str, checkpoint: str, sink: Path, *, once: bool = False, **options: str):
    """Count and sum per key, 30 records per batch; each batch's rows go to ``sink/batch-<id>.json``.
    ``once``: every record there now, then stop (``availableNow``)."""
    from pyspark.sql import functions as F

    for key, value in DEFAULT_CONF.items():
        spark.conf.set(key, value)
    frame = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", PER_BATCH).options(**options).load())
    totals = (frame.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").cast("long").alias("value"))
              .groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total")))

    def write(batch, batch_id):
        rows = {r["key"]: [r["n"], r["total"]] for r in batch.collect()}
        sink.mkdir(parents=True, exist_ok=True)
        (sink / f"batch-{batch_id}.json").write_text(json.dumps(rows))

    writer = totals.writeStream.outputMode("update").option("checkpointLocation", checkpoint).foreachBatch(write)
    return writer.trigger(availableNow=True).start() if once else writer.trigger(processingTime="200 milliseconds").start()


def batch_ids(sink: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in sink.glob("batch-*.json"))


def final_totals(*parts: tuple[Path, int]) -> dict[str, list[int]]:
    """Each key's newest [count, sum] over the batches of each sink up to the given id, sink after sink."""
    latest: dict[str, list[int]] = {}
    for sink, last in parts:
        for batch in batch_ids(sink):
            if batch <= last:
                latest.update(json.loads((sink / f"batch-{batch}.json").read_text()))
    return latest


def test_savepoints_of_a_kafka_query_restore_exactly_once(spark, kafka_broker, kafka_topic, tmp_path):
    kafka_broker.produce(kafka_topic, records(0, EARLY))
    checkpoint, savepoints, sink = str(tmp_path / "checkpoint"), str(tmp_path / "savepoints"), tmp_path / "sink"
    query = start_query(spark, kafka_broker.bootstrap, kafka_topic, checkpoint, sink)
    try:
        wait_for_batch(query, 1)
        periodic = take_savepoint(checkpoint, "kafka-job", savepoint_dir=savepoints, savepoint_type="periodic")
        kafka_broker.produce(kafka_topic, records(EARLY, FIRST))
        wait_for_batch(query, FIRST // PER_BATCH - 1)  # it keeps running past the savepoint
        assert _stop_between_batches(query, timeout=60)
    finally:
        query.stop()
    stop = take_savepoint(checkpoint, "kafka-job", savepoint_dir=savepoints, savepoint_type="stop")
    assert stop.manifest.batch_id > periodic.manifest.batch_id
    for info in (periodic, stop):
        verify_savepoint(info.pointer)
        offsets = info.manifest.source_offsets["0"]  # Kafka's own offsets JSON, per topic and partition
        assert set(offsets) == {kafka_topic} and set(offsets[kafka_topic]) == {str(p) for p in range(PARTITIONS)}
        assert sum(offsets[kafka_topic].values()) == PER_BATCH * (info.manifest.batch_id + 1)  # maxOffsetsPerTrigger each
    shown = CliRunner().invoke(app, ["show", stop.pointer, "--json"])
    assert json.loads(shown.stdout)["manifest"]["source_offsets"] == stop.manifest.source_offsets

    kafka_broker.produce(kafka_topic, records(FIRST, SECOND))
    # the autoscaler's backlog, asked of the broker: its latest offsets past the offsets the last batch ended at
    job = StreamingJob(name="kafka-job", application="job.py", checkpoint=checkpoint,
                       kafka={"bootstrap_servers": kafka_broker.bootstrap})
    backlog, read = broker_backlog(JobContext(job, Store(savepoints)), checkpoint)
    assert (backlog, read["batch_id"], read["partitions"]) == (SECOND - PER_BATCH * (stop.manifest.batch_id + 1),
                                                               stop.manifest.batch_id, PARTITIONS), read
    elsewhere = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")  # no broker there
    nowhere = JobContext(job.model_copy(update={"kafka": elsewhere}), Store(savepoints))
    warnings: list[str] = []
    assert broker_backlog(nowhere, checkpoint, warnings)[0] is None and "Spark's progress used" in warnings[0], warnings
    reference_sink = tmp_path / "reference-sink"
    reference = start_query(spark, kafka_broker.bootstrap, kafka_topic, str(tmp_path / "reference-checkpoint"), reference_sink)
    run_to_end(reference)
    reference.stop()
    everything = expected_totals(SECOND)
    assert final_totals((reference_sink, 10**6)) == everything

    for info in (periodic, stop):
        restored, restored_sink = str(tmp_path / f"restored-{info.manifest.type}"), tmp_path / f"sink-{info.manifest.type}"
        restore_savepoint(info.pointer, restored)
        continued = start_query(spark, kafka_broker.bootstrap, kafka_topic, restored, restored_sink)
        run_to_end(continued)
        continued.stop()
        n = info.manifest.batch_id
        assert batch_ids(restored_sink)[0] == n + 1
        assert final_totals((sink, n), (restored_sink, 10**6)) == everything


def test_a_restore_is_refused_when_kafka_deleted_records_the_savepoint_resumes_at(spark, kafka_broker, kafka_topic, tmp_path):
    kafka_broker.produce(kafka_topic, records(0, 45))
    checkpoint, sink = str(tmp_path / "checkpoint"), tmp_path / "sink"
    query = start_query(spark, kafka_broker.bootstrap, kafka_topic, checkpoint, sink, once=True)
    query.awaitTermination(120)
    info = take_savepoint(checkpoint, "kafka-job", savepoint_dir=str(tmp_path / "savepoints"), savepoint_type="stop")
    assert info.manifest.source_offsets["0"] == {kafka_topic: {"0": 15, "1": 15, "2": 15}}
    kafka_broker.produce(kafka_topic, records(45, 90))  # 15 more records per partition
    kafka_broker.delete_records(kafka_topic, {1: 19})  # as retention would: 4 records the savepoint still needs
    target = tmp_path / "checkpoint-restored"  # a start of this job restores only into <checkpoint>-<suffix>

    with pytest.raises(KafkaOffsetsGoneError) as refused:
        restore_savepoint(info.pointer, str(target), kafka_bootstrap_servers=kafka_broker.bootstrap)
    assert f"topic {kafka_topic} partition 1: the savepoint resumes at offset 15, the earliest offset is now 19 " \
           "(4 record(s) deleted)" in refused.value.message
    assert "partition 0" not in refused.value.message and "failOnDataLoss=false" in refused.value.hint
    assert not target.exists()
    result = CliRunner().invoke(app, ["restore", info.pointer, "--to", str(target), "--kafka-bootstrap-servers",
                                      kafka_broker.bootstrap, "--json"])
    assert result.exit_code != 0 and json.loads(result.stdout)["error"]["code"] == "kafka_offsets_gone", result.stdout
    job = StreamingJob(name="kafka-job", application="job.py", checkpoint=checkpoint,
                       kafka={"bootstrap_servers": kafka_broker.bootstrap})  # a job's `kafka:` in jobs.yaml
    with pytest.raises(KafkaOffsetsGoneError, match=f"topic {kafka_topic} partition 1: "):  # what job start restores with
        _prepare_checkpoint(JobContext(job, Store(str(tmp_path / "savepoints"))), info.pointer, False, str(target), {})
    assert not target.exists()
    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.raises(InputCheckFailedError, match=f"from {nowhere}: .*Unable to bootstrap"):  # refused, not skipped
        restore_savepoint(info.pointer, str(target), kafka_bootstrap_servers=nowhere,
                          kafka_options={"bootstrap_timeout_ms": 1500, "request_timeout_ms": 1500})
    assert not target.exists()

    # the user accepts the loss: restored, and the query (failOnDataLoss=false) goes on without those 4 records
    restore_savepoint(info.pointer, str(target), kafka_bootstrap_servers=kafka_broker.bootstrap, skip_missing_input=True)
    continued = start_query(spark, kafka_broker.bootstrap, kafka_topic, str(target), sink, once=True, failOnDataLoss="false")
    continued.awaitTermination(120)
    lost = {i for i in range(45, 90) if i % PARTITIONS == 1 and i < 45 + 3 * 4}  # partition 1's offsets 15..18
    assert len(lost) == 4
    counts, sums = Counter(), Counter()
    for i in set(range(90)) - lost:
        counts[f"k{i % KEYS}"] += 1
        sums[f"k{i % KEYS}"] += i
    assert final_totals((sink, 10**6)) == {key: [counts[key], sums[key]] for key in counts}

    past = kafka_gaps({kafka_topic: {0: 10**6}}, kafka_broker.bootstrap)
    assert [g.describe() for g in past] == [f"topic {kafka_topic} partition 0: the savepoint resumes at offset 1000000, "
                                            "past the newest offset 30 (was the topic deleted and made again?)"]
    kafka_broker.delete_topic(kafka_topic)
    deadline = time.monotonic() + 30
    while (gone := kafka_gaps(savepoint_kafka_offsets(info.manifest), kafka_broker.bootstrap)) != [] and \
            gone[0].earliest is not None and time.monotonic() < deadline:
        time.sleep(0.5)  # the deletion reaches the metadata the client sees
    assert [g.describe() for g in gone] == [f"topic {kafka_topic} partition {p} no longer exists (the savepoint resumes at "
                                            "offset 15)" for p in range(PARTITIONS)]


def test_a_kafka_sink_refuses_repeats_by_count_and_allow_repeats_writes_exactly_those_batches_again(
        spark, kafka_broker, kafka_topic, tmp_path):
    """Issue 39: a Kafka sink records no batch ids, so a restore of a savepoint at batch N after the job ran
    to M writes batches N+1..M to it again. A start from it (jobs.yaml ``sink: {kind: kafka}``, M from the
    run record's checkpoint) is refused with that count (``sink_repeats``, nothing restored); accepted with
    ``allow_repeats``, the output topic then holds exactly those batches' records twice."""
    from pyspark.sql import functions as F

    from airflow_savepoints.errors import SinkRepeatsError

    out = kafka_broker.create_topic(kafka_topic + "-out", 1)
    for key, value in DEFAULT_CONF.items():
        spark.conf.set(key, value)

    def copy(checkpoint: str):
        """The input's values to the output topic, 30 records per batch, until the input is read."""
        frame = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka_broker.bootstrap)
                 .option("subscribe", kafka_topic).option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", PER_BATCH).load())
        return (frame.select(F.col("value")).writeStream.format("kafka")
                .option("kafka.bootstrap.servers", kafka_broker.bootstrap).option("topic", out)
                .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    checkpoint, savepoints = str(tmp_path / "checkpoint"), str(tmp_path / "savepoints")
    kafka_broker.produce(kafka_topic, records(0, 2 * PER_BATCH))
    copy(checkpoint).awaitTermination(120)  # batches 0..1
    early = take_savepoint(checkpoint, "kafka-out", savepoint_dir=savepoints, savepoint_type="manual")
    assert early.manifest.batch_id == 1
    kafka_broker.produce(kafka_topic, records(2 * PER_BATCH, FIRST))
    query = copy(checkpoint)  # the job runs on: batches 2..4, every record read
    query.awaitTermination(120)
    last = FIRST // PER_BATCH - 1
    assert query.lastProgress["batchId"] == last

    # as `job start --from` restores it: the jobs file's `sink: {kind: kafka}`, the run record naming the live checkpoint
    from datetime import UTC, datetime

    from airflow_savepoints.jobs.description.record import JobRun, write_run

    job = StreamingJob(name="kafka-out", application="job.py", checkpoint=checkpoint, savepoint_dir=savepoints,
                       sink={"kind": "kafka"})
    ctx = JobContext(job, Store(savepoints))
    write_run(ctx.folder, JobRun(job="kafka-out", checkpoint=checkpoint, started_at=datetime.now(UTC), ended="stopped"))
    target = tmp_path / "checkpoint-restored"  # where a start restores: <checkpoint>-<suffix>
    with pytest.raises(SinkRepeatsError) as refused:
        _prepare_checkpoint(ctx, early.pointer, False, str(target), {})
    assert "writes batches 2..4 (3 batches) to it again" in refused.value.message, refused.value.message
    assert "--allow-repeats" in refused.value.hint and not target.exists()

    _, _, restored = _prepare_checkpoint(ctx, early.pointer, False, str(target), {"allow_repeats": True})
    result = restored["sink"]  # what job start reports as `sink`
    assert (result["kind"], result["rerun"], result["on_rerun"]) == ("kafka", [2, last], "written_again"), result
    continued = copy(str(target))
    continued.awaitTermination(120)
    written = Counter(int(row["value"]) for row in spark.read.format("kafka")
                      .option("kafka.bootstrap.servers", kafka_broker.bootstrap).option("subscribe", out)
                      .option("startingOffsets", "earliest").load().select(F.col("value").cast("string")).collect())
    resumes_at = {int(p): offset for p, offset in early.manifest.source_offsets["0"][kafka_topic].items()}
    offset_of = {i: i // PARTITIONS for i in range(FIRST)}  # record i is partition i % 3's offset i // 3
    again = {i for i in range(FIRST) if offset_of[i] >= resumes_at[i % PARTITIONS]}
    assert len(again) == (last - 1) * PER_BATCH  # batches 2..4
    assert {i for i, n in written.items() if n == 2} == again
    assert {i for i, n in written.items() if n == 1} == set(range(FIRST)) - again and max(written.values()) == 2
