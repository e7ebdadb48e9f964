"""kill -9 of a process taking a savepoint, at random moments of its copy: never a false complete savepoint.

One real stateful Spark checkpoint (HDFS state store, 16 shuffle partitions, 6 batches: ~170 planned
files) is written once. Each trial starts a fresh process that takes a savepoint of it (streamed,
one file at a time, so the copy lasts long enough to be hit) and SIGKILLs it after a random delay:
one trial in four from the process's start over the measured time to plan (lease, catalog, listing),
the others once it has reported a random number of copied files (up to a third more than it plans:
then at a random moment over twice the measured time from its last file to its completion), so the
kills land in the copy however the machine's load changes between calibration and trials, and some
after ``_metadata``. After each kill:

* a location with a ``_metadata`` verifies and restores (a manifest is never written early);
* the live checkpoint is byte for byte what it was (every file hashed before and after);
* the next trigger succeeds: the dead process's lease is refused while fresh and broken once it
  is older than its staleness timeout (``lock_stale_after``, short here).

At the end, ``airflow-savepoints retain --orphan-timeout 0s`` removes every location the kills left
without ``_metadata`` and keeps every complete savepoint.
"""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.errors import SavepointInFlightError
from tests.conftest import ROOT, settled_copy, write_json_inputs

TRIALS = 20
STALE_AFTER = 1.5  # seconds: the lease of a killed trigger may be broken after this
CATALOG_LOCK_STALE = 30.0  # core.catalog.LOCK_STALE_AFTER: a kill inside a catalog update costs this much

CHILD = textwrap.dedent("""
    import sys, time
    from airflow_savepoints.core import take_savepoint
    checkpoint, root, stale = sys.argv[1], sys.argv[2], float(sys.argv[3])
    start = time.monotonic()
    def event(name, data):
        print(name.upper(), round(time.monotonic() - start, 4), flush=True)
    print("GO", flush=True)
    take_savepoint(checkpoint, "job", savepoint_dir=root, copy_mode="stream", parallelism=1, incremental=False,
                   lock_stale_after=stale, on_event=event)
    print("DONE", round(time.monotonic() - start, 4), flush=True)
""")


@pytest.fixture(scope="module")
def many_file_checkpoint(spark, tmp_path_factory) -> Path:
    """A stopped stateful query with many state files (16 partitions x 6 batches of deltas)."""
    from pyspark.sql import functions as F

    base = tmp_path_factory.mktemp("crash")
    write_json_inputs(base / "input", 0, 6, keys=200, rows=400)
    saved = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    spark.conf.set("spark.sql.shuffle.partitions", "16")
    try:
        frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(str(base / "input"))
        query = (frame.groupBy("key").agg(F.sum("value").alias("total")).writeStream.outputMode("update")
                 .format("noop").option("checkpointLocation", str(base / "checkpoint")).start())
        query.processAllAvailable()
        query.stop()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", saved)
    return settled_copy(base / "checkpoint", base / "checkpoint-stopped")


def hashes(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def locations(job_dir: Path) -> dict[str, bool]:
    """Savepoint locations of the job -> whether they have their _metadata."""
    if not job_dir.exists():
        return {}
    return {p.name: (p / "_metadata").exists() for p in job_dir.iterdir() if p.name.startswith("savepoint-")}


def start_child(checkpoint: Path, root: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", CHILD, str(checkpoint), str(root), str(STALE_AFTER)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = process.stdout.readline()
    assert line.strip() == "GO", line + process.stderr.read()
    return process


def calibrate(checkpoint: Path, root: Path) -> dict[str, float]:
    """Times (from GO) of an unkilled savepoint in a child process: planned, completed, done. Its output is read
    through the file object ``start_child`` read GO from: ``communicate`` reads the pipe beneath it, and so misses
    what that read took ahead (all of it, when a loaded machine let the child finish first)."""
    process = start_child(checkpoint, root)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(process.stderr.read()))  # a full stderr pipe never blocks it
    reader.start()
    out = process.stdout.read()
    process.wait(120)
    reader.join(30)
    assert process.returncode == 0, errors
    return {line.split()[0].lower(): float(line.split()[1]) for line in out.splitlines() if len(line.split()) == 2}


def dead_lease_written(job_dir: Path, dead_pid: int) -> float | None:
    """When the killed trigger last wrote the job's savepoint lease (its mtime); None if it holds none."""
    try:
        lease = job_dir / "_inflight.json"
        written, text = lease.stat().st_mtime, lease.read_text()
    except FileNotFoundError:
        return None
    return written if f":{dead_pid}" in text else None


def next_trigger(checkpoint: Path, root: Path, dead_pid: int) -> tuple[float, int]:
    """Trigger until it succeeds; returns (seconds until it did, in-flight refusals before)."""
    started, refusals = time.monotonic(), 0
    while True:
        try:
            info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root), lock_stale_after=STALE_AFTER)
        except SavepointInFlightError as exc:
            refusals += 1
            assert f":{dead_pid}" in exc.message, exc.message  # only the dead trigger's lease is in the way
            assert time.monotonic() - started < STALE_AFTER + 5, "a dead trigger's lease was not broken"
            time.sleep(0.2)
            continue
        verify_savepoint(info.pointer)
        return time.monotonic() - started, refusals


