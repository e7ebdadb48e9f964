"""``python -m airflow_savepoints.demo``: a local streaming job, savepoints taken, listed and restored.

1. starts the demo job (stateful de-duplication, JSON file sink) on local Spark, fed a file a second;
2. takes periodic savepoints while it runs, then a final stop savepoint, and lists them;
3. restores the newest savepoint into a fresh checkpoint location and restarts the job there;
4. checks the output: every event id exactly once across the stop and the restore.
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from airflow_savepoints.core import SavepointType, list_savepoints, restore_savepoint, take_savepoint
from airflow_savepoints.demo.app import build_query, wait_for_batch, write_events
from airflow_savepoints.storage import Store

console = Console(highlight=False)


def _feed(input_dir: Path, start: int, stop: int, every: float, done: threading.Event) -> set[int]:
    ids: set[int] = set()
    for index in range(start, stop):
        if done.is_set():
            break
        ids.update(write_events(input_dir, index))
        time.sleep(every)
    return ids


def run(workdir: Path, savepoints: int, interval: float) -> int:
    from pyspark.sql import SparkSession

    shutil.rmtree(workdir, ignore_errors=True)
    input_dir, output = workdir / "input", workdir / "output"
    checkpoint, restored_checkpoint = workdir / "checkpoint", workdir / "checkpoint-restored"
    savepoint_dir = Store(str(workdir / "savepoints"))
    job = "demo-dedup"
    console.rule("[bold]airflow-savepoints demo")
    console.print(f"work folder: {workdir}")
    spark = (SparkSession.builder.master("local[2]").appName("airflow-savepoints-demo")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sent: set[int] = set()
    sent.update(write_events(input_dir, 0))
    query = build_query(spark, str(input_dir), str(checkpoint), str(output))
    console.print(f"started streaming job [cyan]{job}[/] (query id {query.id})")
    wait_for_batch(query, 0)
    for index in range(1, savepoints + 1):
        sent.update(write_events(input_dir, index))
        time.sleep(interval)
        info = take_savepoint(str(checkpoint), job, savepoint_dir=savepoint_dir, savepoint_type=SavepointType.PERIODIC,
                              reason=f"periodic #{index}")
        console.print(f"periodic savepoint at batch {info.manifest.batch_id}: {info.pointer}")
    query.processAllAvailable()
    query.stop()
    final = take_savepoint(str(checkpoint), job, savepoint_dir=savepoint_dir, savepoint_type=SavepointType.STOP,
                           reason="stop for upgrade")
    console.print(f"job stopped; final savepoint at batch {final.manifest.batch_id}")

    table = Table(title=f"savepoints of {job}")
    for column in ("type", "reason", "batch", "files", "bytes", "pointer"):
        table.add_column(column, overflow="fold")
    infos = list_savepoints(savepoint_dir, job)
    for info in infos:
        m = info.manifest
        table.add_row(m.type.value, m.reason or "", str(m.batch_id), str(len(m.files)), str(m.total_bytes), info.pointer)
    console.print(table)

    latest = infos[-1]
    result = restore_savepoint(latest.pointer, str(restored_checkpoint), sink_path=str(output))
    console.print(f"restored batch {result.batch_id} into {result.checkpoint}")
    for key, value in result.spark_conf_to_set.items():
        spark.conf.set(key, value)
    query = build_query(spark, str(input_dir), str(restored_checkpoint), str(output))
    for index in range(savepoints + 1, savepoints + 4):
        sent.update(write_events(input_dir, index))
    first_new = wait_for_batch(query, result.batch_id + 1)
    query.processAllAvailable()
    console.print(f"restarted job resumed at batch {result.batch_id + 1} (now at {query.lastProgress['batchId']},"
                  f" first new batch {first_new})")
    query.stop()

    rows = spark.read.schema("id long, user string, ts timestamp").json(str(output)).select("id").collect()
    ids = [r.id for r in rows]
    ok = sorted(ids) == sorted(sent)
    console.print(f"output: {len(ids)} events, {len(set(ids))} distinct ids, {len(sent)} distinct ids sent")
    spark.stop()
    if ok:
        console.print("[bold green]every event exactly once across the stop and the restore[/]")
        return 0
    console.print("[bold red]output does not match the input: duplicates or losses[/]")
    return 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("demo-run").resolve())
    parser.add_argument("--savepoints", type=int, default=3)
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args()
    raise SystemExit(run(args.workdir.resolve(), args.savepoints, args.interval))


if __name__ == "__main__":
    main()
