"""A savepoint's state read as a Spark application of its job, submitted through the job's submit path::

    spark-submit [the job's master, deploy mode and conf] inspect_app.py POINTER RESULT OPERATOR SAMPLE

Reads the savepoint at POINTER in place with Spark's state sources (the job's executors do the counting,
with the job's store connector and credentials), OPERATOR only when not ``-``, SAMPLE rows a store. Writes
``result.json`` into the folder RESULT, read back by :mod:`airflow_savepoints.jobs.workflows.inspect`:
``{"outcome": "inspected", "summary": {...}}`` (the summary ``inspect`` prints), or ``{"outcome": "failed",
"error": {code, message, hint}}``. Imports pyspark and the package's core; no Airflow.
"""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__main__":  # run as a file: this folder's modules are no top-level modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from airflow_savepoints.errors import StateUnreadableError  # noqa: E402
from airflow_savepoints.jobs.driver.app_result import run_and_report  # noqa: E402


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from airflow_savepoints.core.state_reader import inspect_savepoint

    pointer, result_folder, operator, sample = argv[1:5]
    started = time.monotonic()
    spark = SparkSession.builder.appName("airflow-savepoints-inspect").getOrCreate()

    def say(line: str) -> None:  # into the application's log: the caller shows its own progress
        print(f"{time.monotonic() - started:6.1f}s {line}", file=sys.stderr, flush=True)

    def inspect() -> dict:
        summary = inspect_savepoint(pointer, spark=spark, operator=None if operator == "-" else int(operator),
                                    sample=int(sample), read_via="in_place", progress=say, strict=True)
        return {"outcome": "inspected", "summary": summary.as_json(), "read_s": round(time.monotonic() - started, 1)}

    return run_and_report(spark, result_folder, inspect, lambda exc: StateUnreadableError(
        f"the inspection of {pointer} failed: {type(exc).__name__}: {str(exc)[:2000]}",
        "see the application's log; the savepoint was not changed"))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
