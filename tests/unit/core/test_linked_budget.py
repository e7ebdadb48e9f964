"""What each file costs an incremental savepoint on a local disk (issue 32, item 3).

A synthetic RocksDB checkpoint (benchmarks/object_store.py's generator, 6 partitions) on the local
disk; a first savepoint, one more batch, then the second savepoint, whose file-system calls are
counted with Python's audit hooks (the real calls, made by the real code): the checkpoint is walked
once (its symbolic-link check and its listing share the walk), each file is linked once, and no file
whose checksum the previous savepoint lends is opened. Its Python function calls are counted too
(``sys.setprofile``): the functions run for every file add up to a few calls per file.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import google_crc32c
import pytest

from airflow_savepoints.core import take_savepoint
from airflow_savepoints.core.copier import LINK_INLINE_BYTES, bounded_map
from airflow_savepoints.core.verify import verify_savepoint
from airflow_savepoints.errors import SavepointError
from benchmarks import object_store as bench

PLAN_INPUT = re.compile(r"metadata|offsets/\d+|commits/\d+|state/0/_metadata/.*|state/0/\d+/\d+\.zip")
_calls: list[tuple[str, tuple]] | None = None  # the events seen while counting


def _hook(event: str, args: tuple) -> None:
    if _calls is not None and event in ("os.scandir", "os.link", "open"):
        _calls.append((event, args))


_hooked = False


@contextmanager
def counted():
    """The audit events of the block. The hook, added at the first use, cannot be removed: it records nothing
    outside this block."""
    global _calls, _hooked
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
    _calls = []
    try:
        yield _calls
    finally:
        _calls = None


@contextmanager
def python_calls():
    """How often each Python function (code object) was called in this thread during the block."""
    found: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call":
            found[frame.f_code] += 1

    sys.setprofile(profile)
    try:
        yield found
    finally:
        sys.setprofile(None)


def under(folder, calls, event: str, index: int = 0) -> list[str]:
    prefix = str(folder) + os.sep
    paths = [os.fsdecode(args[index]) for name, args in calls if name == event and isinstance(args[index], str | bytes)]
    return [p for p in paths if p == str(folder) or p.startswith(prefix)]


def test_an_incremental_linked_savepoint_walks_the_checkpoint_once_and_opens_no_reused_file(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "PARTITIONS", 6)
    checkpoint, root = tmp_path / "checkpoint", tmp_path / "savepoints"
    newest = bench.write_checkpoint(checkpoint, 60)
    take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    bench.next_batch(checkpoint, newest + 1)
    with counted() as calls, python_calls() as functions:
        info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    location, files = info.pointer, info.manifest.files
    per_file = {f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})": n / len(files)
                for code, n in functions.items() if n >= len(files)}
    assert sum(per_file.values()) <= 12, per_file  # 7.7 here; 33.6 before the planner indexed folders (issue 32)
    reused = {e.path for e in files if e.checksum_source == "previous"}
    assert len(reused) >= len(files) // 2 and len(reused) < len(files)  # most files reused, the new batch's not
    fresh_bytes = sum(e.size for e in files if e.path not in reused)
    assert fresh_bytes < LINK_INLINE_BYTES  # the new batch is linked and hashed in this thread: no pool started
    assert bounded_map.__code__ not in functions and ThreadPoolExecutor.submit.__code__ not in functions

    folders = [checkpoint] + [p for p in checkpoint.rglob("*") if p.is_dir()]
    assert sorted(under(checkpoint, calls, "os.scandir")) == sorted(map(str, folders))  # one walk, each folder once
    linked = under(location, calls, "os.link", 1)
    assert sorted(os.path.relpath(p, location) for p in linked) == sorted(e.path for e in files)  # one link per file
    hashed = {os.path.relpath(p, location) for p in under(location, calls, "open")}
    assert not reused & hashed and hashed <= {e.path for e in files} | {n for n in hashed if n.startswith("._metadata.")}
    read = {os.path.relpath(p, checkpoint) for p in under(checkpoint, calls, "open")}
    assert all(PLAN_INPUT.fullmatch(name) for name in read), read  # the checkpoint: only what decides the plan


def _counting_stats(monkeypatch) -> list[str]:
    """Every path ``os.stat`` is called with while the test runs (the real call is made)."""
    seen: list[str] = []
    real = os.stat

    def stat(path, *args, **kwargs):
        seen.append(os.fsdecode(path) if isinstance(path, str | bytes) else str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    return seen


def test_a_reused_file_is_stated_once_and_the_plan_stats_only_what_it_reads_or_the_previous_savepoint_lacks(
        tmp_path, monkeypatch):
    """The first attempt takes the previous manifest's entry of every name still holding the inode it
    records (the scan's own inode numbers); the stat of the inode the copy links proves it: one stat per
    reused file in all (two before: the plan's and the link's)."""
    monkeypatch.setattr(bench, "PARTITIONS", 6)
    checkpoint, root = tmp_path / "checkpoint", tmp_path / "savepoints"
    newest = bench.write_checkpoint(checkpoint, 60)
    take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    bench.next_batch(checkpoint, newest + 1)
    seen = _counting_stats(monkeypatch)
    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    monkeypatch.undo()
    location, files = info.pointer, info.manifest.files
    reused = [e.path for e in files if e.checksum_source == "previous"]
    plain_reused = [p for p in reused if not p.endswith(".zip")]  # a zip is also confirmed: the plan may read it
    assert len(plain_reused) >= len(files) // 2 and info.manifest.attempts == 1
    for path in plain_reused:
        stats = [s for s in seen if s in (f"{checkpoint}/{path}", f"{location}/{path}")]
        assert stats == [f"{location}/{path}"], (path, stats)  # the linked inode only, never the live file as well


def test_a_file_changed_in_place_since_the_previous_savepoint_is_hashed_again_not_reused(tmp_path, monkeypatch):
    """A file rewritten in place (same inode, same size, new bytes and modification time; Spark never does
    this, but nothing else must be trusted blindly) after the previous savepoint: its entry as the previous
    manifest records it is expected by the plan (the inode is the same), the link's stat disproves it, and
    the savepoint holds the file's checksum as read now, not the recorded one."""
    monkeypatch.setattr(bench, "PARTITIONS", 6)
    checkpoint, root = tmp_path / "checkpoint", tmp_path / "savepoints"
    newest = bench.write_checkpoint(checkpoint, 60)
    first = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    bench.next_batch(checkpoint, newest + 1)
    changed = next(e for e in first.manifest.files if e.path.endswith(".sst"))
    target = checkpoint / changed.path
    inode, size = target.stat().st_ino, target.stat().st_size
    with open(target, "r+b") as handle:  # in place: the same inode
        flipped = bytes(b ^ 0xFF for b in handle.read())
        handle.seek(0)
        handle.write(flipped)
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 5_000_000_000))
    assert (target.stat().st_ino, target.stat().st_size) == (inode, size)
    second = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    entry = next(e for e in second.manifest.files if e.path == changed.path)
    now = google_crc32c.value(target.read_bytes())
    assert entry.checksum == f"{now:08x}" != changed.checksum and entry.checksum_source == "read"
    verify_savepoint(second.pointer)  # raises when a file does not match its recorded checksum


