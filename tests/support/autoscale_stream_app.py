"""The autoscaler's job on the distributed test bed: de-duplicates JSON events by id (RocksDB state: one task
per state partition) into a JSON file sink, and waits ``sleepMsPerRow`` milliseconds per row in a Python UDF
after the de-duplication, in the stateful stage. Bound by waiting, not by CPU (the machine has 2 cores shared
with everything else): more task slots, and state partitions where they bind, really process more.

    spark-submit autoscale_stream_app.py INPUT CHECKPOINT OUTPUT

Its Spark conf: ``spark.savepoints.test.sleepMsPerRow`` (10), ``spark.savepoints.test.triggerMs`` (4000),
``spark.savepoints.test.maxFilesPerTrigger`` (20: files waiting beyond a batch's are the backlog), and
``spark.savepoints.test.coresAllowedFile``: a file holding a number of cores; while it exists, an application
asking for more (``spark.cores.max``) fails at its start, before its query: a configuration the cluster
refuses (an upgrade check of it fails; the running application is untouched). And
``spark.savepoints.test.partitionsAllowedFile``: a file holding a number of state partitions; while it exists,
a row of the stateful stage in a partition at or past that number fails its task: a configuration with more
state partitions that passes a check run before the file appears, then fails on its first batch after it.
"""

from __future__ import annotations

import os
import sys
import time

SLEEP_CONF = "spark.savepoints.test.sleepMsPerRow"
TRIGGER_CONF = "spark.savepoints.test.triggerMs"
MAX_FILES_CONF = "spark.savepoints.test.maxFilesPerTrigger"
CORES_ALLOWED_CONF = "spark.savepoints.test.coresAllowedFile"
PARTITIONS_ALLOWED_CONF = "spark.savepoints.test.partitionsAllowedFile"
SCHEMA = "id long, user string, ts timestamp"


def refuse_cores_beyond_allowed(spark) -> None:
    """Fail while the allowed-cores file says fewer cores than this application asks for."""
    marker = spark.conf.get(CORES_ALLOWED_CONF, "")
    if not marker or not os.path.exists(marker):
        return
    with open(marker) as f:
        allowed = int(f.read().strip())
    asked = int(spark.sparkContext.getConf().get("spark.cores.max", "0"))
    if asked > allowed:
        spark.stop()  # its shutdown logged before the error: the error ends the driver's log
        raise RuntimeError(f"autoscale test app: {asked} cores asked, the cluster allows {allowed} ({marker})")


def build_query(spark, input_dir: str, checkpoint: str, output: str):
    from pyspark.sql import functions as F

    sleep_s = float(spark.conf.get(SLEEP_CONF, "10")) / 1000
    partitions_allowed = spark.conf.get(PARTITIONS_ALLOWED_CONF, "")

    def wait_then_pass(value):
        if sleep_s:
            time.sleep(sleep_s)
        if partitions_allowed and os.path.exists(partitions_allowed):
            from pyspark import TaskContext

            with open(partitions_allowed) as f:
                allowed = int(f.read().strip())
            if TaskContext.get().partitionId() >= allowed:
                raise RuntimeError(f"autoscale test app: state partition {TaskContext.get().partitionId()} of a run "
                                   f"with more than {allowed} ({partitions_allowed})")
        return value

    slow = F.udf(wait_then_pass, "long").asNondeterministic()
    events = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", int(spark.conf.get(MAX_FILES_CONF, "20")))
              .json(input_dir))
    unique = events.withWatermark("ts", "1 hour").dropDuplicatesWithinWatermark(["id"])
    return (unique.withColumn("id", slow("id")).writeStream.format("json").option("path", output)
            .option("checkpointLocation", checkpoint).queryName("autoscale-test")
            .trigger(processingTime=f"{int(spark.conf.get(TRIGGER_CONF, '4000'))} milliseconds").start())


if __name__ == "__main__":
    from pyspark.sql import SparkSession

    from airflow_savepoints.jobs.driver.control import claim_run, run_until_stopped

    input_dir, checkpoint, output = sys.argv[1:4]
    spark = SparkSession.builder.appName("autoscale-test").getOrCreate()
    refuse_cores_beyond_allowed(spark)
    claim_run(spark)
    run_until_stopped(build_query(spark, input_dir, checkpoint, output), spark)
    spark.stop()
