"""A streaming job reading a Kafka topic whose values are demo events (JSON), copied to a JSON file sink
(exactly once through the sink's log), with the helper (a run lease, heartbeats, a cooperative stop):

    spark-submit --conf spark.jars=<Spark's Kafka connector jars> kafka_stream_app.py BOOTSTRAP TOPIC CHECKPOINT OUTPUT
"""

from __future__ import annotations

import sys

RECORDS_PER_BATCH = 100  # maxOffsetsPerTrigger: a few batches per input


def main(argv: list[str]) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_savepoints.demo.app import EVENT_SCHEMA
    from airflow_savepoints.jobs.driver.control import claim_run, run_until_stopped

    bootstrap, topic, checkpoint, output = argv[1:5]
    spark = SparkSession.builder.appName("kafka-stream").getOrCreate()
    claim_run(spark)
    records = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
               .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", RECORDS_PER_BATCH).load())
    events = records.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("event")).select("event.*")
    query = (events.writeStream.format("json").option("path", output).option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    run_until_stopped(query, spark)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv)
