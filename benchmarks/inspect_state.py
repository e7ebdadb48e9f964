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


# --- cold: a new process per run, from the command to the answer --------------------------------------------------
SPARK_ALONE = """
import sys, time
from pyspark import SparkConf
from pyspark.sql import SparkSession
started = time.monotonic()
path, batch, operators = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
spark = SparkSession.builder.config(conf=SparkConf().setMaster("local[*]").set("spark.ui.enabled", "false")
                                    .set("spark.ui.showConsoleProgress", "false")).getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
spark.streams.active  # the state store coordinator: without it RocksDB state fails to load
print(f"spark_started_s={time.monotonic() - started:.3f}", file=sys.stderr)
rows = 0
for op in operators:
    frame = spark.read.format("statestore").option("batchId", batch).option("operatorId", int(op)).load(path)
    rows += sum(r[1] for r in frame.groupBy("partition_id").count().collect())
print(rows)
"""


def cold_runs(pointer: str, python: str, pythonpath: str, runs: int, env: dict[str, str] | None = None) -> dict:
    """Wall seconds of ``airflow-savepoints inspect POINTER --json`` in a new process each run (the code at
    ``pythonpath``), its progress lines (seconds since the command started, per phase), and, alternating with it,
    Spark's own cold answer: a new Python process that starts a local session as pyspark does by default and
    counts rows per partition of each operator with the ``statestore`` source (the ids given, no metadata read)."""
    import json
    import os
    import re
    import subprocess

    location, manifest = resolve_pointer(pointer)
    operators = ",".join(state_files(manifest))
    base = {**os.environ, **(env or {})}
    ours, spark_alone, phases = [], [], []
    rows = None
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([python, "-m", "airflow_savepoints.cli.main", "inspect", pointer, "--json", "--conn-id", ""],
                              env={**base, "PYTHONPATH": pythonpath}, cwd=pythonpath, capture_output=True, text=True,
                              check=True)
        ours.append(round(time.perf_counter() - start, 3))
        rows = json.loads(done.stdout)["total_rows"]
        phases.append({m.group(2).strip(): float(m.group(1))
                       for m in re.finditer(r"^\s*([\d.]+)s ([^:(\n]+)", done.stderr, re.M)})
        start = time.perf_counter()
        alone = subprocess.run([python, "-c", SPARK_ALONE, location.root, str(manifest.batch_id), operators],
                               env=base, capture_output=True, text=True)
        if alone.returncode:
            raise RuntimeError(f"Spark's own read failed: {alone.stderr[-3000:]}")
        spark_alone.append(round(time.perf_counter() - start, 3))
        assert int(alone.stdout.strip().splitlines()[-1]) == rows, (alone.stdout, rows)
    return {"pointer": pointer, "rows": rows, "inspect_cold_s": ours, "spark_alone_cold_s": spark_alone,
            "inspect_phases": phases, "noise_lines_on_stderr": _noise(done.stderr), "load_average": os.getloadavg()}


def _noise(stderr: str) -> list[str]:
    """Lines of the last run's stderr that are neither progress lines nor empty: Spark's own output."""
    import re

    return [line for line in stderr.splitlines() if line.strip() and not re.match(r"^\s*[\d.]+s ", line)]


if __name__ == "__main__":
    import argparse
    import json
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(description="cold inspect against Spark's own cold statestore read")
    parser.add_argument("pointers", nargs="+")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--pythonpath", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout whose inspect runs (another one: its code before a change)")
    parser.add_argument("--json-file")
    args = parser.parse_args()
    report = {p: cold_runs(p, sys.executable, args.pythonpath, args.runs) for p in args.pointers}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json_file:
        Path(args.json_file).write_text(text + "\n")
