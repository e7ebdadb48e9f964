"""Delta Lake sinks, for real: delta-spark 4.4.0 for Spark 4.2 (jars from Maven Central, make jars) in the suite's
one Spark session, and the restore's checks that read the table's log without Spark (airflow_savepoints/sinks).

One run feeds a stateful query (dedup with a watermark) into a Delta table and, beside it, a foreachBatch writer
using Delta's txnAppId/txnVersion into a second table; savepoints of both at batch N and M, then both stop. Each
test works on its own copies of the tables (a Delta table is a folder of relative paths)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint
from airflow_savepoints.errors import InvalidInputError, SinkAheadError, SinkRepeatsError
from airflow_savepoints.sinks import DeltaLog, DeltaLogError
from airflow_savepoints.storage import Store
from tests.support.emulators import JARS, jar_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def delta_jars():
    from tests.conftest import require_part

    require_part("delta", None if jar_files(JARS / "delta") else f"Delta Lake's jars are not in {JARS / 'delta'} (make jars)")

EVENTS_PER_BATCH = 4
N, M = 1, 3  # the older savepoint's batch, the last batch of the first run (and its newest savepoint's)
FB_APP = "fb-writer"  # the foreachBatch writer's declared txnAppId


def _feed(inputs: Path, batch: int) -> list[int]:
    """One file of events (ids batch*10..): the file source with maxFilesPerTrigger=1 reads it as one batch."""
    ids = [batch * 10 + i for i in range(EVENTS_PER_BATCH)]
    inputs.mkdir(parents=True, exist_ok=True)
    tmp = inputs / f".{batch:03d}.json.tmp"
    tmp.write_text("".join(json.dumps({"id": i, "ts": "2026-01-01T00:00:00Z"}) + "\n" for i in ids))
    os.utime(tmp, (1_000_000 + batch, 1_000_000 + batch))  # file order == batch order
    tmp.rename(inputs / f"{batch:03d}.json")
    return ids


def _source(spark, inputs: Path):
    return spark.readStream.schema("id BIGINT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(str(inputs))


def _dedup(spark, inputs: Path, checkpoint: str, table: Path, version: int = 1):
    """The job: events deduplicated within a watermark (state) into a Delta table. Version 2 adds a column."""
    rows = _source(spark, inputs).withWatermark("ts", "1 hour").dropDuplicates(["id", "ts"])
    rows = rows.selectExpr("id", f"'v{version}' AS version", *(["id * 2 AS doubled"] if version == 2 else []))
    return (rows.writeStream.format("delta").outputMode("append").option("checkpointLocation", checkpoint)
            .option("mergeSchema", "true").start(str(table)))


def _foreach_batch(spark, inputs: Path, checkpoint: str, table: Path):
    """A foreachBatch writer with Delta's idempotent writes: txnAppId (declared) and txnVersion = the batch id."""
    def write(frame, batch_id):
        (frame.selectExpr("id").write.format("delta").mode("append").option("txnAppId", FB_APP)
         .option("txnVersion", batch_id).save(str(table)))
    return _source(spark, inputs).writeStream.foreachBatch(write).option("checkpointLocation", checkpoint).start()


def _run(spark, queries, inputs: Path, batches: range) -> list[int]:
    ids = []
    for batch in batches:
        ids += _feed(inputs, batch)
        for query in queries:
            query.processAllAvailable()
    return ids


def _ids(spark, table: Path) -> list[int]:
    return sorted(r.id for r in spark.read.format("delta").load(str(table)).select("id").collect())


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    """Both queries over batches 0..M (4 events each), savepoints at batch N and M, stopped. The Delta table (version
    b+1 for batch b) writes a log checkpoint every 2 versions; the foreachBatch table has none (version b for batch b)."""
    base = tmp_path_factory.mktemp("delta")
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    table, fb_table, inputs = base / "table", base / "fb-table", base / "input"
    inputs.mkdir()
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, version STRING) USING delta "
              "TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    dedup = _dedup(spark, inputs, str(base / "checkpoint"), table)
    fb = _foreach_batch(spark, inputs, str(base / "fb-checkpoint"), fb_table)
    saved = {}
    try:
        ids = []
        for first, last in ((0, N), (N + 1, M)):
            ids += _run(spark, [dedup, fb], inputs, range(first, last + 1))
            saved[last] = take_savepoint(str(base / "checkpoint"), "dedup", savepoint_dir=str(base / "savepoints"))
            saved["fb", last] = take_savepoint(str(base / "fb-checkpoint"), "fb", savepoint_dir=str(base / "savepoints"))
    finally:
        dedup.stop()
        fb.stop()
    assert [saved[k].manifest.batch_id for k in (N, M, ("fb", N), ("fb", M))] == [N, M, N, M]
    out = {"base": base, "table": table, "fb_table": fb_table, "inputs": inputs, "ids": ids, "saved": saved,
           "query_id": dedup.id}
    return out