def test_the_cycle_collector_does_not_run_during_a_local_savepoint_and_runs_again_after(tmp_path, monkeypatch):
    """A savepoint between local disks allocates tens of thousands of objects in tens of milliseconds: each
    collection they would trigger walks every object of the process. The collector is paused for it (and
    is on again after it, also after a failed one)."""
    monkeypatch.setattr(bench, "PARTITIONS", 6)
    checkpoint, root = tmp_path / "checkpoint", tmp_path / "savepoints"
    newest = bench.write_checkpoint(checkpoint, 60)
    take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    bench.next_batch(checkpoint, newest + 1)
    collections: list[int] = []

    def seen(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(seen)
    try:
        take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
        assert collections == [] and gc.isenabled()
        with pytest.raises(SavepointError):
            take_savepoint(str(tmp_path / "nowhere"), "job", savepoint_dir=str(root))
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(seen)


def _replace_by_rename(path, data: bytes) -> None:
    """What Spark's createAtomic(overwrite) does: a temp file renamed over the name (another inode)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _second(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "PARTITIONS", 6)
    checkpoint, root = tmp_path / "checkpoint", tmp_path / "savepoints"
    newest = bench.write_checkpoint(checkpoint, 60)
    first = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root))
    new = bench.next_batch(checkpoint, newest + 1)
    return checkpoint, root, first, new


def test_a_new_file_replaced_between_the_plan_and_its_link_is_caught_and_the_copy_retried(tmp_path, monkeypatch):
    checkpoint, root, _, new = _second(tmp_path, monkeypatch)
    victim_rel = next(p for p in new if p.endswith(".changelog"))
    victim, faults = checkpoint / victim_rel, []

    def replace_once(event, data):
        if event == "planned" and not faults:
            _replace_by_rename(victim, bytes(b ^ 0xFF for b in victim.read_bytes()))  # same size, other bytes
            faults.append(data["attempt"])

    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root), on_event=replace_once)
    assert faults == [1] and info.manifest.attempts == 2
    entry = next(e for e in info.manifest.files if e.path == victim_rel)
    assert entry.checksum == f"{google_crc32c.value(victim.read_bytes()):08x}"
    verify_savepoint(info.pointer)


def test_a_reused_file_replaced_after_the_plan_keeps_the_listed_bytes_without_a_retry(tmp_path, monkeypatch):
    """The plan expected the file as the previous savepoint holds it (the same inode, not stat'ed); Spark
    replacing the name afterwards does not matter: the link's stat proves the inode taken is the listed one."""
    checkpoint, root, first, _ = _second(tmp_path, monkeypatch)
    recorded = next(e for e in first.manifest.files if e.path.endswith(".sst"))
    victim = checkpoint / recorded.path
    listed, replaced = victim.read_bytes(), []

    def replace_once(event, data):
        if event == "planned" and not replaced:
            _replace_by_rename(victim, b"x" * len(listed))  # same size, other bytes, another inode
            replaced.append(data["attempt"])

    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(root), on_event=replace_once)
    entry = next(e for e in info.manifest.files if e.path == recorded.path)
    assert replaced == [1] and info.manifest.attempts == 1
    assert (entry.checksum, entry.checksum_source) == (recorded.checksum, "previous")
    assert (Path(info.pointer) / recorded.path).read_bytes() == listed
    verify_savepoint(info.pointer)
