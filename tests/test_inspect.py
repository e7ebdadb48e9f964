"""Reading a savepoint's state and its source positions without running the job (issue 28, item 3).

Real local Spark reads real savepoints of real queries (made once for the module): an aggregation
(HDFS state) and a chain of two stateful operators, a dedup and an aggregation (RocksDB state). The
rows Spark's ``statestore`` source counts must equal the distinct keys the test wrote, per operator
and in total; nothing in the savepoint may change. The operator records the summary beside the
savepoint, the console's API serves its rows and skew, and disposing the savepoint removes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from airflow_savepoints.core import dispose_savepoint, take_savepoint
from airflow_savepoints.core.names import STATE_SUMMARIES_FOLDER
from airflow_savepoints.core.retention import RetentionPolicy, retain
from airflow_savepoints.core.source_positions import source_positions
from airflow_savepoints.core.state_reader import inspect_savepoint
from airflow_savepoints.core.state_summary import StateSummary, read_summary, record_summary
from airflow_savepoints.storage import Store
from tests.conftest import ROOT
from tests.support.spark_shapes import DEFAULT_CONF, ROCKSDB, run_to_end
from tests.support.synthetic import write_checkpoint
from tests.test_cli import cli

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data" / "spark35"


def write_events(folder: Path, start: int, stop: int) -> list[dict]:
    """Files of events with repeated (key, value) pairs: 7 keys, values 0-4, so dedup and aggregation both hold state."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(start, stop):
        part = [{"key": f"k{(i * 3 + j) % 7}", "value": (i + j) % 5} for j in range(12)]
        path = folder / f"part-{i:05d}.json"
        path.write_text("\n".join(json.dumps(r) for r in part) + "\n")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        rows += part
    return rows


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder below ``path`` with its size and modification time: a write shows."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def keys_per_partition(spark, keys: set[str], partitions: int = 2) -> list[int]:
    """How many of ``keys`` each shuffle partition holds: Spark's hash partitioning (pmod of its Murmur3 hash)."""
    counts = [0] * partitions
    for row in spark.createDataFrame([(k,) for k in keys], "key string").selectExpr(
            f"pmod(hash(key), {partitions}) AS p").collect():
        counts[row.p] += 1
    return counts


