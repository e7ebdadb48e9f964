"""What a typical test's driver does, run once to record the classes it loads (tests/support/jvm_archive.py):
a stateful streaming query on RocksDB state with a file source and a file sink, then a read of its state.

    spark-submit jvm_warmup_app.py WORKDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    from pyspark.sql import SparkSession

    work = Path(sys.argv[1])
    (work / "input").mkdir(parents=True, exist_ok=True)
    (work / "input" / "0.json").write_text("".join(json.dumps({"id": i, "user": f"u{i % 3}"}) + "\n" for i in range(20)))
    spark = (SparkSession.builder.master("local[2]").appName("jvm-warmup")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .getOrCreate())
    events = spark.readStream.schema("id long, user string").json(str(work / "input"))
    unique = events.dropDuplicates(["id"])
    query = (unique.writeStream.format("json").option("path", str(work / "output"))
             .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    spark.read.format("statestore").load(str(work / "checkpoint")).count()
    spark.read.json(str(work / "output")).collect()
    spark.stop()
