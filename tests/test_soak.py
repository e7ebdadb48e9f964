"""Soak: triggers, retention, restores, list and dispose in parallel loops with random kill -9,
on a local disk (beside a live Spark query) and on the moto S3 server (issue 14), both at once.

SAVEPOINT_SOAK_SECONDS sets the total soak time (default 180: half on the local disk, half on S3;
600 for the closing note). The two halves run side by side, each store with its own workers, so
the test takes about half of it in wall time. Timeouts of the leases are shortened so that a killed
holder blocks the others seconds, not minutes (the staleness rules are the same)."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

import crc32c
import fsspec
import pytest
import s3fs  # noqa: F401 - imported once here, not in every forked worker

import airflow_savepoints.demo.app as demo
from airflow_savepoints.cli.main import app
from airflow_savepoints.core import catalog as catalog_module
from airflow_savepoints.core import restore as restore_module
from airflow_savepoints.core import take_savepoint
from airflow_savepoints.core.catalog import Catalog, SavepointState
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.storage import Store
from tests.support.synthetic import offsets_bytes, write_checkpoint

FORK = multiprocessing.get_context("fork")
SOAK_SECONDS = float(os.environ.get("SAVEPOINT_SOAK_SECONDS", "180"))
STALE = 6.0


def _cli(args: list[str]) -> tuple[int, str, str | None]:
    sys.stdout = buffer = io.StringIO()
    try:
        code, trace = app([*args, "--json"], standalone_mode=False) or 0, None
    except SystemExit as exc:
        code, trace = exc.code, None
    except BaseException:  # noqa: BLE001 - a raw traceback is what the soak looks for
        code, trace = -1, traceback.format_exc()
    finally:
        sys.stdout = sys.__stdout__
    return code, buffer.getvalue(), trace


def _record(log: Path, **entry) -> None:
    with open(log, "a") as handle:
        handle.write(json.dumps(entry) + "\n")


def _worker(kind: str, checkpoint: str, root: str, scratch: str, log: str, until: float, seed: int) -> None:
    fsspec.get_filesystem_class("s3").clear_instance_cache()  # no event loop inherited from the parent
    os.nice(10)  # 14 workers on 2 cores: the live query, the moto server and the kill loop keep their pace
    rng = random.Random(seed)
    log_path = Path(log)
    job_root = Store(root)
    manifest = None
    while time.time() < until:
        if kind == "trigger":
            try:
                info = take_savepoint(checkpoint, "job", savepoint_dir=root, lock_stale_after=STALE,
                                      savepoint_type=rng.choice(["periodic", "periodic", "manual"]))
                _record(log_path, kind=kind, code=0, pointer=info.pointer)
            except SavepointError as exc:
                _record(log_path, kind=kind, code=1, error=exc.code)
            except BaseException:  # noqa: BLE001
                _record(log_path, kind=kind, code=-1, trace=traceback.format_exc())
            time.sleep(rng.uniform(0, 0.3))
            continue
        if kind == "retain":
            code, out, trace = _cli(["retain", "--job", "job", "--dir", root, "--max-periodic", "3",
                                     "--orphan-timeout", "0s"])
        elif kind == "list":
            code, out, trace = _cli(["list", "--job", "job", "--dir", root])
        else:  # restore or dispose a random completed savepoint
            try:
                records = Catalog(job_root.child("job"), "job").completed()
            except SavepointError:
                records = []
            if not records:
                time.sleep(0.2)
                continue
            record = rng.choice(records)
            if kind == "dispose":
                if record.type.value != "periodic" or record is records[-1]:
                    time.sleep(0.1)
                    continue
                code, out, trace = _cli(["dispose", record.pointer, "--dir", root])
            else:
                try:  # what the savepoint holds (it never changes while it exists)
                    manifest = json.loads(Store(record.pointer).read_bytes("_metadata"))
                except (FileNotFoundError, SavepointError):
                    continue
                target = f"{scratch}/restore-{os.getpid()}-{time.monotonic_ns()}"
                code, out, trace = _cli(["restore", record.pointer, "--to", target])
        body = json.loads(out) if out.strip() and trace is None else {}
        _record(log_path, kind=kind, code=code, trace=trace, error=(body.get("error") or {}).get("code"),
                result=body if kind == "restore" and code == 0 else None,
                manifest=manifest if kind == "restore" and code == 0 else None)
        time.sleep(rng.uniform(0, 0.3))


def _advance(checkpoint: Path, batch: int) -> None:
    """The live query commits one more batch (files written then renamed, as Spark does)."""
    def put(rel: str, data: bytes) -> None:
        path = checkpoint / rel
        tmp = path.parent / f".{path.name}.tmp"
        tmp.write_bytes(data)
        tmp.rename(path)

    put(f"offsets/{batch}", offsets_bytes(batch))
    put(f"sources/0/{batch}", f'v1\n{{"path":"file:///in/f{batch}.json","timestamp":1,"batchId":{batch}}}'.encode())
    for part in (0, 1):
        put(f"state/0/{part}/{batch + 1}.delta", bytes([(batch + 1) % 256]) * 16)
    put(f"commits/{batch}", b'v1\n{"nextBatchWatermarkMs":0}')


LIVE_QUERY = """
import json, os, sys, time
from pyspark.sql import SparkSession
import airflow_savepoints.demo.app as demo
input_dir, checkpoint, output, stop_file = sys.argv[1:5]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.sql.streaming.minBatchesToRetain", "20")
         .config("spark.sql.streaming.fileSink.log.compactInterval", "100000").getOrCreate())