def _copy(run, tmp_path: Path, name: str = "table") -> Path:
    copy = tmp_path / name
    shutil.copytree(run[name], copy)
    return copy


def _restore(spark, pointer: str, target: Path, **options):
    result = restore_savepoint(pointer, str(target), **options)
    for key, value in result.spark_conf_to_set.items():
        spark.conf.set(key, value)
    return result


# --- the log reader, on logs real Delta wrote ------------------------------------------------------------------------
def test_the_log_reader_agrees_with_delta_with_and_without_a_checkpoint(spark, run, tmp_path):
    """The snapshot read without Spark (checkpoint parquet + JSON commits, or the commits alone) is Delta's: its version,
    its live files, the txn per appId, the commit of each txn version; a multi-part checkpoint is read too."""
    from delta.tables import DeltaTable

    for table, app, checkpointed in ((run["table"], run["query_id"], True), (run["fb_table"], FB_APP, False)):
        log = DeltaLog(Store(str(table)))
        snapshot = log.snapshot()
        history = DeltaTable.forPath(spark, str(table)).history().select("version").collect()
        assert snapshot.version == max(r.version for r in history)
        assert (snapshot.checkpoint is not None) == checkpointed, snapshot.checkpoint
        assert _names(snapshot.live) == _names(spark.read.format("delta").load(str(table)).inputFiles())
        assert snapshot.txns[app] == M
        commits = log.txn_commits(app, M - 1, M, snapshot.version)
        assert [c.version for c in commits.values()] == [snapshot.version - 1, snapshot.version]

    table = _copy(run, tmp_path)
    spark.conf.set("spark.databricks.delta.checkpoint.partSize", "3")  # actions a checkpoint part: a multi-part checkpoint
    try:  # a commit (version M+2) after which Delta writes a checkpoint at once
        spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.checkpointInterval' = '1')")
    finally:
        spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
    parts = sorted(p.name for p in (table / "_delta_log").glob(f"{M + 2:020d}.checkpoint.*.parquet"))
    assert len(parts) > 1 and parts[0].endswith(f".0000000001.{len(parts):010d}.parquet"), parts
    snapshot = DeltaLog(Store(str(table))).snapshot()
    assert (snapshot.checkpoint, snapshot.version, snapshot.txns[run["query_id"]]) == (M + 2, M + 2, M)
    assert _names(snapshot.live) == _names(spark.read.format("delta").load(str(table)).inputFiles())


def test_the_log_reader_falls_back_to_an_older_checkpoint_and_names_a_gap(run, tmp_path):
    """_last_checkpoint names a checkpoint that is gone: the older one and the commits after it give the same snapshot;
    a commit missing after it is a gap no checkpoint covers (delta_log_unreadable), never a guess."""
    table = _copy(run, tmp_path)
    whole = DeltaLog(Store(str(table))).snapshot()
    (table / "_delta_log" / f"{M + 1:020d}.checkpoint.parquet").unlink()
    older = DeltaLog(Store(str(table))).snapshot()
    assert (older.checkpoint, older.version, older.txns, older.live) == (M - 1, whole.version, whole.txns, whole.live)
    (table / "_delta_log" / f"{M:020d}.json").unlink()
    with pytest.raises(DeltaLogError, match=f"commit {M} is missing") as gap:
        DeltaLog(Store(str(table))).snapshot()
    assert gap.value.code == "delta_log_unreadable"


def _names(paths) -> set[str]:
    return {os.path.basename(p) for p in paths}


