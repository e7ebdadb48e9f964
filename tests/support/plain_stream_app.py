"""A streaming job that knows nothing of airflow-savepoints (no run_until_stopped, no heartbeats):
copies JSON events from INPUT to a JSON file sink at OUTPUT.

    spark-submit plain_stream_app.py INPUT CHECKPOINT OUTPUT
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from pyspark.sql import SparkSession

    input_dir, checkpoint, output = sys.argv[1:4]
    spark = SparkSession.builder.appName("plain-stream").getOrCreate()
    events = spark.readStream.schema("id long, user string, ts timestamp").option("maxFilesPerTrigger", 1).json(input_dir)
    query = (events.writeStream.format("json").option("path", output).option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    query.awaitTermination()