def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.2)

def run(checkpoint, output, stop_file):
    query = demo.build_query(spark, input_dir, checkpoint, output, trigger_ms=200)
    while not os.path.exists(stop_file) and query.exception() is None:
        time.sleep(0.2)
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    query.processAllAvailable()
    query.stop()

run(checkpoint, output, stop_file)
open(stop_file + ".stopped", "w").close()
wait_for(stop_file + ".next")  # another checkpoint to run (a restored one), or none
nxt = json.loads(open(stop_file + ".next").read())
if nxt:  # a new query in this driver: its state stores are keyed by the new checkpoint's path
    open(nxt["stop_file"], "w").close()
    run(nxt["checkpoint"], nxt["output"], nxt["stop_file"])
spark.stop()
"""


class LiveQuery:
    """The demo query (stateful de-duplication into a file sink) running in its own Spark driver
    process; each ``feed`` adds one input file (its first 10 ids repeat the previous file's last 10).
    Once stopped, the same driver runs the query once more on a checkpoint ``then`` names (no second
    JVM start)."""

    def __init__(self, folder: Path, checkpoint: Path, output: Path):
        self.input, self.checkpoint, self.output = folder / "input", checkpoint, output
        self.stop_file, self.files = folder / f"stop-{output.name}", 0
        self.ids: set[int] = set()

    def start(self) -> LiveQuery:
        self.process = subprocess.Popen([sys.executable, "-c", LIVE_QUERY, str(self.input), str(self.checkpoint),
                                         str(self.output), str(self.stop_file)])
        return self

    def feed(self) -> None:
        self.ids |= set(demo.write_events(self.input, self.files))
        self.files += 1

    def wait_for_commit(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not (self.checkpoint / "commits" / "0").exists():
            assert self.process.poll() is None and time.monotonic() < deadline, "the live query committed nothing"
            time.sleep(0.2)

    def finish(self, timeout: float = 300) -> None:
        """The query consumes what was fed, then stops."""
        self.stop_file.touch()
        deadline = time.monotonic() + timeout
        while not Path(f"{self.stop_file}.stopped").exists():
            assert self.process.poll() is None and time.monotonic() < deadline, f"exited {self.process.poll()}"
            time.sleep(0.2)

    def then(self, checkpoint: Path | None, output: Path | None = None) -> None:
        """Run the query on ``checkpoint`` into ``output`` until the input is consumed (None: end the driver)."""
        then = {"checkpoint": str(checkpoint), "output": str(output), "stop_file": f"{self.stop_file}-then"} \
            if checkpoint is not None else {}
        Path(f"{self.stop_file}.next").write_text(json.dumps(then))
        assert self.process.wait(300) == 0


def committed_ids_through(output: Path, batch_id: int) -> list[int]:
    """Event ids the file sink committed in batches 0..batch_id (its log is never compacted here)."""
    return [row["id"] for batch in range(batch_id + 1) for row in demo.sink_log_rows(output, str(batch))]


def _runs_to_the_exact_count(tmp_path: Path, live: LiveQuery, restored: Path, batch_id: int) -> dict:
    """Run the demo query on the restored checkpoint into a fresh sink until the input is consumed:
    it must write exactly the ids the original sink had not committed by ``batch_id``, each once."""
    before = committed_ids_through(live.output, batch_id)
    live.then(restored, tmp_path / "output-after-restore")
    after = demo.committed_event_ids(tmp_path / "output-after-restore")
    expected = sorted(live.ids - set(before))
    assert after == expected, (len(after), len(set(after)), len(expected))
    assert sorted(set(before) | set(after)) == sorted(live.ids) and len(before) == len(set(before))
    return {"events": len(live.ids), "by the savepoint": len(before), "after the restore": len(after)}


def _check_restored(result: dict, manifest_of) -> None:
    target = Path(result["checkpoint"])
    manifest = manifest_of(result)
    for entry in manifest["files"]:
        if entry["path"] == "_metadata":
            continue
        data = (target / entry["path"]).read_bytes()
        assert (len(data), format(crc32c.crc32c(data), "08x")) == (entry["size"], entry["checksum"]), entry["path"]


KINDS = ["trigger", "trigger", "retain", "restore", "restore", "list", "dispose"]


class Target:
    """One store under soak: savepoints of ``checkpoint`` under ``root``, with its own worker processes
    (one per entry of ``KINDS``), log and scratch folder below ``folder``. With ``live``, the checkpoint
    is a real Spark query's, fed a file each round; else a synthetic one advanced by hand (on S3, where
    this machine's Spark has no s3a)."""

    def __init__(self, folder: Path, root: str, live: LiveQuery | None = None):
        self.folder, self.root, self.live = folder, root, live
        self.checkpoint = folder / "checkpoint" if live is None else live.checkpoint
        self.scratch, self.log = folder / "restores", folder / "log.jsonl"
        self.workers: list = []
        self.kills, self.batch, self.last_kill = 0, 3, 0.0

    def prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.live is None:
            write_checkpoint(self.checkpoint, batches=3)
        else:
            self.live.feed()
            self.live.start()  # its first commit is awaited once everything else is ready
        self.scratch.mkdir()

    def start(self, index: int, seed: int, until: float):
        process = FORK.Process(target=_worker, args=(KINDS[index], str(self.checkpoint), self.root, str(self.scratch),
                                                     str(self.log), until, seed))
        process.start()
        return process

    def advance(self) -> None:
        if self.live is None:
            _advance(self.checkpoint, self.batch)
        else:
            self.live.feed()
        self.batch += 1

    def check_alive(self) -> None:
        """Before the deadline a worker ends only by a kill: one that ended by itself crashed (its
        traceback is on stderr, not in the log)."""
        ended = [(KINDS[i], w.exitcode) for i, w in enumerate(self.workers) if w.exitcode is not None]
        assert ended == [], f"workers on {self.root} ended by themselves: {ended}"

    def kill_one(self, rng: random.Random, until: float) -> None:
        victim = rng.randrange(len(self.workers))
        self.workers[victim].kill()  # SIGKILL; none sent to one that has just ended at the deadline
        self.workers[victim].join(10)
        self.kills, self.last_kill = self.kills + 1, time.time()
        self.workers[victim] = self.start(victim, 1000 + self.kills, until)


def soak(targets: list[Target], seconds: float, monkeypatch) -> list[dict]:
    """All targets side by side for ``seconds``: one loop in this process advances each target's
    checkpoint every 0.5-1.5 s and kills one of its workers at random half of the time; then each
    target is checked on its own."""
    monkeypatch.setattr(catalog_module, "LOCK_STALE_AFTER", STALE)
    monkeypatch.setattr(catalog_module, "PIN_TTL", 20.0)
    monkeypatch.setattr(restore_module, "CLAIM_STALE_AFTER", STALE)
    for target in targets:
        target.prepare()
    # The first CLI call imports Airflow (~2 s of CPU): done here once, a worker forked (again after
    # each kill) starts with it, instead of spending its turns between kills importing on a busy machine.
    (warm_up := targets[0].folder / "warm-up").mkdir()
    assert _cli(["list", "--job", "job", "--dir", str(warm_up)])[2] is None
    for target in targets:  # a live query is up and has committed before any clock starts
        if target.live is not None:
            target.live.wait_for_commit()
    until = time.time() + seconds
    rng = random.Random(1414)
    try:
        for target in targets:
            target.workers = [target.start(i, i, until) for i in range(len(KINDS))]
        while time.time() < until:
            time.sleep(rng.uniform(0.5, 1.5))
            if time.time() < until - 5:  # (a worker ends once past the deadline)
                for target in targets:
                    target.check_alive()
            for target in targets:
                target.advance()
                if rng.random() < 0.5:
                    target.kill_one(rng, until)
    except BaseException:  # no worker outlives a failed soak (one in an S3 call may hang once moto stops)
        for w in [w for target in targets for w in target.workers]:
            w.kill()
        raise
    last_kill = max(target.last_kill for target in targets)
    for w in [w for target in targets for w in target.workers]:
        w.join(60)
        if w.exitcode is None:
            w.kill()
            last_kill = time.time()
    for target in targets:
        if target.live is not None:
            target.live.finish()  # the query consumes what was fed, then stops; the newest savepoint is older
    time.sleep(max(0.0, last_kill + STALE + 1 - time.time()))  # leases of killed holders go stale
    return [_check(target, seconds) for target in targets]


def _check(target: Target, seconds: float) -> dict:
    root, live, kills, batch = target.root, target.live, target.kills, target.batch
    entries = [json.loads(line) for line in target.log.read_text().splitlines()]
    traces = [(e["kind"], e["trace"]) for e in entries if e.get("trace")]
    assert traces == [], "\n".join(f"{k}: {t}" for k, t in traces)
    outcomes: dict[str, int] = {}
    for e in entries:
        key = f"{e['kind']}:{'ok' if e['code'] == 0 else e.get('error')}"
        outcomes[key] = outcomes.get(key, 0) + 1

    code, out, trace = _cli(["retain", "--job", "job", "--dir", root, "--max-periodic", "3", "--orphan-timeout", "0s"])
    assert trace is None and code == 0, out
    job = Store(root).child("job")
    folders = {p.split("/")[0] for p in job.list_files() if p.endswith("/_metadata")}
    records = {r.savepoint_id for r in Catalog(job, "job").records({SavepointState.COMPLETED})}
    assert folders == records  # the catalog agrees with the folders
    for savepoint_id in sorted(folders):
        code, out, trace = _cli(["verify", job.child(savepoint_id).url])
        assert code == 0, out
    restored = [e for e in entries if e["kind"] == "restore" and e["code"] == 0]
    checked = 0
    for entry in restored:  # every restore that said OK holds exactly its savepoint's files
        _check_restored(entry["result"], lambda r, m=entry["manifest"]: m)
        checked += 1
    newest = Catalog(job, "job").latest()
    final = target.folder / "final"
    code, out, trace = _cli(["restore", newest.pointer, "--to", str(final)])
    assert code == 0, out
    assert json.loads(out)["batch_id"] == newest.manifest.batch_id
    assert (final / "commits" / str(newest.manifest.batch_id)).exists() and (final / "metadata").exists()
    _check_restored(json.loads(out), lambda r: newest.manifest.model_dump(mode="json"))
    exact = {} if live is None else _runs_to_the_exact_count(target.folder, live, final, newest.manifest.batch_id)
    figures = {"seconds": seconds, "kill -9": kills, "batches": batch, "completed savepoints": len(folders),
               "restores verified": checked, "restores ok": len(restored), **outcomes, **exact}
    print(f"\nsoak on {root}: {figures}")
    assert kills >= 3 and outcomes.get("trigger:ok", 0) >= 1 and checked == len(restored)
    return figures


@pytest.mark.slow
@pytest.mark.s3
def test_soak_local_disk_and_s3(tmp_path, s3, monkeypatch):
    """Both stores side by side, SOAK_SECONDS/2 each. The local disk one is beside a running Spark query:
    its newest savepoint restores and runs to the exact count. The S3 one soaks a synthetic checkpoint."""
    local = tmp_path / "local"
    live = LiveQuery(local, local / "checkpoint", local / "output")
    try:
        soak([Target(local, str(local / "sp"), live), Target(tmp_path / "s3", f"s3://{s3}/sp")],
             SOAK_SECONDS / 2, monkeypatch)
    finally:
        if getattr(live, "process", None) is not None and live.process.poll() is None:
            live.process.kill()
