"""The rescale of a restored checkpoint as a Spark application of its own, submitted through a job's submit path::

    spark-submit [the job's master, deploy mode and conf] rescale_app.py CHECKPOINT PARTITIONS BATCH RESULT [SINK]

Runs Spark's offline repartition on CHECKPOINT (an already restored copy, never a savepoint or a live
checkpoint) into PARTITIONS state partitions; it must commit BATCH. SINK: the job's file sink, whose log
gets the repartition batch. Writes ``result.json`` into the folder RESULT, read back by
:mod:`airflow_savepoints.jobs.workflows.rescale`: ``{"outcome": "rescaled", "partitions": {operator: count}}``,
or ``{"outcome": "failed", "error": {code, message, hint}}`` with Spark's error class mapped to our error
codes by :func:`airflow_savepoints.core.rescale.rewrite` (the in-process rescale's own mapping).
Imports pyspark and the package's core; no Airflow.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime

if __name__ == "__main__":  # run as a file: this folder's modules are no top-level modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from airflow_savepoints.core.names import CHECK_RESULT_FILE as RESULT_FILE  # noqa: E402
from airflow_savepoints.errors import RescaleFailedError, SavepointError  # noqa: E402
from airflow_savepoints.storage import Store  # noqa: E402


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from airflow_savepoints.core.rescale import rewrite

    checkpoint, partitions, batch, result_folder, *sink = argv[1:]
    spark = SparkSession.builder.appName("airflow-savepoints-rescale").getOrCreate()
    facts = {"application_id": spark.sparkContext.applicationId, "spark_version": spark.version}
    destination = Store(checkpoint)
    try:
        after = rewrite(spark, destination, int(partitions), int(batch), Store(sink[0]) if sink and sink[0] else None)
        result = {"outcome": "rescaled", "batch_id": int(batch), "partitions": after}
    except SavepointError as exc:
        result = {"outcome": "failed", "error": exc.to_dict()}
    except Exception as exc:  # noqa: BLE001 - anything else is reported as a failed rewrite, with its words
        result = {"outcome": "failed", "error": RescaleFailedError(
            f"the rescale of {destination.url} failed: {type(exc).__name__}: {str(exc)[:2000]}",
            "nothing was restored; fix the cause and retry into a new, empty checkpoint location").to_dict()}
    finally:
        spark.stop()
    result = {**result, **facts, "finished_at": datetime.now(UTC).isoformat()}
    Store(result_folder).write_bytes_atomic(RESULT_FILE, json.dumps(result, indent=1).encode())
    return 0 if result["outcome"] == "rescaled" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
