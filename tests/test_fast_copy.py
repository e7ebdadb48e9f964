"""The fast copy paths are correct: links on one filesystem (and the fallback when not), server-side
copy on S3 with no payload through the worker, incremental reuse that keeps every savepoint
self-contained, Spark never writing a linked file in place, and flat memory while copying.

Speed is measured in benchmarks/, never here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import google_crc32c
import pytest

from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.core.copier import copy_file, workers_for
from airflow_savepoints.core.dispose import dispose_savepoint
from airflow_savepoints.core.retention import RetentionPolicy, retain
from airflow_savepoints.errors import SavepointPinnedError, VerificationError
from airflow_savepoints.storage import Store
from tests.conftest import ROOT, is_state_file, remove_checkpoint
from tests.support.s3_payload import PayloadCounter
from tests.support.spark_shapes import SHAPES, run_to_end

SHM = Path("/dev/shm")


def crc_of(path: Path) -> int:
    return google_crc32c.value(path.read_bytes())


def entries(info) -> dict[str, object]:
    return {e.path: e for e in info.manifest.files}


# --- links ---------------------------------------------------------------------------------------
def test_same_filesystem_savepoint_links_every_file_and_restore_links_back(checkpoint, tmp_path):
    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), incremental=False)
    location = Path(info.pointer)
    assert {e.method for e in info.manifest.files} == {"link"}
    assert {e.checksum_source for e in info.manifest.files} == {"read"}  # hashed from the linked inode
    for entry in info.manifest.files:
        copied, original = location / entry.path, checkpoint / entry.path
        assert copied.stat().st_ino == original.stat().st_ino
        assert entry.checksum == format(crc_of(copied), "08x")
        assert entry.source_version == f"{original.stat().st_ino}:{original.stat().st_mtime}"
    verify_savepoint(info.pointer)

    restored = tmp_path / "restored"
    restore_savepoint(info.pointer, str(restored))
    for entry in info.manifest.files:
        if entry.path != "metadata":  # written fresh, last
            assert (restored / entry.path).stat().st_ino == (location / entry.path).stat().st_ino


def test_stream_mode_and_another_filesystem_copy_bytes_into_new_files(checkpoint, tmp_path):
    streamed = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), copy_mode="stream")
    assert {e.method for e in streamed.manifest.files} == {"stream"}
    for entry in streamed.manifest.files:
        assert (Path(streamed.pointer) / entry.path).stat().st_ino != (checkpoint / entry.path).stat().st_ino

    if not SHM.is_dir() or SHM.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second local filesystem (/dev/shm) to fall back across")
    other = SHM / f"sp-{os.getpid()}-{tmp_path.name}"
    try:
        info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(other))
        assert {e.method for e in info.manifest.files} == {"stream"}  # os.link said EXDEV
        assert {e.checksum_source for e in info.manifest.files} == {"read"}
        verify_savepoint(info.pointer)
        restored = tmp_path / "restored"  # back across filesystems: streamed, checked
        restore_savepoint(info.pointer, str(restored))
        for entry in info.manifest.files:
            assert crc_of(restored / entry.path) == int(entry.checksum, 16)
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_damaged_linked_savepoint_is_still_caught_by_verify_and_restore(checkpoint, tmp_path):
    """Links share bytes with the checkpoint: verify and restore still read and check them."""
    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    victim = Path(info.pointer) / sorted(e.path for e in info.manifest.files if is_state_file(e.path))[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.unlink(victim)  # break the link: damage only the savepoint's file, same size
    victim.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="checksum"):
        verify_savepoint(info.pointer)
    with pytest.raises(VerificationError):
        restore_savepoint(info.pointer, str(tmp_path / "restored"))
    assert not (tmp_path / "restored" / "metadata").exists()


# --- S3 server-side copy -----------------------------------------------------------------------------
@pytest.mark.s3
def test_s3_savepoint_and_restore_copy_server_side_with_no_payload_through_the_worker(checkpoint, s3):
    ckpt = Store(f"s3://{s3}/checkpoint")
    ckpt.fs.put(str(checkpoint), ckpt.root, recursive=True)  # a real Spark checkpoint, uploaded
    root = Store(f"s3://{s3}/savepoints")
    counter = PayloadCounter(root.fs)
    try:
        info = take_savepoint(ckpt, "job", savepoint_dir=root, incremental=False)
        location = f"{s3}/savepoints/job/{info.manifest.savepoint_id}/"
        data_keys = [location + e.path for e in info.manifest.files]
        assert {e.method for e in info.manifest.files} == {"server_copy"}
        assert {e.checksum_source for e in info.manifest.files} == {"store"}  # S3 computed the CRC32C
        assert counter.operations["CopyObject"] == len(info.manifest.files)
        assert sum(counter.sent[k] for k in data_keys) == 0  # nothing uploaded for any copied file
        downloaded = {k for k, n in counter.received.items() if n}
        state_keys = {f"{s3}/checkpoint/{e.path}" for e in info.manifest.files if e.path.startswith("state/")}
        assert state_keys and not downloaded & state_keys  # no state byte came down
        assert not downloaded & set(data_keys)  # nor was a copy read back
        for entry in info.manifest.files:  # the store's CRC32C is the CRC32C of the bytes
            assert int(entry.checksum, 16) == crc_of(checkpoint / entry.path)

        counter.reset()
        target = f"s3://{s3}/restored"
        restore_savepoint(info.pointer, target)
        restored_keys = [f"{s3}/restored/" + e.path for e in info.manifest.files if e.path != "metadata"]
        assert sum(counter.sent[k] for k in restored_keys) == 0
        read_back = {k for k, n in counter.received.items() if n}  # the manifest, catalog, query id: no state
        assert location + "_metadata" in read_back
        assert not read_back & {location + e.path for e in info.manifest.files if e.path != "metadata"}
        assert counter.operations["CopyObject"] == len(restored_keys)

        counter.reset()  # the counter can see payload: the streamed path moves every byte through us
        streamed = take_savepoint(ckpt, "job", savepoint_dir=root, copy_mode="stream")
        streamed_keys = [f"{s3}/savepoints/job/{streamed.manifest.savepoint_id}/" + e.path for e in streamed.manifest.files]
        assert sum(counter.sent[k] for k in streamed_keys) == streamed.manifest.total_bytes
        assert counter.total_received() >= streamed.manifest.total_bytes
    finally:
        counter.close()


@pytest.mark.s3
def test_s3_server_side_copy_refuses_a_source_replaced_since_listing(s3):
    store = Store(f"s3://{s3}/c")
    store.write_bytes_atomic("f", b"one")
    stat = store.list_files()["f"]
    store.write_bytes_atomic("f", b"two")  # replaced: a new ETag
    from airflow_savepoints.storage.store import SourceChangedError

    with pytest.raises(SourceChangedError):
        copy_file(store, "f", store.child("out"), "f", stat=stat)
    assert not store.exists("out/f")


# --- incremental -------------------------------------------------------------------------------------
def test_incremental_savepoints_reuse_unchanged_files_and_each_restores_alone(spark, tmp_path):
    shape, job = SHAPES["rocksdb_changelog"], "incr"
    inputs, checkpoint, sink, root = tmp_path / "input", str(tmp_path / "checkpoint"), tmp_path / "sink", tmp_path / "sp"

    def run(start: int, stop: int, at: str, out: Path) -> None:
        shape.write_input(inputs, start, stop)
        query = shape.start(spark, inputs, at, out)
        run_to_end(query)
        query.stop()

    run(0, 6, checkpoint, sink)
    first = take_savepoint(checkpoint, job, savepoint_dir=str(root), savepoint_type="periodic")
    run(6, 8, checkpoint, sink)  # a small change of state: two more batches

    def dispose_first(event, data):  # the previous savepoint is pinned while the next one copies
        if event == "planned":
            with pytest.raises(SavepointPinnedError):
                dispose_savepoint(first.pointer)

    second = take_savepoint(checkpoint, job, savepoint_dir=str(root), savepoint_type="periodic", on_event=dispose_first)
    before, after = entries(first), entries(second)
    reused = [e for e in after.values() if e.checksum_source == "previous"]
    fresh = [e for e in after.values() if e.checksum_source == "read"]
    assert reused and fresh, "unchanged files reused, new ones read"
    for entry in reused:
        assert entry.reused_from == first.manifest.savepoint_id
        old = before[entry.path]
        assert (entry.size, entry.checksum, entry.source_version) == (old.size, old.checksum, old.source_version)
        assert (Path(second.pointer) / entry.path).stat().st_ino == (Path(first.pointer) / entry.path).stat().st_ino
    for entry in fresh:  # new or changed files are never taken from the previous savepoint
        assert entry.path not in before or before[entry.path].source_version != entry.source_version
    assert any(e.path.startswith("state/") for e in reused)  # RocksDB files that did not change
    assert sum(e.size for e in fresh) < second.manifest.total_bytes

    report = retain(Store(str(root)), job, RetentionPolicy(max_periodic=1, max_age_seconds=None))
    assert report.disposed == [first.manifest.savepoint_id]
    assert not Path(first.pointer).exists()
    remove_checkpoint(Path(checkpoint))  # and the live checkpoint is gone too: the second must stand alone
    verify_savepoint(second.pointer)  # reads every byte against the reused checksums

    restored, restored_sink = str(tmp_path / "restored"), tmp_path / "restored-sink"
    restore_savepoint(second.pointer, restored)
    run(8, 12, restored, restored_sink)
    reference_sink, reference_ckpt = tmp_path / "reference-sink", str(tmp_path / "reference")
    run(12, 12, reference_ckpt, reference_sink)
    n = second.manifest.batch_id
    combined = {b: r for b, r in shape.read_sink(sink).items() if b <= n} | shape.read_sink(restored_sink)
    assert combined == shape.read_sink(reference_sink)


def test_a_file_replaced_in_the_checkpoint_is_not_reused(checkpoint, tmp_path):
    first = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    delta = sorted(e.path for e in first.manifest.files if is_state_file(e.path))[-1]
    original = checkpoint / delta
    tmp = original.with_name(f".{original.name}.tmp")  # Spark's replace: a new file renamed over
    tmp.write_bytes(original.read_bytes())
    os.replace(tmp, original)
    second = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    after = entries(second)
    assert after[delta].checksum_source == "read" and after[delta].reused_from is None
    assert (Path(second.pointer) / delta).stat().st_ino == original.stat().st_ino
    assert sum(e.checksum_source == "previous" for e in after.values()) == len(after) - 1


def test_a_previous_savepoint_that_lost_a_file_is_not_trusted_for_it(checkpoint, tmp_path):
    first = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), copy_mode="stream")
    lost = sorted(e.path for e in first.manifest.files if e.path.startswith("state/"))[0]
    os.unlink(Path(first.pointer) / lost)
    second = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
    after = entries(second)
    assert after[lost].checksum_source == "read" and after[lost].method == "link"
    assert all(e.checksum_source == "previous" for p, e in after.items() if p != lost)
    verify_savepoint(second.pointer)


# --- Spark never writes a checkpoint file in place ------------------------------------------------------
@pytest.mark.parametrize("name", ["aggregation_hdfs", "rocksdb_changelog"])
def test_spark_replaces_and_purges_linked_files_but_never_writes_one_in_place(spark, tmp_path, name):
    """Linked savepoint files share inodes with the live checkpoint. Spark keeps running with
    minBatchesToRetain=2 (so it purges), maintenance writes snapshots, and the restored (linked)
    checkpoint is run too: every inode keeps its bytes, so every savepoint still verifies. HDFS state
    (deltas, snapshots) and RocksDB state (changelogs, zips, SSTs)."""
    shape = SHAPES[name]
    inputs, checkpoint, sink = tmp_path / "input", tmp_path / "checkpoint", tmp_path / "sink"
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", "2")
    try:
        shape.write_input(inputs, 0, 4)
        query = shape.start(spark, inputs, str(checkpoint), sink)
        run_to_end(query)
        info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"))
        location = Path(info.pointer)
        linked = {e.path: ((location / e.path).stat().st_ino, e.checksum) for e in info.manifest.files}
        assert {e.method for e in info.manifest.files} == {"link"}

        shape.write_input(inputs, 4, 16)  # Spark writes, snapshots and purges past the savepoint
        run_to_end(query)
        query.stop()
        names_gone = [p for p, (ino, _) in linked.items()
                      if not (checkpoint / p).exists() or (checkpoint / p).stat().st_ino != ino]
        assert names_gone, "Spark purged or replaced some of the linked files"

        restored = tmp_path / "restored"
        restore_savepoint(info.pointer, str(restored))  # linked back into a live checkpoint
        query = shape.start(spark, inputs, str(restored), tmp_path / "restored-sink")
        run_to_end(query)
        query.stop()
        restored_gone = [p for p in linked if p != "metadata" and (
            not (restored / p).exists() or (restored / p).stat().st_ino != linked[p][0])]
        assert restored_gone, "the restored query purged or replaced linked files too"
    finally:
        spark.conf.unset("spark.sql.streaming.minBatchesToRetain")
    for path, (ino, checksum) in linked.items():  # same inode, same bytes
        assert (location / path).stat().st_ino == ino
        assert format(crc_of(location / path), "08x") == checksum, path
    verify_savepoint(info.pointer)


def test_the_local_listing_matches_fsspec_find(checkpoint):
    (checkpoint / "state" / "0" / "0" / ".1.delta.crc").write_bytes(b"hidden")  # hidden files are listed too
    store = Store(str(checkpoint))
    found = store.fs.find(str(checkpoint), detail=True, withdirs=False)
    expected = {path[len(str(checkpoint)) + 1:]: store.backend.file_stat(info) for path, info in found.items()}
    assert store.list_files() == expected and len(expected) > 20
    assert store.list_files("state") == {k[len("state/"):]: v for k, v in expected.items() if k.startswith("state/")}
    assert Store(str(checkpoint / "missing")).list_files() == {}


def test_copy_threads_are_bounded_by_the_cores_between_local_disks_only(tmp_path):
    cores = len(os.sched_getaffinity(0))
    local, remote = Store(str(tmp_path)), Store("memory://bucket/sp")
    assert workers_for((local, local), 64, 10_000) == cores  # memory copies and CRC32C: CPU-bound
    assert workers_for((local, remote), 64, 10_000) == 64  # waits on the store: as asked
    assert workers_for((remote,), 8, 3) == 3 and workers_for((local,), 8, 0) == 1


@pytest.mark.s3
def test_by_default_fewer_files_go_at_once_only_where_they_are_uploaded_through_the_worker(tmp_path, s3, s3_endpoint):
    """A streamed upload holds a part buffer per thread (8 at once); a server-side copy, a download to a
    local disk and a check hold at most a read chunk (32 at once)."""
    options = {"endpoint_url": s3_endpoint}
    local, a, b = Store(str(tmp_path)), Store(f"s3://{s3}/a", options), Store(f"s3://{s3}/b", options)
    cores = len(os.sched_getaffinity(0))

    def default(src: Store, dst: Store) -> int:
        return workers_for((src, dst), None, 10_000, dst=dst, methods=dst.copy_methods(src))

    assert (default(a, b), default(local, b), default(a, local), default(local, local)) == (32, 8, 32, cores)
    assert workers_for((a,), None, 10_000) == 32 and workers_for((a,), None, 5) == 5  # checks
    assert workers_for((a, b), 3, 10_000, dst=b, methods=b.copy_methods(a)) == 3  # asked: as asked


# --- memory -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["stream", "auto"])
def test_memory_stays_flat_while_copying_a_large_file(tmp_path, mode):
    size = 256 * 1024 * 1024
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src" / "big", "wb") as handle:
        block = os.urandom(1024 * 1024)
        for _ in range(size // len(block)):
            handle.write(block)
    probe = ROOT / "benchmarks" / "memory_probe.py"  # the benchmark's own probe
    out = subprocess.run([sys.executable, str(probe), str(tmp_path / "src"), str(tmp_path / "dst"), mode],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["size"] == size and result["method"] == ("stream" if mode == "stream" else "link")
    grown = result["peak"] - result["baseline"]
    print(f"{mode}: peak RSS grew by {grown / 2**20:.1f} MiB while copying {size / 2**20:.0f} MiB")
    assert grown < 64 * 1024 * 1024


# --- secondary copy (task-local recovery) -----------------------------------------------------------------
def test_a_secondary_copy_is_written_in_the_same_pass_and_preferred_by_restore(checkpoint, tmp_path):
    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"),
                          secondary_dir=str(tmp_path / "local"))
    secondary = tmp_path / "local" / "job" / info.manifest.savepoint_id
    assert info.manifest.secondary == str(secondary)
    assert (secondary / "_metadata").read_bytes() == (Path(info.pointer) / "_metadata").read_bytes()
    for entry in info.manifest.files:
        assert format(crc_of(secondary / entry.path), "08x") == entry.checksum

    result = restore_savepoint(info.pointer, str(tmp_path / "restored"))
    assert result.restored_from == str(secondary) and result.pointer == info.pointer
    state = next(e.path for e in info.manifest.files if is_state_file(e.path))
    assert (tmp_path / "restored" / state).stat().st_ino == (secondary / state).stat().st_ino

    data = bytearray((secondary / state).read_bytes())  # damage the secondary only
    data[0] ^= 0xFF
    os.unlink(secondary / state)
    (secondary / state).write_bytes(bytes(data))
    fallback = restore_savepoint(info.pointer, str(tmp_path / "restored-2"))
    assert fallback.restored_from == info.pointer  # the damage was caught; the primary was used
    assert crc_of(tmp_path / "restored-2" / state) == int(entries(info)[state].checksum, 16)

    dispose_savepoint(info.pointer)
    assert not secondary.exists() and not Path(info.pointer).exists()


def test_a_secondary_copy_that_cannot_be_written_is_dropped_and_the_savepoint_still_completes(checkpoint, tmp_path):
    blocker = tmp_path / "local"
    blocker.write_text("a file where the secondary folder should be")
    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), secondary_dir=str(blocker))
    assert info.manifest.secondary is None
    assert restore_savepoint(info.pointer, str(tmp_path / "restored")).restored_from == info.pointer
