"""Savepoint and restore performance on real Spark checkpoints, against ``cp -r`` of the same files.

    python benchmarks/run.py                 # full size (1.2 GB of state in two stores, 2,000+ files)
    python benchmarks/run.py --quick --json  # small size, a few minutes, one JSON object on stdout
    python benchmarks/run.py --object-store --medium  # S3 at 800 files against s5cmd and aws (see object_store.py)
    python benchmarks/run.py --size-gb 4 --partitions 400
    python benchmarks/run.py --cli-start     # only the CLI's start: each local command against python -c pass
    python benchmarks/run.py --rescale       # only the rescale: 1M RocksDB keys 2 -> 8, ours against Spark's own

Spark writes two checkpoints of a stateful aggregation, one with the HDFS state store, one with
RocksDB, whose state together is ``--size-gb`` of incompressible rows (half each). Every timed savepoint
includes its checksums (the CRC32C of each file is computed, or reused only for a file proven
unchanged since the previous savepoint). ``cp -r`` copies exactly the files the savepoint copies
(a tree of hard links to them), after a warm-up, from the page cache like the savepoint; ``sync``
runs before each timed step so no earlier writeback is charged to it. Each ratio is from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

from airflow_savepoints.checkpoint.planner import plan_checkpoint  # noqa: E402
from airflow_savepoints.core import restore_savepoint, take_savepoint  # noqa: E402
from airflow_savepoints.core.copier import checksum_of, workers_for  # noqa: E402
from airflow_savepoints.core.dispose import dispose_savepoint  # noqa: E402
from airflow_savepoints.storage import Store  # noqa: E402

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PAYLOAD_CHARS = 512  # hex of SHA-512s: LZ4 (both stores' codec) cannot shrink it
STORES = {"hdfs": HDFS, "rocksdb": ROCKSDB}


def quiesce(spark) -> None:
    """Stop Spark (its maintenance threads and RocksDB's background work) and let writeback settle."""
    spark.stop()
    sync()
    time.sleep(3)


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def sync() -> None:
    os.sync()


def timed(fn):
    sync()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


# --- the command line's start ---------------------------------------------------------------------------
def cli_start(work: Path, repeats: int) -> dict[str, float]:
    """Best-of-N wall time of ``python -c pass``, ``--version`` and each local command on a small savepoint
    (tests/data: a 15-file checkpoint): ``list``, ``trigger``, ``show``, ``verify``, ``offsets``, ``restore``
    (into a new folder each time), ``status --job`` and ``job status`` (a jobs file naming the job), interleaved
    in one run, with no connection named and a fresh AIRFLOW_HOME: what an on-call command or a script pays.
    Also each best CPU time (``<name>_cpu``: user + system of its process), which the machine's load moves least."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SAVEPOINTS__"))}
    env.update(AIRFLOW_HOME=str(work / "cli-airflow-home"), PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "airflow_savepoints.cli.main"]
    checkpoint, root = ROOT / "tests" / "data" / "spark35" / "hdfs", work / "cli-sp"
    (root / "j").mkdir(parents=True, exist_ok=True)
    taken = subprocess.run([*cli, "trigger", str(checkpoint), "--job", "j", "--dir", str(root), "--json"], env=env,
                           cwd=ROOT, check=True, capture_output=True, text=True)
    pointer = json.loads(taken.stdout)["pointer"]
    jobs = work / "cli-jobs.yaml"
    jobs.write_text(json.dumps({"jobs": [{"name": "j", "application": "app.py", "checkpoint": str(checkpoint),
                                          "savepoint_dir": str(root)}]}))
    restores = iter(range(10**6))
    commands = {"python_pass": lambda: [sys.executable, "-c", "pass"], "version": lambda: [*cli, "--version"],
                "list": lambda: [*cli, "list", "--job", "j", "--dir", str(root), "--json"],
                "trigger": lambda: [*cli, "trigger", str(checkpoint), "--job", "j", "--dir", str(root), "--json"],
                "show": lambda: [*cli, "show", pointer, "--json"],
                "verify": lambda: [*cli, "verify", pointer, "--json"],
                "offsets": lambda: [*cli, "offsets", pointer, "--json"],
                "restore": lambda: [*cli, "restore", pointer, "--to", str(work / f"cli-restored-{next(restores)}"), "--json"],
                "status": lambda: [*cli, "status", "--job", "j", "--dir", str(root), "--json"],
                "job_status": lambda: [*cli, "job", "status", "j", "--jobs-file", str(jobs), "--json"]}
    best = dict.fromkeys(commands, float("inf"))
    cpu = dict.fromkeys(commands, float("inf"))  # user + system seconds of the command's process: what load moves least
    for _ in range(max(repeats, 5)):
        for name, command in commands.items():
            argv = command()
            used, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(argv, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            best[name] = min(best[name], time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name] = min(cpu[name], after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime)
    return {**{name: round(seconds, 3) for name, seconds in best.items()},
            **{f"{name}_cpu": round(seconds, 3) for name, seconds in cpu.items()}}


CLI_COMMANDS = ("list", "trigger", "show", "verify", "offsets", "restore", "status", "job_status")


def cli_targets(c: dict[str, float]) -> list[dict]:
    """The start's targets: each local command on a small savepoint within 0.4 s of a bare Python start."""
    return [{"name": f"CLI {name.replace('_', ' ')} on a local root: seconds above python -c pass "
                     f"(--version {c['version']:.3f}s)",
             "ratio": round(c[name] - c["python_pass"], 3), "target": "<= 0.4", "met": c[name] - c["python_pass"] <= 0.4,
             "note": f"{c[name]:.3f}s = {c[name] / c['python_pass']:.1f}x python -c pass, "
                     f"{c[name] / c['version']:.2f}x --version"
                     + (f"; CPU {c[name + '_cpu']:.3f}s, {c[name + '_cpu'] - c['python_pass_cpu']:.3f}s above python -c pass's"
                        if name + "_cpu" in c else "")} for name in CLI_COMMANDS if name in c]


# --- building real checkpoints ------------------------------------------------------------------------
def spark_session():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("airflow-savepoints-bench")
             .config("spark.driver.memory", "8g")
             .config("spark.sql.streaming.maxBatchesToRetainInMemory", "1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", "100000")  # deltas stay deltas
             .config("spark.sql.streaming.stateStore.maintenanceInterval", "5s")  # unloads stores of stopped runs
             .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Job:
    """A streaming aggregation over parquet inputs; each ``batch`` adds ``rows`` new keys of state."""

    def __init__(self, spark, base: Path, store: str, partitions: int, payload_chars: int = PAYLOAD_CHARS):
        self.spark, self.base, self.store, self.partitions = spark, base, store, partitions
        self.payload_chars = payload_chars
        self.input, self.checkpoint = base / "input", base / "checkpoint"
        self.input.mkdir(parents=True, exist_ok=True)
        self.next_key, self.files = 0, 0

    def add_input(self, rows: int, hold: Path | None = None) -> list[Path]:
        """Write ``rows`` new keys as parquet files into the input folder (or ``hold`` them aside)."""
        from pyspark.sql import functions as F

        start, self.next_key = self.next_key, self.next_key + rows
        payload = F.substring(F.concat(*[F.sha2(F.concat(F.col("id").cast("string"), F.lit(f"-{i}")), 512)
                                         for i in range(-(-self.payload_chars // 128))]), 1, self.payload_chars)
        frame = self.spark.range(start, start + rows).select(F.format_string("k%012d", "id").alias("key"),
                                                              payload.alias("payload"))
        staging = self.base / f"staging-{self.files}"
        frame.coalesce(2).write.parquet(str(staging))
        moved = []
        for part in sorted(staging.glob("part-*.parquet")):
            moved.append((hold or self.input) / f"{self.files:06d}-{part.name}")
            moved[-1].parent.mkdir(parents=True, exist_ok=True)
            part.rename(moved[-1])
        shutil.rmtree(staging)
        self.files += 1
        return moved

    def start(self, trigger: dict | None = None, checkpoint: Path | None = None):
        from pyspark.sql import functions as F

        self.spark.conf.set("spark.sql.shuffle.partitions", str(self.partitions))
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", STORES[self.store])
        frame = self.spark.readStream.schema("key string, payload string").parquet(str(self.input))
        agg = frame.groupBy("key").agg(F.max("payload").alias("payload"))
        return (agg.writeStream.outputMode("update").format("noop").trigger(**(trigger or {"availableNow": True}))
                .option("checkpointLocation", str(checkpoint or self.checkpoint)).start())

    def run_batch(self, rows: int) -> None:
        self.add_input(rows)
        query = self.start()
        query.awaitTermination()
        if query.exception():
            raise RuntimeError(query.exception())


def build(spark, work: Path, store: str, size_gb: float, partitions: int, batches: int, name: str = "") -> Job:
    job = Job(spark, work / (name or store), store, partitions)
    rows = int(size_gb * 1e9 / (PAYLOAD_CHARS + 60) / batches)
    for b in range(batches):
        t0 = time.perf_counter()
        job.run_batch(rows)
        log(f"  {store}: batch {b + 1}/{batches} ({rows} new keys) in {time.perf_counter() - t0:.1f}s")
    return job


# --- measuring ----------------------------------------------------------------------------------------
def planned_files(checkpoint: Path) -> list[tuple[str, int]]:
    store = Store(str(checkpoint))
    plan = plan_checkpoint(store.list_files(), store.read_bytes)
    return [(f.path, f.size) for f in plan.files]


def link_tree(checkpoint: Path, files: list[tuple[str, int]], into: Path) -> None:
    for rel, _ in files:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(checkpoint / rel, into / rel)


def cp_r(src: Path, dst: Path, repeats: int) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)  # warm-up (and page cache)
    shutil.rmtree(dst)
    best = float("inf")
    for _ in range(repeats):
        seconds, _ = timed(lambda: subprocess.run(["cp", "-r", str(src), str(dst)], check=True))
        shutil.rmtree(dst)
        best = min(best, seconds)
    return best


def links_alone(checkpoints: dict[str, Path], files: dict[str, list[tuple[str, int]]], into: Path, repeats: int) -> float:
    """The floor of any savepoint that links each file: the folders made and one ``link`` per file in
    a tight loop, nothing else (no listing, planning, stat or manifest). Best of ``repeats``."""
    pairs = [(str(checkpoints[s] / rel), str(into / s / rel)) for s in files for rel, _ in files[s]]
    folders = sorted({os.path.dirname(target) for _, target in pairs})

    def link_all() -> None:
        for folder in folders:
            os.makedirs(folder, exist_ok=True)
        for source, target in pairs:
            os.link(source, target)

    best = float("inf")
    for _ in range(repeats):
        shutil.rmtree(into, ignore_errors=True)
        best = min(best, timed(link_all)[0])
    shutil.rmtree(into)
    return best


def checksums_alone(checkpoints: dict[str, Path], files: dict[str, list[tuple[str, int]]], repeats: int) -> float:
    """The floor of any copy that checks every byte: read + CRC32C of the files (the copier's own
    routine, one thread per core), nothing else. Best of ``repeats``."""
    stores = {s: Store(str(c)) for s, c in checkpoints.items()}
    pairs = [(stores[s], rel) for s in files for rel, _ in files[s]]

    def hash_all() -> None:
        with ThreadPoolExecutor(max_workers=workers_for(tuple(stores.values()), 64, len(pairs))) as pool:
            list(pool.map(lambda pair: checksum_of(*pair), pairs))

    return min(timed(hash_all)[0] for _ in range(repeats))


def hashed_or_written(info) -> int:
    return sum(e.size for e in info.manifest.files if e.checksum_source == "read" or e.method == "stream")


def hash_candidates(paths: list[Path], seconds_cap: float = 20.0) -> dict[str, float]:
    """GB/s of read + hash over the state files, 2 threads, one 1 MiB buffer per thread."""
    import hashlib

    import google_crc32c

    makers = {"crc32c (hardware)": None, "sha256": lambda: hashlib.sha256()}
    try:
        import xxhash

        makers["xxh3_64"] = lambda: xxhash.xxh3_64()
    except ImportError:
        pass
    try:
        import blake3

        makers["blake3"] = lambda: blake3.blake3()
    except ImportError:
        pass
    total = sum(p.stat().st_size for p in paths)
    out = {}
    for name, make in makers.items():
        def one(path: Path, make=make) -> None:
            buf = bytearray(1 << 20)
            view = memoryview(buf)
            state = 0 if make is None else make()
            with open(path, "rb", buffering=0) as handle:
                if make is None:  # google-crc32c >= 1.9 takes read-only bytes only, as the copier reads
                    while chunk := handle.read(len(buf)):
                        state = google_crc32c.extend(state, chunk)
                    return
                while n := handle.readinto(buf):
                    state.update(view[:n])

        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(one, paths))
        out[name] = round(total / (time.perf_counter() - start) / 1e9, 2)
    return out


MEMORY_PROBE = Path(__file__).with_name("memory_probe.py")


def memory_peak(work: Path, size: int) -> dict[str, float]:
    src = work / "memory-src"
    src.mkdir(parents=True, exist_ok=True)
    with open(src / "big", "wb") as handle:
        block = os.urandom(1 << 20)
        for _ in range(size // len(block)):
            handle.write(block)
    out = {}
    for mode in ("stream", "auto"):
        dst = work / f"memory-dst-{mode}"
        result = subprocess.run([sys.executable, str(MEMORY_PROBE), str(src), str(dst), mode],
                                capture_output=True, text=True, check=True)
        probe = json.loads(result.stdout.strip().splitlines()[-1])
        out[probe["method"]] = (probe["peak"] - probe["baseline"]) / 2**20
        shutil.rmtree(dst)
    shutil.rmtree(src)
    return out


SAVEPOINT_LOOP = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from airflow_savepoints.core import take_savepoint
from airflow_savepoints.core.retention import RetentionPolicy, retain
from airflow_savepoints.storage import Store
checkpoint, root = sys.argv[1:3]
print("ready", flush=True)
for line in sys.stdin:  # one savepoint (and the retention run after it) per request
    start = time.time()
    take_savepoint(checkpoint, "bench-live", savepoint_dir=root, savepoint_type="periodic")
    retain(Store(root), "bench-live", RetentionPolicy(max_periodic=2, max_age_seconds=None))
    print(json.dumps([start, time.time()]), flush=True)
"""


def batch_durations(spark, work: Path, size_gb: float, batches: int) -> dict:
    """Median batch duration of a running stateful query without, and while, a savepoint is taken
    (by another process, as an Airflow worker would: linked and incremental, retention keeping 2).

    Batches with and without a savepoint alternate one by one: a savepoint is asked for as every
    other batch starts, so the JVM's warm-up and any drift of a shared machine weigh on both sides
    alike. A batch counts as "during" if it overlapped a savepoint and its retention run, as
    "without" if it overlapped none."""
    job = build(spark, work, "hdfs", size_gb, 20, 2, name="live")
    hold = work / "live-hold"
    held = [job.add_input(2000, hold=hold) for _ in range(batches + 12)]  # before the clock starts
    query = job.start(trigger={"processingTime": "1 second"})
    feeding = threading.Event()

    def done_with_input() -> int:
        return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)

    def feed() -> None:  # one input file set per batch: each batch has the same work
        for fed, files in enumerate(held):
            while not feeding.is_set() and done_with_input() < fed:
                time.sleep(0.05)
            if feeding.is_set():
                return
            for path in files:
                path.rename(job.input / path.name)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()

    def with_input(first: int) -> list[dict]:
        return [p for p in query.recentProgress if p["batchId"] >= first and p["numInputRows"] > 0]

    def seconds(progress: dict) -> float:
        return progress["durationMs"]["triggerExecution"] / 1000

    def window(progress: dict) -> tuple[float, float]:
        from datetime import datetime

        start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
        return start, start + seconds(progress)

    loop = subprocess.Popen([sys.executable, "-c", SAVEPOINT_LOOP, str(job.checkpoint), str(work / "live-sp"),
                             str(ROOT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    windows: list[tuple[float, float]] = []
    try:
        assert loop.stdin is not None and loop.stdout is not None
        assert loop.stdout.readline().strip() == "ready"  # imports done
        deadline = time.monotonic() + 120
        while len(with_input(0)) < 2:  # warm up
            if query.exception() or time.monotonic() > deadline:
                raise RuntimeError(query.exception() or "the live query ran no batch")
            time.sleep(0.2)
        first = query.lastProgress["batchId"] + 1
        started, active = 0, False
        deadline = time.monotonic() + 60 * (2 + batches)
        while True:  # the trigger's status every 50 ms; the progress log only when a batch ends
            if query.exception() or time.monotonic() > deadline:
                raise RuntimeError(query.exception() or "the live query did not run enough batches")
            was_active, active = active, query.status["isTriggerActive"]
            if active and not was_active:
                started += 1
                if started % 2 == 0:  # every other batch: one savepoint, as the batch starts
                    loop.stdin.write("go\n")
                    loop.stdin.flush()
                    windows.append(tuple(json.loads(loop.stdout.readline())))
            elif was_active and not active and len(with_input(first)) >= batches:
                break
            time.sleep(0.05)
        loop.stdin.close()
        loop.wait(60)
    finally:
        feeding.set()
        query.stop()
        if loop.poll() is None:
            loop.kill()

    def overlaps(progress: dict) -> bool:
        begin, end = window(progress)
        return any(a < end and begin < b for a, b in windows)

    measured = with_input(first)[:batches]
    without = [seconds(p) for p in measured if not overlaps(p)]
    during = [seconds(p) for p in measured if overlaps(p)]
    return {"without_median_s": statistics.median(without), "during_median_s": statistics.median(during),
            "savepoints_taken": len(windows), "batches_without": len(without),
            "batches_overlapping_a_savepoint": len(during),
            "savepoint_and_retention_median_s": statistics.median(b - a for a, b in windows), "state_gb": size_gb}


def s3_compare(job: Job, work: Path) -> dict:
    import socket

    from tests.support.s3_payload import PayloadCounter

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # moto's server in its own process, like a real service (in this process it would share our GIL)
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "bench", "secret": "bench"}
        bucket = Store("s3://bench-bucket", options)
        bucket.fs.mkdir("bench-bucket")
        ckpt = bucket.child("checkpoint")
        bucket.fs.put(str(job.checkpoint), ckpt.root, recursive=True)
        counter = PayloadCounter(bucket.fs)
        root = bucket.child("savepoints")
        server_side, info = timed(lambda: take_savepoint(ckpt, "s3-copy", savepoint_dir=root, incremental=False))
        copied_keys = {f"{root.root}/s3-copy/{info.manifest.savepoint_id}/{e.path}" for e in info.manifest.files}
        source_keys = {f"{ckpt.root}/{e.path}" for e in info.manifest.files}
        copy_payload = sum(counter.sent[k] for k in copied_keys) + sum(counter.received[k] for k in source_keys)
        planner_reads = copy_payload - sum(counter.sent[k] for k in copied_keys)  # logs the planner must read
        counter.reset()
        streamed, streamed_info = timed(lambda: take_savepoint(ckpt, "s3-stream", savepoint_dir=root, copy_mode="stream"))
        stream_keys = {f"{root.root}/s3-stream/{streamed_info.manifest.savepoint_id}/{e.path}"
                       for e in streamed_info.manifest.files}
        stream_payload = sum(counter.sent[k] for k in stream_keys)
        counter.close()
        return {"server_side_s": server_side, "streamed_s": streamed,
                "server_side_payload_bytes": copy_payload - planner_reads, "planner_read_bytes": planner_reads,
                "streamed_payload_bytes": stream_payload, "bytes": info.manifest.total_bytes,
                "methods": sorted({e.method for e in info.manifest.files})}
    finally:
        server.terminate()
        server.wait(30)


# --- the run ------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small size: a few minutes")
    parser.add_argument("--medium", action="store_true", help="with --object-store: the medium size (800 state "
                        "files over 200 partitions, where a savepoint's fixed costs show), a minute or two")
    parser.add_argument("--json", action="store_true", help="print one JSON object (targets, figures) on stdout")
    parser.add_argument("--size-gb", type=float, help="state of both stores together (default 1.2, quick 0.2)")
    parser.add_argument("--partitions", type=int, help="shuffle partitions (default 200, quick 40)")
    parser.add_argument("--batches", type=int, help="batches that build the state (default 10, quick 5)")
    parser.add_argument("--memory-gb", type=float, help="file size for the memory check (default 1.0, quick 0.25)")
    parser.add_argument("--workdir", help="where to build (default: a temporary folder, removed)")
    parser.add_argument("--repeats", type=int, default=3, help="best of N for cp -r, full savepoints and restores")
    parser.add_argument("--skip", default="", help="comma list of steps to skip: cli,s3,live,memory,hashes,inspect,rescale "
                        "(with --object-store: s3 (the moto passes),peers,gcs,azure)")
    parser.add_argument("--latency-ms", default="20,50", help="with --object-store: the proxy's added latency per "
                        "S3 request, one pass each (comma list, default 20,50)")
    parser.add_argument("--json-file", help="also write the JSON report to this file")
    parser.add_argument("--parallelism", type=int, help="with --object-store: our parallelism on S3, and the peers' "
                        "at equal concurrency (default: ours where nothing is uploaded through the worker, 32)")
    parser.add_argument("--plot", help="draw the timings as a PNG (needs matplotlib)")
    parser.add_argument("--from-json", help="do not measure: print the table (and --plot) of a saved JSON report")
    parser.add_argument("--cli-start", action="store_true", help="only the CLI's start (seconds, no Spark)")
    parser.add_argument("--rescale", action="store_true", help="only the rescale step: 1 million RocksDB keys, 2 -> 8 "
                        "state partitions, our restore with a rescale against cp -r + Spark's own repartition")
    parser.add_argument("--object-store", action="store_true",
                        help="instead: savepoints on S3 behind request latency against s5cmd and aws, and on "
                        "GCS and Azure emulators (benchmarks/object_store.py)")
    args = parser.parse_args()
    if args.object_store:
        from benchmarks import object_store

        skipped = set(args.skip.split(","))
        report = object_store.run(args.quick, size="medium" if args.medium else None, workdir=args.workdir,
                                  with_peers="peers" not in skipped,
                                  latencies=() if "s3" in skipped else
                                  tuple(float(ms) / 1000 for ms in args.latency_ms.split(",") if ms),
                                  emulators=tuple(s for s in ("gcs", "azure") if s not in skipped),
                                  parallelism=args.parallelism)
        if args.json:
            print(json.dumps(report, default=str))
        if args.json_file:
            Path(args.json_file).write_text(json.dumps(report, default=str, indent=1) + "\n")
        return 0
    if args.cli_start:
        with tempfile.TemporaryDirectory(prefix="savepoint-cli-") as folder:
            figures = {"cli_start_s": cli_start(Path(folder), args.repeats), "load_average": os.getloadavg()}
        report = {"targets": cli_targets(figures["cli_start_s"]), "figures": figures}
        log(json.dumps(report, indent=1))
        if args.json:
            print(json.dumps(report))
        return 0
    if args.rescale:
        from benchmarks.rescale_state import rescale_against_repartition

        with tempfile.TemporaryDirectory(prefix="savepoint-rescale-") as folder:
            spark = spark_session()
            figures = {"rescale": rescale_against_repartition(spark, Job, Path(folder), repeats=args.repeats, log=log),
                       "load_average": os.getloadavg(), "machine": machine()}
            spark.stop()
        report = {"targets": rescale_targets(figures), "figures": figures}
        log(json.dumps(report, indent=1))
        if args.json:
            print(json.dumps(report))
        return 0
    if args.from_json:
        text = Path(args.from_json).read_text().strip()
        try:
            report = json.loads(text)
        except json.JSONDecodeError:  # the --json output of a run: the report is its last line
            report = json.loads(text.splitlines()[-1])
        print_table(report)
        if args.plot:
            plot(report, Path(args.plot))
        return 0
    total = args.size_gb or (0.2 if args.quick else 1.2)
    size = total / len(STORES)  # per store: the HDFS store holds its state in the JVM heap
    partitions = args.partitions or (40 if args.quick else 200)
    batches = args.batches or (5 if args.quick else 10)
    memory_gb = args.memory_gb or (0.25 if args.quick else 1.0)
    skip = set(filter(None, args.skip.split(",")))
    repeats = max(1, args.repeats)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="savepoint-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    figures: dict = {"size_gb_per_store": round(size, 3), "partitions": partitions, "build_batches": batches,
                     "repeats": repeats, "load_average_at_start": os.getloadavg()}
    try:
        if "cli" not in skip:  # first, on a quiet machine
            figures["cli_start_s"] = cli_start(work, repeats)
            log(f"CLI start (best of {max(repeats, 5)}): {figures['cli_start_s']}")
        spark = spark_session()
        jobs = {}
        for store in STORES:
            log(f"building the {store} checkpoint ({size} GB of state, {partitions} partitions)")
            jobs[store] = build(spark, work, store, size, partitions, batches)
        quiesce(spark)  # nothing of Spark's (state maintenance, RocksDB compaction) runs while we measure
        files = {s: planned_files(j.checkpoint) for s, j in jobs.items()}
        state_bytes = sum(n for fs in files.values() for _, n in fs)
        figures["files"] = sum(len(fs) for fs in files.values())
        figures["bytes"] = state_bytes
        for s, j in jobs.items():
            link_tree(j.checkpoint, files[s], work / "cp-source" / s)
        log(f"state: {figures['files']} files, {state_bytes / 1e9:.2f} GB (both stores)")

        t = figures.setdefault("seconds", {})
        t["cp_r"] = cp_r(work / "cp-source", work / "cp-target", repeats)
        t["checksums_alone"] = checksums_alone({s: j.checkpoint for s, j in jobs.items()}, files, repeats)
        log(f"cp -r: {t['cp_r']:.2f}s; read + CRC32C of every byte alone: {t['checksums_alone']:.2f}s")

        def each(fn) -> float:
            return sum(timed(lambda s=s: fn(s))[0] for s in jobs)

        def best(fn, output=None, after=None) -> float:
            """Best of `repeats`, as for cp -r (the machine may be shared). A step that writes the
            bytes has its ``output(s, r)`` removed after each repeat, as cp -r's target is: on a
            virtual machine, writing into memory it has not touched yet is slower, and both sides
            must write into the same kind. ``after(s)`` runs, untimed, after every repeat but the last."""
            runs = []
            for r in range(repeats):
                runs.append(each(lambda s, r=r: fn(s, r)))
                for s in jobs if output else ():
                    shutil.rmtree(output(s, r))
                for s in jobs if after and r < repeats - 1 else ():
                    after(s)
            return min(runs)

        t["savepoint_streamed"] = best(lambda s, r: take_savepoint(
            str(jobs[s].checkpoint), f"{s}-stream-{r}", savepoint_dir=str(work / "sp"), copy_mode="stream"),
            output=lambda s, r: work / "sp" / f"{s}-stream-{r}")
        firsts = {}
        t["savepoint_linked_first"] = best(lambda s, r: firsts.setdefault(s, take_savepoint(  # a new job: a first savepoint
            str(jobs[s].checkpoint), f"{s}-link" + (f"-{r}" if r else ""), savepoint_dir=str(work / "sp"),
            savepoint_type="periodic")))
        log(f"savepoints: streamed {t['savepoint_streamed']:.2f}s, linked {t['savepoint_linked_first']:.2f}s")

        t["restore_streamed"] = best(lambda s, r: restore_savepoint(
            firsts[s].pointer, str(work / f"restore-stream-{s}-{r}"), copy_mode="stream"),
            output=lambda s, r: work / f"restore-stream-{s}-{r}")
        t["restore_linked"] = best(lambda s, r: restore_savepoint(firsts[s].pointer, str(work / f"restore-link-{s}-{r}")),
                                   output=lambda s, r: work / f"restore-link-{s}-{r}")
        log(f"restores: streamed {t['restore_streamed']:.2f}s, linked {t['restore_linked']:.2f}s")

        change_rows = int(size * 1e9 / (PAYLOAD_CHARS + 60) * 0.01)
        spark = spark_session()
        for j in jobs.values():
            j.spark = spark
            j.run_batch(change_rows)  # about 1% of the state changes
        quiesce(spark)
        seconds: dict = {}

        def second(s, r):  # the job's second savepoint, taken after the first
            seconds[s] = take_savepoint(str(jobs[s].checkpoint), f"{s}-link", savepoint_dir=str(work / "sp"),
                                        savepoint_type="periodic")

        t["savepoint_linked_second"] = best(second, after=lambda s: dispose_savepoint(  # the first stays
            seconds[s].pointer, savepoint_dir=str(work / "sp")))
        second_bytes = sum(i.manifest.total_bytes for i in seconds.values())
        touched = sum(hashed_or_written(i) for i in seconds.values())
        figures["second_savepoint"] = {"bytes": second_bytes, "hashed_or_written": touched,
                                       "reused_files": sum(e.checksum_source == "previous" for i in seconds.values()
                                                           for e in i.manifest.files)}
        second_files = {s: planned_files(j.checkpoint) for s, j in jobs.items()}
        t["links_alone_second"] = links_alone({s: j.checkpoint for s, j in jobs.items()}, second_files, work / "floor",
                                              repeats)
        log(f"second savepoint: {t['savepoint_linked_second']:.3f}s, hashed/written {touched / second_bytes:.2%}, "
            f"its links alone {t['links_alone_second']:.3f}s")

        if "inspect" not in skip:
            from benchmarks.inspect_state import inspect_against_statestore

            spark = spark_session()
            figures["inspect"] = inspect_against_statestore(spark, {s: firsts[s].pointer for s in jobs}, repeats)
            t["inspect"], t["statestore_read"] = figures["inspect"]["inspect_s"], figures["inspect"]["statestore_s"]
            log(f"inspect: {figures['inspect']}")
        if "rescale" not in skip:
            from benchmarks.rescale_state import rescale_against_repartition

            spark = spark_session()
            figures["rescale"] = rescale_against_repartition(spark, Job, work, repeats=repeats, log=log)
            t["rescale"], t["spark_repartition"] = figures["rescale"]["ours_s"], figures["rescale"]["spark_s"]
            log(f"rescale: {figures['rescale']}")
        if "hashes" not in skip:
            paths = [jobs[s].checkpoint / rel for s in jobs for rel, _ in files[s]]
            figures["hash_gb_per_s"] = hash_candidates(paths)
            log(f"hashes (GB/s, read + hash, 2 threads): {figures['hash_gb_per_s']}")
        if "s3" not in skip:
            figures["s3"] = s3_compare(jobs["hdfs"], work)
            log(f"s3: {figures['s3']}")
        if "memory" not in skip:
            figures["memory_mib_above_baseline"] = memory_peak(work, int(memory_gb * 2**30))
            figures["memory_file_gb"] = memory_gb
            log(f"memory: {figures['memory_mib_above_baseline']}")
        if "live" not in skip:
            spark = spark_session()
            figures["live"] = batch_durations(spark, work, min(size, 0.25), batches=12 if args.quick else 40)
            log(f"live: {figures['live']}")
        spark.stop()
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    figures["machine"] = machine()
    figures["load_average_at_end"] = os.getloadavg()
    figures["wall_seconds"] = round(time.perf_counter() - started, 1)
    targets = evaluate(figures)
    report = {"quick": args.quick, "targets": targets, "figures": figures}
    print_table(report)
    if args.json:
        print(json.dumps(report, default=str))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(report, default=str, indent=1) + "\n")
    if args.plot:
        plot(report, Path(args.plot))
    return 0


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = report["figures"]
    steps = list(f["seconds"].items())
    labels = [k.replace("_", " ") for k, _ in steps]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    colors = ["#888888" if k in ("cp_r", "checksums_alone", "links_alone_second") else "#3a7bd5" for k, _ in steps]
    ax.barh(labels, [v for _, v in steps], color=colors)
    for i, (_, v) in enumerate(steps):
        ax.text(v, i, f" {v:.3f}s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (HDFS + RocksDB checkpoints)")
    ax.set_title(f"{f['files']} files, {f['bytes'] / 1e9:.2f} GB of state; {f['machine']['cpu']}, "
                 f"{f['machine']['cores']} cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def evaluate(f: dict) -> list[dict]:
    t, out = f["seconds"], []

    def add(name, ratio, target, met, note=""):
        out.append({"name": name, "ratio": None if ratio is None else round(ratio, 3), "target": target,
                    "met": bool(met), **({"note": note} if note else {})})

    cp = t["cp_r"]
    add("full savepoint, streamed with checksums / cp -r", t["savepoint_streamed"] / cp, "<= 1.25",
        t["savepoint_streamed"] / cp <= 1.25)
    hashing = t.get("checksums_alone")
    ceiling = f"ceiling for any copy checking every byte: cp -r / (read + CRC32C alone) = {cp / hashing:.1f}" \
        if hashing else ""
    add("cp -r / first savepoint with links and checksums", cp / t["savepoint_linked_first"], ">= 3",
        cp / t["savepoint_linked_first"] >= 3, ceiling)
    s = f["second_savepoint"]
    add("second savepoint after ~1% change: bytes hashed or written / state bytes", s["hashed_or_written"] / s["bytes"],
        "<= 0.05", s["hashed_or_written"] / s["bytes"] <= 0.05)
    floor = t.get("links_alone_second")
    add("cp -r of the whole state / second savepoint with links", cp / t["savepoint_linked_second"], ">= 20",
        cp / t["savepoint_linked_second"] >= 20,
        f"ceiling for any savepoint linking each file: cp -r / links alone = {cp / floor:.1f}" if floor else "")
    if "s3" in f:
        r = f["s3"]["server_side_s"] / f["s3"]["streamed_s"]
        add("S3 savepoint: server-side copy / download-and-upload", r, "<= 0.7", r <= 0.7)
        add("S3 savepoint: payload bytes through the worker (server-side copy)", f["s3"]["server_side_payload_bytes"],
            "== 0", f["s3"]["server_side_payload_bytes"] == 0)
    add("restore streamed / cp -r", t["restore_streamed"] / cp, "<= 1.25", t["restore_streamed"] / cp <= 1.25)
    add("cp -r / restore with links", cp / t["restore_linked"], ">= 3", cp / t["restore_linked"] >= 3, ceiling)
    if "inspect" in f:
        r = f["inspect"]["inspect_s"] / f["inspect"]["statestore_s"]
        add("inspect / a direct statestore read of the same savepoints", r, "<= 1.1", r <= 1.1 and f["inspect"]["rows_match"],
            f"{f['inspect']['rows']} rows; the same rows counted: {f['inspect']['rows_match']}")
    out += rescale_targets(f)
    if "live" in f:
        r = f["live"]["during_median_s"] / f["live"]["without_median_s"]
        add("median batch duration during savepoints / without", r, "<= 1.10", r <= 1.10)
    if "memory_mib_above_baseline" in f:
        worst = max(f["memory_mib_above_baseline"].values())
        add(f"peak memory above baseline copying a {f['memory_file_gb']} GB file (MiB)", worst, "<= 64", worst <= 64)
    return out + (cli_targets(f["cli_start_s"]) if "cli_start_s" in f else [])


def rescale_targets(f: dict) -> list[dict]:
    """The rescale step's target, if it ran: ours (restore with links and checksums, then Spark's rewrite) against
    cp -r of the checkpoint + Spark's own repartition of that copy."""
    if "rescale" not in f:
        return []
    r = f["rescale"]
    ratio = r["ours_s"] / r["spark_s"]
    return [{"name": f"restore with a rescale ({r['partitions']}, {r['keys']} RocksDB keys) / cp -r + Spark's own repartition",
             "ratio": round(ratio, 3), "target": "<= 1.1", "met": ratio <= 1.1 and r["partitions_match"],
             "note": f"{r['ours_s']}s against {r['spark_s']}s; both {r['partitions'].split()[-1]} partitions: "
                     f"{r['partitions_match']}"}]


def machine() -> dict:
    import google_crc32c

    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(memory / 2**30, 1),
            "python": platform.python_version(), "os": platform.platform(), "crc32c_hardware": google_crc32c.implementation == "c",
            "filesystem": subprocess.run(["stat", "-f", "-c", "%T", tempfile.gettempdir()], capture_output=True,
                                         text=True).stdout.strip(),
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def print_table(report: dict) -> None:
    f = report["figures"]
    lines = [f"state: {f['files']} files, {f['bytes'] / 1e9:.2f} GB (HDFS + RocksDB stores), "
             f"{f['partitions']} partitions; machine: {f['machine']['cpu']}, {f['machine']['cores']} cores",
             "", f"{'step':58s} {'seconds':>9s}"]
    lines += [f"{k:58s} {v:9.3f}" for k, v in f["seconds"].items()]
    lines += ["", f"{'target':78s} {'ratio':>9s} {'target':>9s}  met"]
    for t in report["targets"]:
        lines.append(f"{t['name']:78s} {t['ratio']:>9} {t['target']:>9s}  {'yes' if t['met'] else 'NO'}")
        if t.get("note"):
            lines.append(f"    {t['note']}")
    log("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
