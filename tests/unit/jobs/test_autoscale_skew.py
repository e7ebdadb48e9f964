"""The state's skew, an input of the autoscaler's partition decision, read from a real savepoint's state summary.

A real stateful query (PySpark ``local[2]``, 4 state partitions) keeps most of its keys in one partition; a real
savepoint of it is inspected by Spark's state sources and its summary recorded beside it, as
InspectSavepointOperator does. ``job autoscale``'s evaluation of a recorded series that calls for 2 -> 3 cores then
doubles the state partitions (skew of 2 or more), with the summary as its evidence; without the summary, or when
the summary's partitions are not the running state's, the partitions follow the cores only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_savepoints.core import take_savepoint
from airflow_savepoints.core.state_reader import inspect_savepoint
from airflow_savepoints.core.state_summary import record_beside, remove_summary
from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.description.metrics import write_series
from airflow_savepoints.jobs.description.model import AutoscaleSettings
from airflow_savepoints.jobs.workflows.autoscale import evaluate
from airflow_savepoints.jobs.workflows.run import JobContext
from airflow_savepoints.storage import Store
from tests.support.spark_shapes import DEFAULT_CONF, run_to_end, session_conf
from tests.unit.jobs.test_autoscale import batches
from tests.unit.jobs.test_autoscale_act import Submitted

PARTITIONS = 4


@pytest.fixture(scope="module")
def skewed(spark, tmp_path_factory):
    """A stopped aggregation whose state holds 6 keys in partition 0 and one in each other (skew 6 / 2.25), and a
    savepoint of it with its state summary recorded."""
    from pyspark.sql import functions as F

    base = tmp_path_factory.mktemp("skew")
    candidates = spark.createDataFrame([(f"k{i}",) for i in range(200)], "key string").selectExpr(
        "key", f"pmod(hash(key), {PARTITIONS}) AS p").collect()
    keys = [r.key for r in candidates if r.p == 0][:6] + [next(r.key for r in candidates if r.p == p) for p in (1, 2, 3)]
    (base / "input").mkdir()
    (base / "input" / "part-0.json").write_text("\n".join(json.dumps({"key": k, "value": i}) for i, k in enumerate(keys)))
    with session_conf(spark, {**DEFAULT_CONF, "spark.sql.shuffle.partitions": str(PARTITIONS)}):
        query = (spark.readStream.schema("key string, value long").json(str(base / "input")).groupBy("key")
                 .agg(F.count("*").alias("n")).writeStream.outputMode("update").format("noop")
                 .option("checkpointLocation", str(base / "checkpoint")).start())
        run_to_end(query)
        query.stop()
    savepoint = take_savepoint(str(base / "checkpoint"), "orders", savepoint_dir=str(base / "sp"))
    summary = inspect_savepoint(savepoint.pointer, spark=spark)
    assert [op.rows_per_partition for op in summary.operators] == [[6, 1, 1, 1]]  # what Spark read: the skew is real
    record_beside(summary)
    return base, savepoint, summary


def running_job(base: Path, partitions: int) -> JobContext:
    """The job of the savepoint's folder, running (a driver's side of a run), its series calling for 2 -> 3 cores."""
    from tests.test_lifecycle import running_run

    job = StreamingJob(name="orders", application="app.py", master="spark://127.0.0.1:9", checkpoint=str(base / "checkpoint"),
                       savepoint_dir=str(base / "sp"),
                       autoscale=AutoscaleSettings(max_executors=4, min_partitions=2, max_partitions=16))
    ctx = JobContext(job, Store(job.savepoint_dir))
    series = batches([(1200, 120), (360, 190)], cores=2, partitions=partitions)
    shift = time.time() - 1 - series[-1].time
    write_series(ctx.folder, [p.model_copy(update={"time": p.time + shift}) for p in series])
    if ctx.lease.holder() is None:
        running_run(ctx)
    return ctx


def test_a_skewed_state_doubles_the_partitions_with_its_summary_as_evidence(skewed):
    base, savepoint, summary = skewed
    ctx = running_job(base, partitions=PARTITIONS)
    result = evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=base / "logs")
    assert (result["action"], result["target"]["cores"]) == ("scale_up", 3), result
    # the 3 cores alone do not bind 4 partitions: the skew of 6 / (9 / 4) = 2.67 does, and doubles them
    assert (result["current"]["partitions"], result["target"]["partitions"]) == (PARTITIONS, 2 * PARTITIONS), result
    evidence = result["evidence"]
    assert evidence["skew"] == pytest.approx(6 / (9 / 4), abs=0.001)
    found = evidence["skew_from"]
    assert (found["savepoint_id"], found["batch_id"], found["operator_id"], found["partitions"]) == \
        (savepoint.manifest.savepoint_id, summary.batch_id, 0, PARTITIONS)
    assert (found["rows"], found["largest_partition_rows"]) == (9, 6)


def test_a_summary_of_other_partitions_or_none_leaves_the_partitions_to_the_cores(skewed):
    base, savepoint, summary = skewed
    ctx = running_job(base, partitions=2)  # the run's state has 2 partitions now: the summary is of another state
    result = evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=base / "logs")
    assert result["evidence"]["skew"] is None and "not the running state's" in result["evidence"]["skew_from"]["reason"]
    assert result["target"]["partitions"] == 3  # bound by the 3 cores only
    remove_summary(ctx.folder, savepoint.manifest.savepoint_id)
    try:
        ctx = running_job(base, partitions=PARTITIONS)
        result = evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=base / "logs")
        assert result["evidence"]["skew"] is None and "no state summary" in result["evidence"]["skew_from"]["reason"]
        assert result["target"]["partitions"] == PARTITIONS  # 3 cores, 4 partitions: they do not bind
    finally:
        record_beside(summary)
