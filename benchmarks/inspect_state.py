"""``inspect`` against a direct ``statestore`` read of the same savepoints (benchmarks/run.py, step ``inspect``).

The direct read is what a user writes by hand for the same figure, rows per partition of every
operator: ``spark.read.format("statestore").option("batchId", N).option("operatorId", op).load(savepoint)``
grouped by ``partition_id``, with the operator ids known beforehand. ``inspect`` does that too, and
also reads Spark's ``state-metadata``, each store's schema, and pins the savepoint while it reads.
Both use the same Spark session, best of ``repeats``, each after a warm-up read.
"""

from __future__ import annotations

import time

from airflow_savepoints.core.pointer import resolve_pointer
from airflow_savepoints.core.state_reader import inspect_savepoint
from airflow_savepoints.core.state_summary import state_files


def direct_read(spark, pointer: str) -> int:
    """Rows of every operator of the savepoint, per partition, as one would read them by hand."""
    location, manifest = resolve_pointer(pointer)
    rows = 0
    for op in state_files(manifest):
        frame = (spark.read.format("statestore").option("batchId", manifest.batch_id).option("operatorId", int(op))
                 .load(location.root))
        rows += sum(r[1] for r in frame.groupBy("partition_id").count().collect())
    return rows


def inspect_against_statestore(spark, pointers: dict[str, str], repeats: int) -> dict:
    """Seconds of ``inspect`` and of the direct read over all ``pointers`` (best of ``repeats``), and their rows."""
    def best(read) -> tuple[float, int]:
        read()  # warm-up: the JVM's code paths and the page cache, for both alike
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            rows = read()
            runs.append(time.perf_counter() - start)
        return min(runs), rows

    ours, our_rows = best(lambda: sum(inspect_savepoint(p, spark=spark).total_rows or 0 for p in pointers.values()))
    direct, direct_rows = best(lambda: sum(direct_read(spark, p) for p in pointers.values()))
    return {"inspect_s": round(ours, 3), "statestore_s": round(direct, 3), "rows": our_rows,
            "rows_match": our_rows == direct_rows}
