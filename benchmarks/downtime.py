"""A job's downtime, split into Spark's own share and this tool's (issue 43 item 5, issue 42's benchmark).

The demo job (``airflow_savepoints/demo/app.py``: a de-duplication, RocksDB state, a JSON file sink, a 0.5 s
trigger) under spark-submit on ``local[2]``, fed one input file every ``--feed-every`` seconds, so that
every batch has data. A batch counts when its entry appears in the file sink's log (``_spark_metadata/N``,
written as the batch commits): its file's modification time is the moment, so no poll interval weighs on
any figure. Each repeat measures, in this order:

Spark's own (the baselines), a bare ``spark-submit`` of the same command without this tool's conf (the
demo then only waits on its query, ``awaitTermination``):

* ``spark_start``: the submit to the first batch, on a new checkpoint;
* ``spark_stop``: SIGTERM to the driver's process group to the process gone (Spark's shutdown hooks);
* ``spark_restart``: a new submit on the same checkpoint (Spark's own recovery) to its first new batch.

This tool's, each a fresh process of the CLI as a user runs it (``airflow-savepoints job ...``):

* ``job_start``: ``job start --fresh`` to the first batch (and to the command's exit);
* ``job_stop``: ``job stop`` to the driver's process gone, and to the command's exit (the stop savepoint);
* ``restart``: ``job stop`` then ``job start`` (from the stop savepoint): the stop's start to the first new batch;
* ``upgrade``: ``job upgrade --no-check-first --conf <a new output column>`` (savepoint mode): from the moment it
  begins to stop the old version (its log line) to the new version's first batch;
* ``autoscale``: what ``job autoscale`` carries out (``autoscale.scale_request``): a savepoint-mode upgrade to the
  same version with new executors (``spark.cores.max``) and ``--state-partitions``, checked first: from the
  start of its stop (after the check) to the first batch of the new configuration.

Each downtime's Spark share is what Spark itself needs for the same transition: ``spark_start`` for a start,
``spark_stop`` for a stop, ``spark_stop + spark_restart`` for a restart, an upgrade and an autoscale action; for
the autoscale action also ``spark_rewrite``, Spark's own offline repartition of the state (the ``durationMs`` its
``OfflineStateRepartitionRunner`` logs in the rescale application's log), which a bare rescale runs too (besides
the start of an application to run it in, not counted). ``autoscale_without_rewrite`` keeps the row without it.
The rest is this tool's share. Every line the commands log (stderr) is kept with its time, so a share can
be traced to its step. Prints ratios and differences; ``--json-file`` writes the raw report.

    python benchmarks/downtime.py [--repeats 2] [--json-file benchmarks/results/downtime.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import airflow_savepoints.demo.app as demo  # noqa: E402
from airflow_savepoints.jobs import StreamingJob  # noqa: E402
from airflow_savepoints.jobs.launch.launcher import spark_submit_command  # noqa: E402

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB}


def sink_batches(output: Path) -> dict[int, float]:
    """Batch id -> the time its entry was written into the file sink's log (a compaction's file counts for its id)."""
    log = output / "_spark_metadata"
    found: dict[int, float] = {}
    if not log.is_dir():
        return found
    for entry in os.scandir(log):
        head = entry.name.split(".")[0]
        if head.isdigit() and not entry.name.startswith("."):
            found[int(head)] = entry.stat().st_mtime
    return found


def first_batch_after(output: Path, after: int, since: float, timeout: float = 600) -> tuple[int, float]:
    """The first batch past ``after`` in the sink and when it was written (waits for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newer = {b: t for b, t in sink_batches(output).items() if b > after and t >= since - 0.05}
        if newer:
            batch = min(newer)
            return batch, newer[batch]
        time.sleep(0.05)
    raise TimeoutError(f"no batch past {after} in {output} within {timeout}s")


def last_not_run(before: int, done: dict) -> int:
    """The newest batch an upgrade's new configuration did not run: the sink's last before it, its stop batch, or the
    rescale's repartition batch (recorded, empty, in the sink's log by the rescale, not by a run)."""
    restored = (done.get("started") or {}).get("restored") or {}
    return max(before, done["stop_batch"], restored.get("repartition_batch_id") or -1)


def last_batch(output: Path) -> int:
    return max(sink_batches(output), default=-1)


def gone(pid: int, timeout: float = 300) -> float:
    """When the process ``pid`` is gone (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return time.time()
        except psutil.NoSuchProcess:
            return time.time()
        time.sleep(0.01)
    raise TimeoutError(f"pid {pid} still runs after {timeout}s")


class Command:
    """A CLI command in its own process; each stderr line kept with its time."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.started = time.time()
        self.lines: list[tuple[float, str]] = []
        self.process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append((time.time(), line.rstrip()))

    def wait(self, timeout: float = 900) -> dict:
        out = self.process.stdout.read()  # stderr is the reader thread's
        self.process.wait(timeout)
        self._reader.join(5)
        self.ended = time.time()
        if self.process.returncode != 0:
            raise RuntimeError(f"{self.process.args} failed ({self.process.returncode}):\n{out}\n"
                               + "\n".join(line for _, line in self.lines[-30:]))
        return json.loads(out)

    def line_time(self, starts: str) -> float:
        for at, line in self.lines:
            if line.startswith(starts):
                return at
        raise KeyError(f"no line starting {starts!r} in {[line for _, line in self.lines]}")

    def log(self) -> list[list]:
        return [[round(at - self.started, 3), line] for at, line in self.lines]


class Bench:
    def __init__(self, work: Path, feed_every: float):
        self.work = work
        self.input = work / "input"
        self.sent: set[int] = set()
        self.feeder = demo.Feeder(self.input, self.sent, 0, every=feed_every)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(work / "airflow-home"),
                    "SAVEPOINTS_LOG_DIR": str(work / "logs"), "PYSPARK_PYTHON": sys.executable,
                    "COLUMNS": "500"}  # one log line per line (rich wraps at the width it assumes)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.cli = [sys.executable, "-m", "airflow_savepoints.cli.main"]

    def job(self, name: str) -> StreamingJob:
        return StreamingJob.model_validate({
            "name": name, "application": demo.__file__, "master": "local[2]",
            "application_args": [str(self.input), "{checkpoint}", str(self.work / name / "output")],
            "spark_conf": CONF, "checkpoint": str(self.work / name / "checkpoint"),
            "sink": {"kind": "file", "path": str(self.work / name / "output")},  # a rescale records its batch in its log
            "savepoint_dir": str(self.work / "savepoints")})

    # --- Spark's own ------------------------------------------------------------------------------------------
    def spark_alone(self, repeat: int) -> dict:
        job = self.job(f"bare-{repeat}")
        output = Path(job.application_args[2])
        command = spark_submit_command(job, job.checkpoint, {})
        command[0] = shutil.which("spark-submit", path=self.env["PATH"]) or command[0]
        log = open(self.work / f"bare-{repeat}.log", "ab")  # noqa: SIM115 - closed below

        def submit() -> tuple[subprocess.Popen, float]:
            started = time.time()
            return subprocess.Popen(command, env=self.env, stdout=log, stderr=log, start_new_session=True), started

        def stop(process: subprocess.Popen) -> float:
            started = time.time()
            os.killpg(process.pid, signal.SIGTERM)
            ended = gone(process.pid)
            process.wait()
            return ended - started

        process, started = submit()
        _, at = first_batch_after(output, -1, started)
        figures = {"spark_start": at - started}
        time.sleep(2)  # a few batches, as a running job has
        figures["spark_stop"] = stop(process)
        before = last_batch(output)
        process, started = submit()
        _, at = first_batch_after(output, before, started)
        figures["spark_restart"] = at - started
        time.sleep(1)
        stop(process)
        log.close()
        return figures

    # --- this tool's ------------------------------------------------------------------------------------------
    def run(self, argv: list[str], jobs_file: Path) -> Command:
        return Command([*self.cli, "job", *argv, "--jobs-file", str(jobs_file), "--json"], self.env)

    def rewrite_seconds(self, name: str, upgraded: dict) -> float:
        """Spark's own repartition of the stop savepoint's copy: its ``durationMs``, from the rescale log that
        names the new run's checkpoint."""
        checkpoint = upgraded["started"]["checkpoint"]
        for log_file in sorted((self.work / "logs").glob(f"{name}-rescale-*.log")):
            for line in log_file.read_text(errors="replace").splitlines():
                if "Completed state repartitioning" in line and f"{checkpoint}," in line:
                    return int(re.search(r"durationMs=(\d+)", line).group(1)) / 1000
        raise RuntimeError(f"no rescale log of {name} names {checkpoint}")

    def driver_pid(self, name: str) -> int:
        return json.loads((self.work / "savepoints" / name / "_run.json").read_text())["pid"]

    def tool(self, repeat: int) -> dict:
        name = f"demo-{repeat}"
        job = self.job(name)
        output = Path(job.application_args[2])
        jobs_file = self.work / f"jobs-{repeat}.yaml"
        jobs_file.write_text(json.dumps({"jobs": [json.loads(job.model_dump_json(exclude_defaults=True))]}))
        figures: dict = {"logs": {}}

        def keep(key: str, command: Command) -> None:
            figures["logs"][key] = command.log()

        start = self.run(["start", name, "--fresh"], jobs_file)
        _, at = first_batch_after(output, -1, start.started)
        start.wait()
        keep("job_start", start)
        figures["job_start"], figures["job_start_command"] = at - start.started, start.ended - start.started
        time.sleep(2)

        pid = self.driver_pid(name)
        stop = self.run(["stop", name], jobs_file)
        gone_at = gone(pid)
        stopped = stop.wait()
        keep("job_stop", stop)
        figures["job_stop"], figures["job_stop_command"] = gone_at - stop.started, stop.ended - stop.started
        start = self.run(["start", name], jobs_file)  # the restart's second half: from the stop savepoint
        _, at = first_batch_after(output, stopped["batch_id"], start.started)
        start.wait()
        keep("restart_start", start)
        figures["restart"] = at - stop.started
        figures["restart_parts"] = {"stop_command": stop.ended - stop.started, "start_to_first_batch": at - start.started,
                                    "start_command": start.ended - start.started}
        time.sleep(2)

        before = last_batch(output)
        upgrade = self.run(["upgrade", name, "--no-check-first", "--mode", "savepoint",
                            "--conf", f"{demo.VERSION_COLUMN_CONF}=v{repeat}"], jobs_file)
        done = upgrade.wait()
        stop_began = upgrade.line_time("upgrading job")
        _, at = first_batch_after(output, last_not_run(before, done), stop_began)
        keep("upgrade", upgrade)
        figures["upgrade"], figures["upgrade_command"] = at - stop_began, upgrade.ended - upgrade.started
        time.sleep(2)

        before = last_batch(output)
        scale = self.run(["upgrade", name, "--check-first", "--mode", "savepoint", "--state-partitions", "4",
                          "--conf", f"{demo.VERSION_COLUMN_CONF}=v{repeat}", "--conf", "spark.cores.max=2"], jobs_file)
        done = scale.wait()
        stop_began = scale.line_time("upgrading job")
        _, at = first_batch_after(output, last_not_run(before, done), stop_began)
        keep("autoscale", scale)
        figures["autoscale"], figures["autoscale_command"] = at - stop_began, scale.ended - scale.started
        figures["autoscale_check"] = stop_began - scale.started
        figures["spark_rewrite"] = self.rewrite_seconds(name, done)
        self.run(["stop", name], jobs_file).wait()
        figures["no_duplicate_ids"] = sorted(demo.committed_event_ids(output)) == sorted(set(demo.committed_event_ids(output)))
        return figures


