"""A large state read where its job runs (``job inspect``) beside the CLI's own local Spark (``inspect``), cold,
both from the command to the answer (issue 43 item 3).

Builds the rescale benchmark's state (``--keys`` keys, default 1,000,000, in 2 RocksDB partitions: a streaming
aggregation over parquet, :class:`benchmarks.run.Job`), takes a savepoint of it, starts a Spark standalone cluster
(a master and one worker, ``--worker-cores``, ``--worker-memory``) and declares a job on it in a jobs file. Then,
alternating, ``--runs`` times each, in a new process: ``airflow-savepoints job inspect JOB --from POINTER --json``
(a Spark application of the job counts the state on the worker's executor) and ``airflow-savepoints inspect
POINTER --json`` (the CLI's in-process local Spark). Both must count every key.

    python benchmarks/inspect_on_cluster.py [--keys 1000000] [--runs 2] [--json-file F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_savepoints.core import take_savepoint  # noqa: E402
from benchmarks.run import Job, spark_session  # noqa: E402
from tests.support.spark_cluster import standalone_cluster  # noqa: E402


def timed(command: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = round(time.perf_counter() - started, 2)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[2:5])} failed ({done.returncode}): {done.stderr[-3000:]}")
    return took, json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--worker-cores", type=int, default=2)
    parser.add_argument("--worker-memory", default="2g")
    parser.add_argument("--json-file")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "airflow_savepoints.cli.main"]
    with tempfile.TemporaryDirectory(prefix="inspect-on-cluster-") as folder:
        work = Path(folder)
        spark = spark_session()
        job = Job(spark, work / "big", "rocksdb", 2)
        began = time.perf_counter()
        job.run_batch(args.keys)
        built_s = round(time.perf_counter() - began, 1)
        spark.stop()
        pointer = take_savepoint(str(job.checkpoint), "big", savepoint_dir=str(work / "savepoints")).pointer
        print(f"{args.keys} keys built in {built_s} s; savepoint {pointer}", file=sys.stderr)
        with standalone_cluster(work / "cluster", cores=args.worker_cores, memory=args.worker_memory) as cluster:
            jobs = work / "jobs.yaml"
            jobs.write_text(
                "jobs:\n  - name: big\n"
                f"    application: {ROOT / 'airflow_savepoints' / 'demo' / 'app.py'}\n"
                f"    master: {cluster.master_url}\n"
                "    spark_conf: {spark.ui.enabled: 'false', spark.executor.memory: 1g, spark.sql.shuffle.partitions: '2'}\n"
                f"    checkpoint: {work / 'checkpoint'}\n    savepoint_dir: {work / 'savepoints'}\n")
            runs = []
            for _ in range(args.runs):
                on_job, answer = timed([*cli, "job", "inspect", "big", "--from", pointer, "--jobs-file", str(jobs), "--json",
                                        "--log-dir", str(work / "logs")])
                local, summary = timed([*cli, "inspect", pointer, "--json", "--quiet"])
                runs.append({"job_inspect_s": on_job, "application_s": answer["application"]["took_s"],
                             "read_in_application_s": answer["application"]["read_s"], "local_inspect_s": local,
                             "rows": [answer["total_rows"], summary["total_rows"]], "load_average": os.getloadavg()})
                print(json.dumps(runs[-1]), file=sys.stderr)
    report = {"keys": args.keys, "built_s": built_s, "worker": f"{args.worker_cores} cores, {args.worker_memory}",
              "runs": runs, "every_key_counted": all(r["rows"] == [args.keys, args.keys] for r in runs),
              "job_inspect_over_local": [round(r["job_inspect_s"] / r["local_inspect_s"], 2) for r in runs]}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json_file:
        Path(args.json_file).write_text(text + "\n")
    return 0 if report["every_key_counted"] else 1


if __name__ == "__main__":
    sys.exit(main())
