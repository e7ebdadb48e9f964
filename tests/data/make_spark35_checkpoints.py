"""Write the Spark 3.5 checkpoints in tests/data/spark35/ (run with pyspark 3.5, not by the tests).

    python3.11 -m venv /tmp/spark35 && /tmp/spark35/bin/pip install pyspark==3.5.8
    /tmp/spark35/bin/python tests/data/make_spark35_checkpoints.py

The queries read INPUT, a fixed absolute path, because a file source records absolute input paths
in its checkpoint; tests/test_spark35.py writes the same input files there again.
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

INPUT = Path("/tmp/airflow-savepoints-spark35-input")
OUT = Path(__file__).resolve().parent / "spark35"
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


def write_input(start: int, stop: int) -> None:
    INPUT.mkdir(parents=True, exist_ok=True)
    for i in range(start, stop):
        path = INPUT / f"part-{i:05d}.json"
        path.write_text("\n".join(json.dumps({"key": f"k{j % 5}", "value": i * 100 + j}) for j in range(20)) + "\n")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))


def main() -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    shutil.rmtree(INPUT, ignore_errors=True)
    shutil.rmtree(OUT, ignore_errors=True)
    write_input(0, 5)
    spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s").getOrCreate())
    assert spark.version.startswith("3.5"), spark.version
    for name, provider in PROVIDERS.items():
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
        spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        spark.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
        frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(str(INPUT))
        query = (frame.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
                 .writeStream.outputMode("update").format("noop")
                 .option("checkpointLocation", str(OUT / name)).start())
        query.processAllAvailable()
        time.sleep(4)  # let state maintenance write snapshots (RocksDB zips and SSTs, HDFS .snapshot)
        query.stop()
    (OUT / "SPARK_VERSION").write_text(spark.version + "\n")
    for crc in OUT.rglob(".*.crc"):  # Hadoop's local checksum files are not part of Spark's format
        crc.unlink()
    print("wrote", OUT, "with Spark", spark.version, file=sys.stderr)


if __name__ == "__main__":
    main()