SPARK_SHARE = {"job_start": ("spark_start",), "job_stop": ("spark_stop",), "restart": ("spark_stop", "spark_restart"),
               "upgrade": ("spark_stop", "spark_restart"), "autoscale": ("spark_stop", "spark_restart", "spark_rewrite"),
               "autoscale_without_rewrite": ("spark_stop", "spark_restart")}


def summarize(repeats: list[dict]) -> dict:
    """Medians over the repeats; each downtime beside its Spark share: ratio and this tool's share (seconds)."""
    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in repeats), 3)

    spark = {k: median(k) for k in ("spark_start", "spark_stop", "spark_restart", "spark_rewrite")}
    rows = {}
    for key, parts in SPARK_SHARE.items():
        ours = median(key.removesuffix("_without_rewrite"))
        share = round(sum(spark[p] for p in parts), 3)
        rows[key] = {"seconds": ours, "spark_share_s": share, "tool_share_s": round(ours - share, 3),
                     "ratio_to_spark": round(ours / share, 2) if share else None,
                     "tool_share_under_2s": ours - share < 2.0}
    return {"spark": spark, "downtime": rows,
            "commands_s": {k: median(k) for k in ("job_start_command", "job_stop_command", "upgrade_command",
                                                    "autoscale_command", "autoscale_check")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--feed-every", type=float, default=0.5, help="seconds between input files")
    parser.add_argument("--json-file", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its logs)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="savepoint-downtime-"))
    report: dict = {"load_average_at_start": os.getloadavg(), "repeats": [], "cpus": os.cpu_count()}
    bench = Bench(work, args.feed_every)
    try:
        with bench.feeder:
            for r in range(args.repeats):  # Spark's own and ours alternate, so the machine's drift weighs on both
                figures = bench.spark_alone(r)
                print(f"repeat {r}: spark {json.dumps({k: round(v, 2) for k, v in figures.items()})}", file=sys.stderr)
                figures.update(bench.tool(r))
                print(f"repeat {r}: ours " + json.dumps({k: round(v, 2) for k, v in figures.items()
                                                         if isinstance(v, float)}), file=sys.stderr)
                report["repeats"].append(figures)
    finally:
        report["load_average_at_end"] = os.getloadavg()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work folder kept: {work}", file=sys.stderr)
    if report["repeats"]:
        report["summary"] = summarize(report["repeats"])
        print(f"{'downtime':<25} {'ours s':>8} {'Spark s':>8} {'ratio':>6} {'tool s':>7}")
        for key, row in report["summary"]["downtime"].items():
            print(f"{key:<25} {row['seconds']:>8.2f} {row['spark_share_s']:>8.2f} {row['ratio_to_spark'] or 0:>6.2f} "
                  f"{row['tool_share_s']:>7.2f}")
    if args.json_file:
        args.json_file.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
