"""Rescale through a savepoint: ``restore_savepoint(..., state_partitions=N)`` on real Spark 4.2.

Each shape runs once over all its input (the uninterrupted run); a savepoint is taken while it runs.
The savepoint is restored with a rescale (Spark's offline repartition on the copy) and the restored
query runs to the end: each of its batches equals the uninterrupted run's batch one earlier (Spark's
repartition batch takes one batch id), its state has N partitions, and the savepoint still verifies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.cli.main import app
from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.core.models import RestoreResult
from airflow_savepoints.core.rescale import RescalePlan, repartition
from airflow_savepoints.errors import (
    InvalidInputError,
    RescaleFailedError,
    RescaleRefusedError,
    RescaleUnsupportedStateError,
    SinkAheadError,
)
from airflow_savepoints.storage import Store
from tests.data.make_spark35_checkpoints import INPUT as INPUT35
from tests.data.make_spark35_checkpoints import write_input as write_input35
from tests.support.spark_shapes import (
    DEFAULT_CONF,
    ROCKS_CHANGELOG,
    SHAPES,
    Shape,
    _stream,
    run_to_end,
    session_conf,
    wait_for_batch,
)

pytestmark = pytest.mark.slow
ALL_FILES = 6
DATA35 = Path(__file__).parent / "data" / "spark35"


def _dedup_then_window(spark, root: Path):
    """Two stateful operators in a chain: dedup within the watermark, then a windowed count."""
    from pyspark.sql import functions as F

    events = _stream(spark, root / "events", "id long, ts timestamp, v long").withWatermark("ts", "10 minutes")
    return events.dropDuplicatesWithinWatermark(["id"]).groupBy(F.window("ts", "5 minutes")).agg(
        F.count("*").alias("n"), F.sum("id").alias("ids"))


def _rocks(name: str, like: str, **kw) -> Shape:
    return Shape(name, dict(ROCKS_CHANGELOG), SHAPES[like].inputs, SHAPES[like].build, **kw)


def _uncompacted(shape: Shape) -> Shape:
    """``shape`` with its file source's log never compacted in these few batches: a savepoint with a planned batch
    N+1 then holds batch N's log entries apart, and the restored query's batches match the uninterrupted run's one
    for one (with a compaction at N+1 it reads N+1's and N+2's files in one batch; see rescale.trailing_files)."""
    return replace(shape, sql_conf={**shape.sql_conf, "spark.sql.streaming.fileSource.log.compactInterval": "100"})


# shape, partitions of the running query, partitions asked of the restore: each shape in one direction
RESCALES = {
    "aggregation": (SHAPES["rocksdb_changelog"], 3, 5),
    "stream_join": (_rocks("stream_join_rocksdb", "stream_join", output_mode="append"), 5, 2),
    "dedup_watermark": (_rocks("dedup_rocksdb", "dedup_watermark", output_mode="append"), 3, 5),
    "chain": (Shape("chain_rocksdb", dict(ROCKS_CHANGELOG), SHAPES["dedup_watermark"].inputs, _dedup_then_window,
                    output_mode="append"), 5, 2),
    "transform_with_state": (SHAPES["transform_with_state"], 3, 5),
    "checkpoint_v2": (SHAPES["rocksdb_v2"], 5, 2),
}
RESCALES = {name: (_uncompacted(shape), before, after) for name, (shape, before, after) in RESCALES.items()}


def _with_partitions(spark, count: int):
    spark.conf.set("spark.sql.shuffle.partitions", str(count))


@pytest.fixture(scope="module")
def running_savepoints(spark, tmp_path_factory):
    """Per shape (made once, when first asked): a savepoint of the RUNNING query, and the sink of that
    same query run on, uninterrupted, over all the input."""
    cache: dict[str, tuple] = {}

    def taken(name: str):
        if name not in cache:
            shape, before, _ = RESCALES[name]
            base = tmp_path_factory.mktemp(f"rescale-{name}")
            shape.write_input(base / "input", 0, ALL_FILES)
            _with_partitions(spark, before)
            try:
                query = shape.start(spark, base / "input", str(base / "checkpoint"), base / "sink")
                wait_for_batch(query, 2)
                info = take_savepoint(str(base / "checkpoint"), name.replace("_", "-"), savepoint_dir=str(base / "sp"))
                assert query.isActive
                run_to_end(query)
                query.stop()
            finally:
                _with_partitions(spark, 2)
            cache[name] = (shape, base, info, shape.read_sink(base / "sink"))
        return cache[name]

    return taken


def _state_files(checkpoint: Path) -> list[str]:
    return [str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()]


def _committed(checkpoint: Path) -> int:
    return max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("name", sorted(RESCALES))
def test_rescale_round_trip(spark, running_savepoints, name, tmp_path):
    shape, before, after = RESCALES[name]
    _, base, info, uninterrupted = running_savepoints(name)
    n = info.manifest.batch_id
    operators = info.manifest.state_store.operators
    assert operators and info.manifest.state_store.partitions == dict.fromkeys(operators, before)

    restored = tmp_path / "restored"
    if name == "dedup_watermark":  # through the CLI (in-process: Spark's active session rescales)
        out = CliRunner().invoke(app, ["restore", info.pointer, "--to", str(restored), "--state-partitions", str(after),
                                       "--json"])
        assert out.exit_code == 0, out.output
        result = RestoreResult.model_validate_json(out.stdout)
    else:
        result = restore_savepoint(info.pointer, str(restored), state_partitions=after, spark_session=spark)
    assert result.rescaled and result.repartition_batch_id == n + 1
    assert result.partitions_before == dict.fromkeys(operators, before)
    assert result.partitions_after == dict.fromkeys(operators, after)
    assert result.dropped_trailing_batch == (n + 1 if info.manifest.includes_next_offsets else None)
    linked = [e.path for e in info.manifest.files if e.path.startswith("state/") and (restored / e.path).exists()
              if (restored / e.path).stat().st_ino == (Path(info.pointer) / e.path).stat().st_ino]
    assert linked, "the restore hard-linked the state files it copied"
    # into fewer partitions: the old partitions' folders past the new count are gone (a later savepoint counts folders)
    assert formats.state_partitions(_state_files(restored)) == dict.fromkeys(operators, after)
    verify_savepoint(info.pointer)  # Spark rewrote the copy only, never a linked file in place

    query = shape.start(spark, base / "input", str(restored), tmp_path / "sink")
    run_to_end(query)
    query.stop()
    output = shape.read_sink(tmp_path / "sink")
    assert min(output) == n + 2, "the query continues after Spark's repartition batch"
    assert {b - 1: rows for b, rows in output.items()} == {b: rows for b, rows in uninterrupted.items() if b > n}
    last = _committed(restored)
    assert last == max(uninterrupted) + 1
    assert formats.state_partitions(_state_files(restored), version=last + 1) == dict.fromkeys(operators, after)
    verify_savepoint(info.pointer)


def _dedup_file_shape() -> Shape:
    """Dedup within the watermark into a file sink whose log compacts every 3 batches (2, 5, 8: the repartition
    batch 5 is one the query never runs through the sink)."""
    shape = _rocks("dedup_file_sink", "dedup_watermark", output_mode="append", file_sink=True)
    shape.sql_conf["spark.sql.streaming.fileSink.log.compactInterval"] = "3"
    return shape


def _first_seen(files: int) -> dict[int, int]:
    """What dedup within the watermark keeps over ``files`` input files: each id once, from its first file."""
    seen: dict[int, int] = {}
    for index in range(files):
        for row in SHAPES["dedup_watermark"].inputs(index)["events"]:
            seen.setdefault(row["id"], row["v"])
    return seen


def test_trailing_batch_with_the_exactly_once_file_sink(spark, tmp_path):
    """A savepoint holding offsets/N+1 without commits/N+1: the rescale leaves batch N+1 out of the copy
    (Spark refuses LAST_BATCH_FAILED otherwise) and its input is read again after the repartition batch.
    Refused when the file sink already holds N+1 (it would get that output twice); else no duplicate, no loss."""
    shape, inputs, checkpoint, sink = _dedup_file_shape(), tmp_path / "input", tmp_path / "checkpoint", tmp_path / "sink"
    shape.write_input(inputs, 0, 6)
    _with_partitions(spark, 3)
    try:
        query = shape.start(spark, inputs, str(checkpoint), sink)
        run_to_end(query)
        query.stop()
    finally:
        _with_partitions(spark, 2)
    assert _committed(checkpoint) == 5
    for crashed in ("commits/5", "commits/.5.crc"):  # the driver died after batch 5's state and sink, before its commit
        (checkpoint / crashed).unlink(missing_ok=True)
    info = take_savepoint(str(checkpoint), "dedup-file", savepoint_dir=str(tmp_path / "sp"))
    assert info.manifest.batch_id == 4 and info.manifest.includes_next_offsets and info.manifest.includes_next_state

    target = tmp_path / "restored"
    with pytest.raises(SinkAheadError, match="get its output twice"):  # the sink committed batch 5
        restore_savepoint(info.pointer, str(target), state_partitions=5, sink_path=str(sink), spark_session=spark)
    assert not target.exists()

    for crashed in ("5", ".5.crc", "5.compact", ".5.compact.crc"):  # now: the driver died before the sink committed 5
        (sink / "_spark_metadata" / crashed).unlink(missing_ok=True)
    result = restore_savepoint(info.pointer, str(target), state_partitions=5, sink_path=str(sink), spark_session=spark)
    assert result.dropped_trailing_batch == 5 and result.repartition_batch_id == 5 and result.rescaled
    assert result.partitions_before == {"0": 3} and result.partitions_after == {"0": 5}
    shape.write_input(inputs, 6, 10)
    query = shape.start(spark, inputs, str(target), sink)  # the job's own sink, continued
    run_to_end(query)
    query.stop()

    log = sorted(p.name for p in (sink / "_spark_metadata").iterdir() if not p.name.startswith("."))
    # the repartition batch 5 (a compaction batch here) was recorded in the sink's log by Spark's FileStreamSinkLog,
    # so the sink's next compaction (batch 8) finds every batch before it
    assert "5.compact" in log and "8.compact" in log, log
    rows = [r.asDict() for r in spark.read.json(str(sink)).collect()]  # what a reader of the sink sees (its log)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "no duplicates"
    assert {r["id"]: r["v"] for r in rows} == _first_seen(10), "no loss"
    verify_savepoint(info.pointer)


def test_failure_in_spark_rewrite_leaves_the_target_empty(spark, running_savepoints, tmp_path):
    """A real fault inside Spark's rewrite (a file where it must create a new partition's folder): the
    error says so, the target is left empty (our copy and what Spark wrote), the savepoint intact."""
    _, _, info, _ = running_savepoints("aggregation")
    target = tmp_path / "restored"
    copied: list[str] = []
    planned: dict[str, int] = {}

    def block_new_partition(event: str, data: dict) -> None:
        if event == "planned":
            planned.update(data)
        elif event == "file_done":
            copied.append(data["path"])
        if event == "file_done" and len(copied) == planned["files"]:
            (target / "state" / "0" / "4").write_text("in the way of Spark's new partition folder\n")

    with pytest.raises(RescaleFailedError) as raised:
        restore_savepoint(info.pointer, str(target), state_partitions=5, spark_session=spark, on_event=block_new_partition)
    assert "Spark's repartition of" in raised.value.message and "partitionId=4" in raised.value.message  # Spark's own words
    assert raised.value.code == "rescale_failed" and raised.value.hint
    assert not target.exists() or not [p for p in target.rglob("*") if p.is_file()]
    verify_savepoint(info.pointer)


@pytest.fixture(scope="module")
def spark35_savepoints(tmp_path_factory):
    """Savepoints of the Spark 3.5 checkpoints (HDFS and RocksDB state, 2 partitions), taken once."""
    base = tmp_path_factory.mktemp("rescale-spark35")
    taken = {}
    for name in ("hdfs", "rocksdb"):
        shutil.copytree(DATA35 / name, base / name)
        taken[name] = take_savepoint(str(base / name), f"legacy-{name}", savepoint_dir=str(base / "sp"))
    return taken


def test_hdfs_state_is_refused_before_anything_is_written(spark35_savepoints, tmp_path):
    info = spark35_savepoints["hdfs"]
    with pytest.raises(RescaleUnsupportedStateError) as raised:
        restore_savepoint(info.pointer, str(tmp_path / "restored"), state_partitions=4)
    assert raised.value.code == "rescale_unsupported_state"
    assert "RocksDBStateStoreProvider" in raised.value.hint and "spark.sql.streaming.stateStore.providerClass" in raised.value.hint
    assert not (tmp_path / "restored").exists()

    result = CliRunner().invoke(app, ["restore", info.pointer, "--to", str(tmp_path / "cli"), "--state-partitions", "4",
                                      "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["error"]["code"] == "rescale_unsupported_state"
    assert not (tmp_path / "cli").exists()
    verify_savepoint(info.pointer)


def test_spark_refusal_keeps_its_message_under_our_code(spark, spark35_savepoints, tmp_path):
    """Spark's own refusal (our check bypassed): its error class picks the code, its message is kept."""
    restored = tmp_path / "restored"
    info = spark35_savepoints["rocksdb"]
    restore_savepoint(info.pointer, str(restored))
    with pytest.raises(RescaleRefusedError) as raised:
        repartition(Store(str(restored)), RescalePlan(4, 2), info.manifest, {}, spark)
    assert raised.value.code == "rescale_refused"
    assert raised.value.message.startswith("[STATE_REWRITER_INVALID_CHECKPOINT.MISSING_OPERATOR_METADATA]")