@pytest.mark.slow
def test_kill_9_at_random_points_of_the_copy_never_leaves_a_false_complete_savepoint(many_file_checkpoint, tmp_path):
    checkpoint, root = many_file_checkpoint, tmp_path / "sp"
    job_dir = root / "job"
    before = hashes(checkpoint)
    timing = calibrate(checkpoint, root)
    timing2 = calibrate(checkpoint, root)
    span = max(timing["done"], timing2["done"])
    copy_start = min(timing["planned"], timing2["planned"])
    files = json.loads((job_dir / next(n for n, done in locations(job_dir).items() if done) / "_metadata").read_text())
    planned = len(files["files"])
    copy = max(timing["completed"] - timing["planned"], timing2["completed"] - timing2["planned"])
    finish = max(timing["completed"] - timing["file_done"], timing2["completed"] - timing2["file_done"])
    rng = random.Random(20261122)
    outcomes: dict[str, int] = {"before copy": 0, "mid-copy": 0, "copied, no _metadata yet": 0, "after _metadata": 0,
                                "finished": 0}
    waits, refusals, restored, held, refused_fresh = [], 0, 0, 0, 0
    for trial in range(TRIALS):
        known = locations(job_dir)
        process = start_child(checkpoint, root)
        if trial % 4:  # after a random number of copied files, or past the last one
            line = process.stdout.readline()
            assert line.startswith("PLANNED"), line
            files_before_kill = rng.randint(0, planned + planned // 3)
            for _ in range(min(files_before_kill, planned)):
                if not process.stdout.readline().startswith("FILE_DONE"):
                    break
            if files_before_kill > planned:
                time.sleep(rng.uniform(0, finish * 2))
        else:  # from the start, over the planning
            time.sleep(rng.uniform(0, copy_start))
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        new = {name: done for name, done in locations(job_dir).items() if name not in known}
        assert len(new) <= 1, new
        # the dead trigger's lease: refused while fresh, broken only once older than its timeout
        written = dead_lease_written(job_dir, process.pid)
        fresh = written is not None and time.time() - written < STALE_AFTER / 2
        took, refused = next_trigger(checkpoint, root, process.pid)
        if written is not None:
            held += 1
            assert time.time() - written >= STALE_AFTER, f"trial {trial}: a dead lease was broken while fresh"
        if fresh:
            assert refused, f"trial {trial}: a trigger right after the kill was not refused by the fresh dead lease"
            refused_fresh += 1
        waits.append(took)
        refusals += refused
        assert took < CATALOG_LOCK_STALE + 10, took  # a kill inside a catalog update: its lock goes stale
        if process.returncode == 0:
            outcomes["finished"] += 1
        elif not new or not any((job_dir / next(iter(new))).rglob("*")):
            outcomes["before copy"] += 1
        elif any(new.values()):
            outcomes["after _metadata"] += 1
        else:
            copied = sum(1 for p in (job_dir / next(iter(new))).rglob("*") if p.is_file() and not p.name.startswith("."))
            outcomes["mid-copy" if copied < planned else "copied, no _metadata yet"] += 1
        for name, done in new.items():  # a _metadata means complete: it must verify and restore
            if done:
                verify_savepoint(str(job_dir / name))
                restore_savepoint(str(job_dir / name), str(tmp_path / f"restored-{trial}"))
                restored += 1
        assert hashes(checkpoint) == before, f"trial {trial}: the live checkpoint changed"
    mid = outcomes["mid-copy"] + outcomes["copied, no _metadata yet"]
    print(f"\n{TRIALS} kill -9 trials (calibrated: plan ready {copy_start * 1000:.0f} ms after start, copy of {planned} "
          f"files {copy * 1000:.0f} ms, whole savepoint {span * 1000:.0f} ms): {outcomes}; {restored} complete "
          f"savepoints of killed triggers verified and restored; {held} kills left their lease, {refused_fresh} of them fresh "
          f"(under {STALE_AFTER / 2}s) at the next trigger, which it refused; {refusals} refusals in all, each trigger "
          f"succeeded after {min(waits):.2f}-{max(waits):.2f}s, each dead lease broken >= {STALE_AFTER}s after its last write "
          f"({sum(w > STALE_AFTER + 5 for w in waits)} waited for a stale catalog lock)")
    assert mid >= TRIALS // 4, outcomes  # the kills really landed inside the copy
    assert refused_fresh >= TRIALS // 4, (held, refused_fresh)  # fresh dead leases were met, and refused
    assert hashes(checkpoint) == before

    # every location without _metadata is an orphan of a kill; retention removes them all, keeps the rest
    state = locations(job_dir)
    orphans = {name for name, done in state.items() if not done}
    complete = {name for name, done in state.items() if done}
    assert orphans and len(complete) >= TRIALS + 2
    run = subprocess.run([sys.executable, "-m", "airflow_savepoints.cli.main", "retain", "--job", "job", "--dir",
                          str(root), "--orphan-timeout", "0s", "--json"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert set(report["removed_orphans"]) == orphans and report["disposed"] == [] and report["failed"] == []
    assert locations(job_dir) == {name: True for name in complete}
    for name in complete:
        verify_savepoint(str(job_dir / name))
    litter = sorted(p.name for p in job_dir.iterdir() if p.name.startswith("."))
    print(f"retain --orphan-timeout 0s removed {len(orphans)} orphans and kept {len(complete)} complete savepoints; "
          f"temporary files left by kills in the job folder: {litter}")
