"""A stateful streaming job writing a Delta table, for jobs.yaml tests: events deduplicated within a
watermark, each row tagged with the job version (Spark conf ``spark.savepoints.test.version``).

    spark-submit delta_stream_app.py INPUT CHECKPOINT TABLE
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from pyspark.sql import SparkSession

    from airflow_savepoints.jobs.driver import claim_run, run_until_stopped

    input_dir, checkpoint, table = sys.argv[1:4]
    spark = SparkSession.builder.appName("delta-stream").getOrCreate()
    claim_run(spark)
    version = spark.conf.get("spark.savepoints.test.version", "1")
    rows = (spark.readStream.schema("id BIGINT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(input_dir)
            .withWatermark("ts", "1 hour").dropDuplicates(["id", "ts"]).selectExpr("id", f"'v{version}' AS version"))
    query = (rows.writeStream.format("delta").outputMode("append").option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start(table))
    run_until_stopped(query, spark)