# --- the restore's checks ---------------------------------------------------------------------------------------------
def test_an_older_savepoint_is_refused_with_the_figures(run, tmp_path):
    """Delta recorded txn M for the query id: a restore at batch N would have Delta skip batches N+1..M. Refused, nothing
    written; reprocess refused too while their rows are in the table."""
    table, target = _copy(run, tmp_path), tmp_path / "restored"
    with pytest.raises(SinkAheadError) as refused:
        restore_savepoint(run["saved"][N].pointer, str(target), sink_path=str(table), sink_kind="delta")
    assert f"(version {M + 1}) recorded txn {M}" in refused.value.message
    assert f"skip batches {N + 1}..{M}" in refused.value.message
    assert "--reprocess" in refused.value.hint and f"batch >= {M}" in refused.value.hint
    assert f"to version {N + 1}, before batch {N + 1}'s commit {N + 2}" in refused.value.hint
    with pytest.raises(SinkAheadError, match="still in the table"):
        restore_savepoint(run["saved"][N].pointer, str(target), sink_path=str(table), sink_kind="delta", reprocess=True)
    with pytest.raises(SinkAheadError, match=f"recorded txn {M}"):  # the kind found from the table's _delta_log
        restore_savepoint(run["saved"][N].pointer, str(target), sink_path=str(table))
    assert not target.exists()


def test_reprocess_counts_rows_rewritten_by_optimize_as_still_there(spark, run, tmp_path):
    """OPTIMIZE removes batch N+1's files without a data change: their rows are still in the table, reprocess refused."""
    table, target = _copy(run, tmp_path), tmp_path / "restored"
    spark.sql(f"OPTIMIZE delta.`{table}`")
    with pytest.raises(SinkAheadError, match="rewritten without a data change"):
        restore_savepoint(run["saved"][N].pointer, str(target), sink_path=str(table), sink_kind="delta", reprocess=True)
    assert not target.exists()


def test_the_newest_savepoint_restored_and_continued_holds_every_event_once(spark, run, tmp_path):
    """The job continued from its newest savepoint in its own (copied) table, new events fed: every event once."""
    table, target, inputs = _copy(run, tmp_path), tmp_path / "restored", run["inputs"]  # the source log names its files
    result = _restore(spark, run["saved"][M].pointer, target, sink_path=str(table), sink_kind="delta", rerun_until=M)
    assert result.sink.model_dump() == {
        "kind": "delta", "rerun": None, "on_rerun": "skipped", "recorded_batch": M,
        "detail": f"the delta sink at {table} holds txn {M} for appId {run['query_id']} (table version {M + 1}): no batch "
                  f"after {M} ran, nothing is run again"}
    query = _dedup(spark, inputs, str(target), table)
    try:
        more = _run(spark, [query], inputs, range(M + 1, M + 3))
    finally:
        query.stop()
        for batch in range(M + 1, M + 3):  # the run's input as it was, for the other tests
            (inputs / f"{batch:03d}.json").unlink(missing_ok=True)
    assert _ids(spark, table) == sorted(run["ids"] + more)  # every event once
    assert DeltaLog(Store(str(table))).snapshot().txns[run["query_id"]] == M + 2


def test_a_bug_fix_rollback_reprocesses_with_version_2(spark, run, tmp_path):
    """The table RESTOREd to before batch N+1's commit (Delta keeps txn M: delta-io/delta#1813), the batch-N savepoint
    restored with reprocess (a new query id), version 2 of the job run: every event once, batches N+1..M carry
    version 2's rows. Reprocess is refused while those rows are in the table (test above)."""
    table, target, inputs = _copy(run, tmp_path), tmp_path / "restored", run["inputs"]
    spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {N + 1}")  # version N+1: batch N's commit
    assert DeltaLog(Store(str(table))).snapshot().txns[run["query_id"]] == M  # the txn outlives the RESTORE
    with pytest.raises(SinkAheadError, match=f"recorded txn {M}"):  # without reprocess Delta would skip N+1..M: lost
        restore_savepoint(run["saved"][N].pointer, str(target), sink_path=str(table), sink_kind="delta")
    result = _restore(spark, run["saved"][N].pointer, target, sink_path=str(table), sink_kind="delta", reprocess=True)
    assert result.new_query_id and result.query_id != run["query_id"]
    assert (result.sink.kind, result.sink.rerun, result.sink.on_rerun, result.sink.recorded_batch) == \
        ("delta", [N + 1, M], "written_again", M)
    assert "no longer in the table" in result.sink.detail
    query = _dedup(spark, inputs, str(target), table, version=2)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = {r.id: (r.version, r.doubled) for r in spark.read.format("delta").load(str(table)).collect()}
    assert sorted(rows) == sorted(run["ids"])  # every event once
    rerun = (N + 1) * 10  # the first id of batch N+1
    assert all(rows[i] == (("v2", i * 2) if i >= rerun else ("v1", None)) for i in rows), rows