@pytest.mark.parametrize("partitions", [0, -3])
def test_fewer_than_one_partition_is_invalid_input(spark35_savepoints, tmp_path, partitions):
    with pytest.raises(InvalidInputError, match="state_partitions"):
        restore_savepoint(spark35_savepoints["rocksdb"].pointer, str(tmp_path / "r"), state_partitions=partitions)
    assert not (tmp_path / "r").exists()


def test_same_partition_count_is_a_plain_restore(spark35_savepoints, tmp_path):
    info = spark35_savepoints["rocksdb"]
    result = restore_savepoint(info.pointer, str(tmp_path / "r"), state_partitions=2)
    assert not result.rescaled and result.repartition_batch_id is None
    assert result.partitions_before == result.partitions_after == {"0": 2}
    assert _committed(tmp_path / "r") == info.manifest.batch_id  # no repartition batch


def test_spark35_savepoint_rescaled_through_one_batch_on_spark4(spark, spark35_savepoints, tmp_path):
    """Engine upgrade with a rescale on the way. Spark 3.5 wrote no operator metadata, which Spark's repartition
    needs: the rescale is refused before anything is written. The documented way: restore on 4.2, run a batch
    (Spark writes the metadata), take a new savepoint, rescale it 2 -> 3; the totals then cover all input."""
    from pyspark.sql import functions as F

    info = spark35_savepoints["rocksdb"]
    with pytest.raises(RescaleRefusedError, match="operator metadata") as raised:
        restore_savepoint(info.pointer, str(tmp_path / "refused"), state_partitions=3, spark_session=spark)
    assert "run the job on Spark 4.2" in raised.value.hint
    assert not (tmp_path / "refused").exists()

    shutil.rmtree(INPUT35, ignore_errors=True)
    write_input35(0, 8)
    upgraded = tmp_path / "upgraded"
    conf = restore_savepoint(info.pointer, str(upgraded)).spark_conf_to_set
    for key in DEFAULT_CONF:  # the session is shared: back to Spark's defaults, which wrote these logs
        spark.conf.unset(key)
    for key, value in conf.items():
        spark.conf.set(key, value)
    latest: dict[str, tuple[int, int]] = {}

    def collect(frame, batch_id):
        for row in frame.collect():
            latest[row.key] = (row.n, row.total)

    def start(checkpoint: Path):
        frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(str(INPUT35))
        return (frame.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
                .writeStream.outputMode("update").foreachBatch(collect).trigger(processingTime="200 milliseconds")
                .option("checkpointLocation", str(checkpoint)).start())

    query = start(upgraded)
    wait_for_batch(query, 5)
    query.stop()  # one or more batches on 4.2: the operator metadata is written
    on_spark4 = take_savepoint(str(upgraded), "legacy-rocksdb", savepoint_dir=str(tmp_path / "sp"))
    restored = tmp_path / "restored"
    result = restore_savepoint(on_spark4.pointer, str(restored), state_partitions=3, spark_session=spark)
    assert result.rescaled and result.partitions_before == {"0": 2} and result.partitions_after == {"0": 3}
    verify_savepoint(on_spark4.pointer)
    query = start(restored)
    query.processAllAvailable()
    query.stop()
    expected: dict[str, list[int]] = {}
    for part in sorted(INPUT35.glob("part-*.json")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            n, total = expected.get(row["key"], [0, 0])
            expected[row["key"]] = [n + 1, total + row["value"]]
    assert {k: list(v) for k, v in latest.items()} == expected
    assert formats.state_partitions(_state_files(restored), version=_committed(restored) + 1) == {"0": 3}


def test_an_upgrade_rescales_only_through_a_savepoint(tmp_path):
    """``state_partitions`` with another upgrade mode is refused before anything is stopped or written."""
    import airflow_savepoints.demo.app as demo
    from airflow_savepoints.jobs import StreamingJob
    from airflow_savepoints.jobs.workflows.run import JobContext
    from airflow_savepoints.jobs.workflows.upgrade import UpgradeRefusedError, UpgradeRequest, upgrade

    job = StreamingJob(name="demo-dedup", application=demo.__file__, checkpoint=str(tmp_path / "checkpoint"),
                       savepoint_dir=str(tmp_path / "savepoints"))
    with pytest.raises(UpgradeRefusedError, match="use mode savepoint"):
        upgrade(JobContext(job, Store(job.savepoint_dir)), UpgradeRequest(version=job.version(), mode="last-state",
                state_partitions=4), submit_for=lambda j: None, log_dir=tmp_path)
    with pytest.raises(InvalidInputError, match="state_partitions"):
        restore_savepoint("unused", str(tmp_path / "r"), state_partitions="many")
    assert not (tmp_path / "savepoints").exists() and not (tmp_path / "r").exists()


def _demo_job_with_a_savepoint(spark, tmp_path: Path, name: str, *, sink: bool):
    """The demo job declared in ``tmp_path/jobs.yaml`` (local[2], RocksDB state in 2 partitions, its file sink
    named if ``sink``), its first run in-process (the session is shared) over 3 input files, and a savepoint of
    it: (the jobs file, the savepoint, the event ids sent)."""
    import airflow_savepoints.demo.app as demo

    sent: set[int] = set()
    for index in range(3):
        sent.update(demo.write_events(tmp_path / "input", index))
    jobs = tmp_path / "jobs.yaml"
    declared_sink = f"    sink: {{kind: file, path: {tmp_path}/output}}\n" if sink else ""
    jobs.write_text(f"""jobs:
  - name: {name}
    application: {demo.__file__}
    application_args: [{tmp_path}/input, "{{checkpoint}}", {tmp_path}/output]
    master: local[2]
    spark_conf:
      spark.sql.shuffle.partitions: "2"
      spark.ui.enabled: "false"
      spark.sql.streaming.stateStore.providerClass: {ROCKS_CHANGELOG["spark.sql.streaming.stateStore.providerClass"]}
    checkpoint: {tmp_path}/checkpoint
    savepoint_dir: {tmp_path}/savepoints
{declared_sink}""")
    with session_conf(spark, {**ROCKS_CHANGELOG, "spark.sql.shuffle.partitions": "2"}):
        query = demo.build_query(spark, str(tmp_path / "input"), str(tmp_path / "checkpoint"), str(tmp_path / "output"))
        run_to_end(query)
        query.stop()
    info = take_savepoint(str(tmp_path / "checkpoint"), name, savepoint_dir=str(tmp_path / "savepoints"))
    assert info.manifest.state_partitions() == {"0": 2}
    return jobs, info, sent


def test_a_job_rescales_through_its_own_spark_application(spark, tmp_path):
    """`job start JOB --from SAVEPOINT --state-partitions 3` for a job declared in jobs.yaml, from a process where
    pyspark cannot be imported: the rescale runs as a Spark application submitted with the job's master and conf
    (spark-submit, local master), the job then continues on the rescaled copy; its file sink holds every event once."""
    import subprocess

    import airflow_savepoints.demo.app as demo
    from airflow_savepoints.jobs.description.record import read_run
    from airflow_savepoints.jobs.workflows.run import stop_process
    from tests.support.blocked import cli_without
    from tests.support.feeding import wait_for_sink

    jobs, info, sent = _demo_job_with_a_savepoint(spark, tmp_path, "demo-rescale", sink=True)

    for index in range(3, 5):  # input that arrived since: the new run commits a batch past the repartition batch
        sent.update(demo.write_events(tmp_path / "input", index))
    out = subprocess.run(cli_without("pyspark", "job", "start", "demo-rescale", "--jobs-file", str(jobs),
                                     "--from", info.pointer, "--state-partitions", "3", "--json", "--log-dir",
                                     str(tmp_path / "logs"), "--wait-timeout", "180"), capture_output=True, text=True, timeout=400)
    folder = Store(str(tmp_path / "savepoints")).child("demo-rescale")
    try:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        started = json.loads(out.stdout)
        restored = started["restored"]
        assert restored["rescaled"] and restored["partitions_before"] == {"0": 2} and restored["partitions_after"] == {"0": 3}
        assert restored["repartition_batch_id"] == info.manifest.batch_id + 1
        assert "as a Spark application of job demo-rescale (master local[2])" in " ".join(out.stderr.split())
        rescale_log = next((tmp_path / "logs").glob("demo-rescale-rescale-*.log")).read_text()  # its own application
        assert "Submitted application: airflow-savepoints-rescale" in rescale_log
        assert "OfflineStateRepartitionRunner: Starting offline state repartitioning" in rescale_log
        assert wait_for_sink(tmp_path / "output", sorted(sent)) == sorted(sent), "every event once"
    finally:
        stop_process(read_run(folder), grace=30)
    checkpoint = Path(started["checkpoint"])
    assert formats.state_partitions(_state_files(checkpoint), version=_committed(checkpoint) + 1) == {"0": 3}
    assert not [p for p in Path(folder.path_of("_rescale")).rglob("*") if p.is_file()]  # its result was read and removed
    verify_savepoint(info.pointer)


def test_an_upgrades_standby_rescale_application_acts_only_on_its_sealed_request(spark, tmp_path):
    """The rescale application an upgrade starts before its stop (``RescaleStandby``, spark-submit on local[2]):
    its Spark is up (a sealed ready.json) before it is asked anything; a request in its folder sealed with another
    secret (a writer of the savepoint folder) is ignored and rewrites nothing; the sealed one rescales the restored
    copy it names, through the restore, and the application ends. A standby never asked ends by its sealed cancel
    (exit 0, not killed) with nothing written; each folder is removed. One whose upgrade is killed ends by itself
    and removes its folder."""
    from airflow_savepoints.jobs import load_jobs
    from airflow_savepoints.jobs.description import trust
    from airflow_savepoints.jobs.launch.launcher import spark_submit_command
    from airflow_savepoints.jobs.workflows.rescale import JobRescaler, RescaleStandby
    from airflow_savepoints.jobs.workflows.run import JobContext

    jobs, info, _ = _demo_job_with_a_savepoint(spark, tmp_path, "demo-standby", sink=False)
    n = info.manifest.batch_id
    job = load_jobs(str(jobs))["demo-standby"]
    lines: list[str] = []
    ctx = JobContext(job, Store(job.savepoint_dir), log=lines.append)
    submit = lambda checkpoint, conf: spark_submit_command(job, checkpoint, conf)  # noqa: E731
    rescaled, other = tmp_path / "copy-asked", tmp_path / "copy-forged"
    restore_savepoint(info.pointer, str(other))  # a plain copy: what a forged request names

    standby = RescaleStandby.start(ctx, submit, tmp_path / "logs")
    try:
        assert standby.wait_ready(180), Path(standby.log_file).read_text()[-3000:]
        assert standby.ready["application_id"].startswith("local-") and standby.alive()
        forged = trust.seal({"checkpoint": Store(str(other)).url, "partitions": 3, "batch": n + 1, "conf": {}, "sink": ""},
                            trust.new_secret())
        standby.folder.write_bytes_atomic("request.json", json.dumps(forged).encode())
        deadline = time.monotonic() + 60
        while "is not sealed with this standby's secret: ignored" not in Path(standby.log_file).read_text():
            assert time.monotonic() < deadline and standby.alive(), Path(standby.log_file).read_text()[-3000:]
            time.sleep(0.2)
        done = restore_savepoint(info.pointer, str(rescaled), state_partitions=3,
                                 rescaler=JobRescaler(ctx, submit, tmp_path / "logs", standby=standby))
        assert standby.summary()["used"]
    finally:
        standby.close()
    assert standby.process.returncode == 0  # it ended by itself after its result
    assert (done.repartition_batch_id, done.partitions_after) == (n + 1, {"0": 3})
    assert any("by the standby Spark application of job demo-standby" in line for line in lines), lines
    assert formats.state_partitions(_state_files(rescaled), version=_committed(rescaled) + 1) == {"0": 3}
    assert _committed(other) == n and not (other / "offsets" / str(n + 1)).exists()  # the forged request: nothing

    idle = RescaleStandby.start(ctx, submit, tmp_path / "logs")
    try:
        assert idle.wait_ready(180), Path(idle.log_file).read_text()[-3000:]
    finally:
        idle.close()
    assert idle.process.returncode == 0 and not idle.summary()["used"]  # ended by its cancel, not killed (-9)
    assert not list(Path(ctx.folder.path_of("_rescale")).iterdir())  # both folders removed

    # a standby whose upgrade is killed (SIGKILL: no cancel) ends by itself and removes its folder
    owner = subprocess.Popen([sys.executable, "-c", STANDBY_OWNER, str(jobs), str(tmp_path / "logs")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    orphan = json.loads(owner.stdout.readline())
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 60
    while _runs(orphan["pid"]):
        assert time.monotonic() < deadline, Path(orphan["log"]).read_text()[-3000:]
        time.sleep(0.2)
    assert "is gone: ending" in Path(orphan["log"]).read_text()
    assert not Path(orphan["folder"]).exists()
    assert _committed(other) == n and not (other / "offsets" / str(n + 1)).exists()
    verify_savepoint(info.pointer)


STANDBY_OWNER = """
import json, sys
from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.jobs.launch.launcher import spark_submit_command
from airflow_savepoints.jobs.workflows.rescale import RescaleStandby
from airflow_savepoints.jobs.workflows.run import JobContext
from airflow_savepoints.storage import Store
job = load_jobs(sys.argv[1])["demo-standby"]
standby = RescaleStandby.start(JobContext(job, Store(job.savepoint_dir)),
                               lambda checkpoint, conf: spark_submit_command(job, checkpoint, conf), sys.argv[2])
assert standby.wait_ready(180)
print(json.dumps({"pid": standby.process.pid, "log": str(standby.log_file), "folder": standby.folder.path_of()}), flush=True)
sys.stdin.read()
"""


def _runs(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _restore_process(pointer: str, target: Path) -> subprocess.Popen:
    """``airflow-savepoints restore ... --json`` as its own process (its own local Spark for the rescale)."""
    command = [str(Path(sys.executable).parent / "airflow-savepoints"), "restore", pointer, "--to", str(target),
               "--state-partitions", "5", "--json"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(predicate, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, f"the restore ended first: {process.communicate()}"
        assert time.monotonic() < deadline, "the restore never got there"
        time.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_restore_interrupted_while_spark_rewrites_leaves_the_target_empty_and_answers_in_json(
        running_savepoints, tmp_path, sig):
    """Issue 40: SIGTERM used to leave a complete-looking, un-rescaled checkpoint and a stale ``_restore.lease``;
    Ctrl-C printed a traceback. Signalled once Spark has begun its repartition batch (its offsets file is
    there), the process empties the target, gives back its claim and answers ``interrupted`` in JSON."""
    _, _, info, _ = running_savepoints("aggregation")
    target = tmp_path / "restored"
    process = _restore_process(info.pointer, target)
    try:
        rewriting = target / "offsets" / str(info.manifest.batch_id + 1)  # Spark's first write of its repartition batch
        _wait_for(rewriting.exists, process)
        os.kill(process.pid, sig)
        out, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 1, (out, err)
    assert json.loads(out)["error"]["code"] == "interrupted", (out, err)
    assert "Traceback" not in err, err
    left = [p for p in target.rglob("*") if p.is_file()] if target.exists() else []
    assert left == [], left  # no checkpoint file and no _restore.lease
    verify_savepoint(info.pointer)