@pytest.fixture(scope="module")
def made(spark, tmp_path_factory):
    """Two stopped queries and one savepoint of each, made once."""
    from pyspark.sql import functions as F

    base = tmp_path_factory.mktemp("inspect")
    root = base / "savepoints"
    for key, value in DEFAULT_CONF.items():
        spark.conf.set(key, value)
    written = write_events(base / "input", 0, 4)
    frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 2).json(str(base / "input"))
    query = (frame.groupBy("key").agg(F.count("*").alias("n")).writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", str(base / "agg")).start())
    run_to_end(query)
    query.stop()
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    query = (frame.dropDuplicates(["key", "value"]).groupBy("key").count().writeStream.outputMode("update")
             .format("noop").option("checkpointLocation", str(base / "chain")).start())
    run_to_end(query)
    query.stop()
    for key, value in DEFAULT_CONF.items():
        spark.conf.set(key, value)
    write_events(base / "input", 4, 6)  # arrived after the savepoints: not processed
    return {
        "base": base, "root": root, "written": written,
        "agg": take_savepoint(str(base / "agg"), "agg", savepoint_dir=str(root)),
        "chain": take_savepoint(str(base / "chain"), "chain", savepoint_dir=str(root)),
    }


def test_rows_equal_the_distinct_keys_written_per_operator_and_in_total(made, spark):
    written = made["written"]
    keys = {r["key"] for r in written}
    pairs = {(r["key"], r["value"]) for r in written}
    counts = {k: sum(1 for r in written if r["key"] == k) for k in keys}

    before = snapshot(Path(made["agg"].pointer))
    agg = inspect_savepoint(made["agg"].pointer, sample=3, spark=spark)
    assert snapshot(Path(made["agg"].pointer)) == before  # read in place, nothing written
    assert agg.read_from == "savepoint" and agg.batch_id == made["agg"].manifest.batch_id == 1
    (op,) = agg.operators
    assert (op.operator_id, op.name, op.partitions) == (0, "stateStoreSave", 2)
    assert op.rows == agg.total_rows == len(keys) == sum(op.rows_per_partition)
    assert op.bytes == sum(f.size for f in made["agg"].manifest.files if f.path.startswith("state/0/"))
    expected = keys_per_partition(spark, keys)  # from the keys written, not from the product's counts
    assert op.rows_per_partition == expected and op.skew == round(max(expected) / (len(keys) / 2), 3), expected
    (store,) = op.stores
    assert store.store == "default" and set(store.schema_) == {"key", "value"} and "key:string" in store.schema_["key"]
    assert len(store.samples) == 3
    for row in store.samples:  # the state itself: each key's count so far
        assert list(row["value"].values()) == [counts[row["key"]["key"]]]  # the count's buffer
    json.dumps(agg.as_json())  # plain JSON

    before = snapshot(Path(made["chain"].pointer))
    chain = inspect_savepoint(made["chain"].pointer, sample=2, spark=spark)
    assert snapshot(Path(made["chain"].pointer)) == before
    by_name = {op.name: op for op in chain.operators}
    assert set(by_name) == {"dedupe", "stateStoreSave"}, by_name.keys()
    assert by_name["dedupe"].rows == len(pairs) and by_name["stateStoreSave"].rows == len(keys)
    assert chain.total_rows == len(pairs) + len(keys)
    dedupe_samples = by_name["dedupe"].stores[0].samples
    assert len(dedupe_samples) == 2 and all((s["key"]["key"], s["key"]["value"]) in pairs for s in dedupe_samples)


def test_cli_inspect_and_offsets_answer_in_json_and_refuse_bad_pointers(made):
    pointer = made["agg"].pointer
    code, answer = cli("inspect", pointer, "--operator", "0", "--sample", "1", "--conn-id", "")
    assert code == 0 and [op["operator_id"] for op in answer["operators"]] == [0]
    assert answer["operators"][0]["rows"] == answer["total_rows"] == len({r["key"] for r in made["written"]})
    assert len(answer["operators"][0]["stores"][0]["samples"]) == 1
    assert cli("inspect", str(made["base"] / "nothing"), "--conn-id", "") == (1, {"error": {
        "code": "savepoint_not_found", "message": f"no savepoint at {made['base'] / 'nothing'}: nothing exists there",
        "hint": "check the pointer (list the job's savepoints)"}})
    code, answer = cli("inspect", pointer, "--operator", "7", "--conn-id", "")
    assert code == 1 and answer["error"]["code"] == "invalid_input" and "its operators: 0" in answer["error"]["message"]
    code, answer = cli("offsets", str(made["base"] / "agg"), "--conn-id", "")  # a live checkpoint is no savepoint
    assert code == 1 and answer["error"]["code"] == "incomplete_savepoint"


def test_offsets_of_a_file_source_restart_a_rewritten_query_after_the_savepoint(made, spark, tmp_path):
    code, answer = cli("offsets", made["agg"].pointer, "--conn-id", "")
    assert code == 0 and answer["batch_id"] == 1
    (source,) = answer["sources"]
    inputs = sorted((made["base"] / "input").glob("part-*.json"))
    assert source["kind"] == "file" and source["log_offset"] == 1
    assert source["files"] == [p.as_uri() for p in inputs[:4]]

    # the documented restart without state: the same input without the files the savepoint's query processed
    processed = {Path(f.removeprefix("file://")).name for f in source["files"]}
    fresh = tmp_path / "input"
    fresh.mkdir()
    for path in inputs:
        if path.name not in processed:
            shutil.copy2(path, fresh / path.name)
    seen: list[dict] = []
    frame = spark.readStream.schema("key string, value long").json(str(fresh))
    query = (frame.writeStream.foreachBatch(lambda batch, _: seen.extend(r.asDict() for r in batch.collect()))
             .option("checkpointLocation", str(tmp_path / "rewritten")).start())
    run_to_end(query)
    query.stop()
    expected = [json.loads(line) for p in inputs[4:] for line in p.read_text().splitlines()]
    assert sorted(map(json.dumps, seen)) == sorted(map(json.dumps, expected))


def test_kafka_positions_are_printed_as_starting_offsets(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "checkpoint")
    meta = (checkpoint / "offsets" / "2").read_text().split("\n")[1]
    kafka = '{"orders":{"2":310,"1":305,"0":298},"payments":{"0":17}}'  # KafkaSourceOffset's JSON, as Spark logs it
    (checkpoint / "offsets" / "2").write_text(f'v1\n{meta}\n{{"logOffset":2}}\n{kafka}')
    (checkpoint / "sources" / "1").mkdir()
    (checkpoint / "sources" / "1" / "0").write_bytes(b'\x00v1\n{"orders":{"2":0,"1":0,"0":0},"payments":{"0":0}}')
    info = take_savepoint(str(checkpoint), "kafka-job", savepoint_dir=str(tmp_path / "sp"))
    positions = source_positions(info.pointer)
    file_source, kafka_source = positions.sources
    assert (file_source.kind, file_source.files) == ("file", ["file:///in/f0.json", "file:///in/f1.json", "file:///in/f2.json"])
    assert kafka_source.kind == "kafka" and kafka_source.offset == json.loads(kafka)
    assert kafka_source.starting_offsets == '{"orders":{"0":298,"1":305,"2":310},"payments":{"0":17}}'
    code, answer = cli("offsets", info.pointer, "--conn-id", "")
    assert code == 0 and json.loads(answer["sources"][1]["starting_offsets"]) == json.loads(kafka)


def test_a_spark35_savepoint_says_what_it_cannot_show(spark, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(DATA / "hdfs", checkpoint)
    info = take_savepoint(str(checkpoint), "legacy", savepoint_dir=str(tmp_path / "sp"))
    summary = inspect_savepoint(info.pointer, sample=1, spark=spark)
    (op,) = summary.operators
    assert op.name is None and op.partitions == 2 and op.rows == 5  # keys k0..k4 (make_spark35_checkpoints.py)
    assert any("no operator metadata" in limit for limit in summary.limits)


def test_the_operator_records_the_summary_the_console_serves_and_disposal_removes_it(made, spark, tmp_path):
    from airflow_savepoints.operators.inspect import InspectSavepointOperator
    from airflow_savepoints.plugins.api import SavepointRoot, Scrubber, savepoint_answer

    root = tmp_path / "savepoints"
    shutil.copytree(made["root"] / "agg", root / "agg")  # a private job folder: this test disposes
    job_folder = Store(str(root / "agg"))
    savepoint_id = made["agg"].manifest.savepoint_id
    answer = InspectSavepointOperator(task_id="inspect", job="agg", savepoint_dir=str(root),
                                      savepoints_conn_id=None).execute({})
    assert answer["savepoint_id"] == savepoint_id and answer["recorded"] == job_folder.url_of(
        f"{STATE_SUMMARIES_FOLDER}/{savepoint_id}.json")
    recorded = read_summary(job_folder, savepoint_id)
    assert recorded.total_rows == answer["total_rows"] == len({r["key"] for r in made["written"]})

    api_root = object.__new__(SavepointRoot)  # the API's root without an API server: the route's own work
    api_root.store, api_root.scrub = Store(str(root)), Scrubber()
    state = savepoint_answer(api_root, "agg", savepoint_id, verify=False)["detail"]["state_summary"]
    (op,) = state["operators"]
    keys = {r["key"] for r in made["written"]}
    per_partition = keys_per_partition(spark, keys)  # from the keys written
    assert (op["name"], op["rows"], op["partitions"]) == ("stateStoreSave", len(keys), 2)
    assert op["max_partition_rows"] == max(per_partition)
    assert op["skew"] == round(max(per_partition) / (len(keys) / 2), 3), (op, per_partition)

    dispose_savepoint(str(root / "agg" / savepoint_id), savepoint_dir=str(root))
    assert read_summary(job_folder, savepoint_id) is None
    assert not (root / "agg" / STATE_SUMMARIES_FOLDER / f"{savepoint_id}.json").exists()


def test_retention_removes_the_summary_with_its_savepoint_and_strays(made, tmp_path):
    checkpoint = made["base"] / "agg"
    root = Store(str(tmp_path / "savepoints"))
    older = take_savepoint(str(checkpoint), "agg", savepoint_dir=root, savepoint_type="periodic")
    newer = take_savepoint(str(checkpoint), "agg", savepoint_dir=root, savepoint_type="periodic")
    job_folder = root.child("agg")
    summary = StateSummary(pointer=older.pointer, savepoint_id=older.manifest.savepoint_id, job="agg", batch_id=1,
                           read_from="savepoint")  # what is recorded does not matter here: where it goes does
    record_summary(job_folder, summary)
    record_summary(job_folder, summary.model_copy(update={"savepoint_id": newer.manifest.savepoint_id}))
    record_summary(job_folder, summary.model_copy(update={"savepoint_id": "savepoint-gone00-0123456789ab"}))
    report = retain(root, "agg", RetentionPolicy.resolve(max_periodic=1, max_age="none"))
    assert report.disposed == [older.manifest.savepoint_id]
    assert sorted(job_folder.listdir(STATE_SUMMARIES_FOLDER)) == [f"{newer.manifest.savepoint_id}.json"]


@pytest.mark.s3
def test_a_savepoint_on_an_object_store_is_read_through_a_local_copy(made, spark, s3):
    info = take_savepoint(str(made["base"] / "agg"), "agg", savepoint_dir=f"s3://{s3}/savepoints")
    summary = inspect_savepoint(info.pointer, spark=spark)
    assert summary.read_from == "local_copy" and summary.pointer == info.pointer
    assert summary.total_rows == len({r["key"] for r in made["written"]})
    assert not [p for p in Path(tempfile.gettempdir()).glob("airflow-savepoints-inspect-*")]  # the copy is gone


def test_damaged_state_is_an_error_with_sparks_own_class_and_progress_goes_to_stderr(made, spark, tmp_path):
    """Issue 40: a damaged state file made ``inspect`` exit 0 with py4j's "An error occurred while calling
    o50.collectToPython."; now it fails (``state_unreadable``) with Spark's error class and message as the cause.
    Each step is a line on stderr; stdout holds the JSON answer alone."""
    from typer.testing import CliRunner

    from airflow_savepoints.cli.main import app

    damaged = tmp_path / "agg" / Path(made["agg"].pointer).name
    shutil.copytree(made["agg"].pointer, damaged)
    for state_file in (damaged / "state").rglob("*.delta"):
        state_file.write_bytes(b"not a state file")
    result = CliRunner().invoke(app, ["inspect", str(damaged), "--json"])
    answer = json.loads(result.stdout)
    assert result.exit_code == 1 and answer["error"]["code"] == "state_unreadable", answer
    assert "An error occurred while calling" not in answer["error"]["cause"]
    assert answer["error"]["cause"].startswith("["), answer  # Spark's error class, e.g. [CANNOT_LOAD_STATE_STORE...]
    steps = result.stderr.splitlines()
    assert any("operators' metadata" in line for line in steps) and any("counting rows" in line for line in steps), steps


def test_a_cold_inspect_says_each_phase_with_its_seconds_and_nothing_of_sparks(made, tmp_path):
    """Issue 43: ``inspect`` in a new process (its own local Spark, started cold) puts one line per phase on
    stderr, each with the seconds since the command began (opening the store, starting Spark, Spark started,
    reading state), and nothing else: not the JVM's module notice, not Spark's log-level banner, no warning."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(tmp_path / "airflow-home")}
    env.pop("JAVA_TOOL_OPTIONS", None)  # the test bed's (conftest): every JVM would say "Picked up ..." on stderr
    done = subprocess.run([sys.executable, "-m", "airflow_savepoints.cli.main", "inspect", made["agg"].pointer, "--json",
                           "--conn-id", ""], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total_rows"] == len({r["key"] for r in made["written"]})
    lines = done.stderr.splitlines()
    progress = [re.fullmatch(r" *(\d+\.\d)s (.+)", line) for line in lines]
    assert lines and all(progress), lines  # every line a progress line: nothing of the JVM's or Spark's
    seconds, phases = [float(m.group(1)) for m in progress], [m.group(2) for m in progress]
    assert seconds == sorted(seconds) and seconds[0] > 0, lines  # counted from the process's start
    assert phases[0] == f"opening the store: {made['agg'].pointer}", phases
    assert phases[1].startswith("starting Spark") and re.fullmatch(r"Spark \d+\.\d+\.\d+ started", phases[2]), phases
    assert all(p.startswith("reading state: ") for p in phases[3:]) and len(phases) > 3, phases
