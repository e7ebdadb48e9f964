"""Soak: triggers, retention, restores, list and dispose in parallel loops with random kill -9,
on a local disk and on the moto S3 server (issue 14).

SAVEPOINT_SOAK_SECONDS sets the total time (default 180: half local, half S3; 600 for the closing
note). Timeouts of the leases are shortened so that a killed holder blocks the others seconds, not
minutes (the staleness rules are the same)."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import signal
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
import os, sys, time
from pyspark.sql import SparkSession
import airflow_savepoints.demo.app as demo
input_dir, checkpoint, output, stop_file = sys.argv[1:5]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.sql.streaming.minBatchesToRetain", "20")
         .config("spark.sql.streaming.fileSink.log.compactInterval", "100000").getOrCreate())
query = demo.build_query(spark, input_dir, checkpoint, output, trigger_ms=200)
while not os.path.exists(stop_file) and query.exception() is None:
    time.sleep(0.2)
if query.exception() is not None:
    raise SystemExit(f"query failed: {query.exception()}")
query.processAllAvailable()
query.stop()
spark.stop()
"""


class LiveQuery:
    """The demo query (stateful de-duplication into a file sink) running in its own Spark driver
    process; each ``feed`` adds one input file (its first 10 ids repeat the previous file's last 10)."""

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

    def finish(self) -> None:
        self.stop_file.touch()
        assert self.process.wait(300) == 0


def committed_ids_through(output: Path, batch_id: int) -> list[int]:
    """Event ids the file sink committed in batches 0..batch_id (its log is never compacted here)."""
    return [row["id"] for batch in range(batch_id + 1) for row in demo.sink_log_rows(output, str(batch))]


def _runs_to_the_exact_count(tmp_path: Path, live: LiveQuery, restored: Path, batch_id: int) -> dict:
    """Run the demo query on the restored checkpoint into a fresh sink until the input is consumed:
    it must write exactly the ids the original sink had not committed by ``batch_id``, each once."""
    before = committed_ids_through(live.output, batch_id)
    rerun = LiveQuery(tmp_path, restored, tmp_path / "output-after-restore")
    rerun.input = live.input
    rerun.start().finish()
    after = demo.committed_event_ids(rerun.output)
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


def soak(tmp_path: Path, root: str, seconds: float, monkeypatch, live: LiveQuery | None = None) -> dict:
    """With ``live``, the checkpoint is a real Spark query's, fed a file between kills; else a synthetic
    one advanced by hand (on S3, where this machine's Spark has no s3a)."""
    monkeypatch.setattr(catalog_module, "LOCK_STALE_AFTER", STALE)
    monkeypatch.setattr(catalog_module, "PIN_TTL", 20.0)
    monkeypatch.setattr(restore_module, "CLAIM_STALE_AFTER", STALE)
    if live is None:
        checkpoint = write_checkpoint(tmp_path / "checkpoint", batches=3)
    else:
        checkpoint = live.checkpoint
        live.feed()
        live.start().wait_for_commit()
    scratch = tmp_path / "restores"
    scratch.mkdir()
    log = tmp_path / "log.jsonl"
    until = time.time() + seconds
    kinds = ["trigger", "trigger", "retain", "restore", "restore", "list", "dispose"]
    rng = random.Random(1414)

    def start(kind: str, seed: int):
        process = FORK.Process(target=_worker, args=(kind, str(checkpoint), root, str(scratch), str(log), until, seed))
        process.start()
        return process

    workers = [start(kind, i) for i, kind in enumerate(kinds)]
    kills, batch = 0, 3
    while time.time() < until:
        time.sleep(rng.uniform(0.5, 1.5))
        if live is None:
            _advance(checkpoint, batch)
        else:
            live.feed()
        batch += 1
        if rng.random() < 0.5:
            victim = rng.randrange(len(workers))
            os.kill(workers[victim].pid, signal.SIGKILL)
            workers[victim].join(10)
            kills += 1
            workers[victim] = start(kinds[victim], 1000 + kills)
    for w in workers:
        w.join(60)
        if w.exitcode is None:
            w.kill()
    if live is not None:
        live.finish()  # the query consumes what was fed, then stops; the newest savepoint is older

    entries = [json.loads(line) for line in log.read_text().splitlines()]
    traces = [(e["kind"], e["trace"]) for e in entries if e.get("trace")]
    assert traces == [], "\n".join(f"{k}: {t}" for k, t in traces)
    outcomes: dict[str, int] = {}
    for e in entries:
        key = f"{e['kind']}:{'ok' if e['code'] == 0 else e.get('error')}"
        outcomes[key] = outcomes.get(key, 0) + 1

    time.sleep(STALE + 1)  # leases of killed holders go stale
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
    final = tmp_path / "final"
    code, out, trace = _cli(["restore", newest.pointer, "--to", str(final)])
    assert code == 0, out
    assert json.loads(out)["batch_id"] == newest.manifest.batch_id
    assert (final / "commits" / str(newest.manifest.batch_id)).exists() and (final / "metadata").exists()
    _check_restored(json.loads(out), lambda r: newest.manifest.model_dump(mode="json"))
    exact = {} if live is None else _runs_to_the_exact_count(tmp_path, live, final, newest.manifest.batch_id)
    figures = {"seconds": seconds, "kill -9": kills, "batches": batch, "completed savepoints": len(folders),
               "restores verified": checked, "restores ok": len(restored), **outcomes, **exact}
    print(f"\nsoak on {root}: {figures}")
    assert kills >= 3 and outcomes.get("trigger:ok", 0) >= 1 and checked == len(restored)
    return figures


@pytest.mark.slow
def test_soak_local_disk(tmp_path, monkeypatch):
    """Beside a running Spark query: the newest savepoint restores and runs to the exact count."""
    live = LiveQuery(tmp_path, tmp_path / "checkpoint", tmp_path / "output")
    try:
        soak(tmp_path, str(tmp_path / "sp"), SOAK_SECONDS / 2, monkeypatch, live)
    finally:
        if getattr(live, "process", None) is not None and live.process.poll() is None:
            live.process.kill()


@pytest.mark.slow
@pytest.mark.s3
def test_soak_s3(tmp_path, s3, monkeypatch):
    soak(tmp_path, f"s3://{s3}/sp", SOAK_SECONDS / 2, monkeypatch)
