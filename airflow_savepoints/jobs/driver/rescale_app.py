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

import os
import sys

if __name__ == "__main__":  # run as a file: this folder's modules are no top-level modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from airflow_savepoints.errors import RescaleFailedError  # noqa: E402
from airflow_savepoints.jobs.driver.app_result import run_and_report  # noqa: E402
from airflow_savepoints.storage import Store  # noqa: E402


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from airflow_savepoints.core.rescale import rewrite

    checkpoint, partitions, batch, result_folder, *sink = argv[1:]
    spark = SparkSession.builder.appName("airflow-savepoints-rescale").getOrCreate()
    destination = Store(checkpoint)

    def rescale() -> dict:
        after = rewrite(spark, destination, int(partitions), int(batch), Store(sink[0]) if sink and sink[0] else None)
        return {"outcome": "rescaled", "batch_id": int(batch), "partitions": after}

    return run_and_report(spark, result_folder, rescale, lambda exc: RescaleFailedError(
        f"the rescale of {destination.url} failed: {type(exc).__name__}: {str(exc)[:2000]}",
        "nothing was restored; fix the cause and retry into a new, empty checkpoint location"))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