def test_a_foreach_batch_writer_with_txn_app_id_is_checked_the_same_way(run, tmp_path):
    table, target = _copy(run, tmp_path, "fb_table"), tmp_path / "restored"
    older, newest = run["saved"]["fb", N].pointer, run["saved"]["fb", M].pointer
    with pytest.raises(SinkAheadError, match=f"recorded txn {M} for appId {FB_APP}.*skip batches {N + 1}..{M}"):
        restore_savepoint(older, str(target), sink_path=str(table), sink_kind="foreach_batch", sink_app_id=FB_APP)
    with pytest.raises(InvalidInputError, match="fixed appId"):  # a new query id would not change its appId
        restore_savepoint(older, str(target), sink_path=str(table), sink_kind="foreach_batch", sink_app_id=FB_APP,
                          reprocess=True)
    with pytest.raises(SinkRepeatsError) as repeats:  # declared without its app id: at least once
        restore_savepoint(older, str(target), sink_kind="foreach_batch", rerun_until=M)
    assert f"batches {N + 1}..{M} ({M - N} batches)" in repeats.value.message and "--allow-repeats" in repeats.value.hint
    assert not target.exists()
    result = restore_savepoint(newest, str(target), sink_path=str(table), sink_kind="foreach_batch", sink_app_id=FB_APP)
    assert (result.sink.on_rerun, result.sink.recorded_batch, result.sink.rerun) == ("skipped", M, None)


def test_at_least_once_sinks_need_allow_repeats(run, tmp_path):
    """Kafka, foreach: nothing recorded, the restored run writes N+1..M again: refused with the count, unless accepted."""
    older = run["saved"][N].pointer
    for kind in ("kafka", "foreach"):
        with pytest.raises(SinkRepeatsError, match=rf"batches {N + 1}\.\.{M} \({M - N} batches\)"):
            restore_savepoint(older, str(tmp_path / kind), sink_kind=kind, rerun_until=M)
        assert not (tmp_path / kind).exists()
    result = restore_savepoint(older, str(tmp_path / "accepted"), sink_kind="kafka", rerun_until=M, allow_repeats=True)
    assert (result.sink.kind, result.sink.rerun, result.sink.on_rerun) == ("kafka", [N + 1, M], "written_again")
    result = restore_savepoint(older, str(tmp_path / "none"), rerun_until=M)
    assert (result.sink.kind, result.sink.rerun, result.sink.on_rerun) == ("unknown", [N + 1, M], "unknown")


def test_cli_restore_reports_the_sink_and_its_refusal(run, tmp_path):
    from typer.testing import CliRunner

    from airflow_savepoints.cli.main import app

    table, runner, older = _copy(run, tmp_path), CliRunner(), run["saved"][N].pointer
    refused = runner.invoke(app, ["restore", older, "--to", str(tmp_path / "a"), "--sink-path", str(table),
                                  "--sink-kind", "delta", "--conn-id", "", "--json"])
    assert refused.exit_code != 0 and json.loads(refused.stdout)["error"]["code"] == "sink_ahead", refused.stdout
    assert not (tmp_path / "a").exists()
    done = runner.invoke(app, ["restore", older, "--to", str(tmp_path / "b"), "--sink-kind", "kafka",
                               "--rerun-until", str(M), "--allow-repeats", "--conn-id", "", "--json"])
    assert done.exit_code == 0, done.stdout
    assert json.loads(done.stdout)["sink"]["rerun"] == [N + 1, M]
