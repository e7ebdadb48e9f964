"""The planner on hand-built checkpoint listings in Spark's formats (no Spark needed).

Real Spark checkpoints are planned and restored in test_roundtrip.py; these cases pin each rule
of the spec on layouts that are hard to reach on purpose with a live query.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile

import pytest

from airflow_savepoints.checkpoint.planner import FirstReads, plan_checkpoint
from airflow_savepoints.errors import (
    CheckpointError,
    CheckpointRaceError,
    NoCommittedBatchError,
    NotACheckpointError,
)
from airflow_savepoints.storage import FileStat, Store

QUERY_ID = "2ee3efbd-e866-49e6-86c7-e5aaaa705e6d"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def offsets(*sources, version=1, conf=None) -> bytes:
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": conf or {"spark.sql.streaming.stateStore.providerClass": HDFS}}
    lines = [f"v{version}", json.dumps(meta)] + [s if isinstance(s, str) else json.dumps(s) for s in sources]
    return "\n".join(lines).encode()


def commit(ids=None) -> bytes:
    if ids is None:
        return b'v1\n{"nextBatchWatermarkMs":0}'
    return ("v2\n" + json.dumps({"nextBatchWatermarkMs": 0, "stateUniqueIds": ids})).encode()


def rocks_zip(ssts: dict[str, int]) -> bytes:
    meta = {"sstFiles": [{"localFileName": n, "dfsSstFileName": n, "sizeBytes": s} for n, s in ssts.items()],
            "numKeys": 1}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("metadata", "v1\n" + json.dumps(meta))
        z.writestr("CURRENT", "MANIFEST-000001\n")
    return buf.getvalue()


class Ckpt(dict):
    """path -> bytes; gives the planner its listing and reader."""

    def listing(self):
        return {p: FileStat(len(b), "v") for p, b in self.items()}

    def plan(self):
        return plan_checkpoint(self.listing(), self.__getitem__, where="test checkpoint")


def base(batches: int, log_offsets=None) -> Ckpt:
    c = Ckpt({"metadata": json.dumps({"id": QUERY_ID}).encode()})
    for b in range(batches):
        c[f"offsets/{b}"] = offsets({"logOffset": (log_offsets or {}).get(b, b)})
        c[f"commits/{b}"] = commit()
    return c


def paths(plan) -> set[str]:
    return {f.path for f in plan.files}


def test_picks_newest_committed_batch_and_its_logs():
    c = base(8)
    c["offsets/8"] = offsets({"logOffset": 8})  # planned, not committed
    for b in range(9):
        c[f"sources/0/{b}"] = b"v1\n{}"
    plan = c.plan()
    assert plan.batch_id == 7 and plan.query_id == QUERY_ID and plan.includes_next_offsets
    assert {"metadata", "offsets/6", "offsets/7", "offsets/8", "commits/7"} <= paths(plan)
    assert not paths(plan) & {"offsets/5", "commits/6", "commits/5"}
    # offsets/8 is included, so the source log up to ITS offset (8) goes too
    assert {f"sources/0/{b}" for b in range(9)} <= paths(plan)
    assert [f.path for f in plan.files][-1] == "metadata"  # copied last


def test_without_next_offsets_source_log_stops_at_offset_of_n():
    c = base(5, log_offsets={4: 4})
    for b in range(7):  # entries 5 and 6 were written while planning batch 5: must NOT be copied
        c[f"sources/0/{b}"] = b"v1\n{}"
    plan = c.plan()
    assert plan.batch_id == 4 and not plan.includes_next_offsets
    assert {p for p in paths(plan) if p.startswith("sources/")} == {f"sources/0/{b}" for b in range(5)}


def test_file_source_log_keeps_the_two_newest_compact_files():
    """Spark derives the log's compact interval from its two newest compact files."""
    c = base(12, log_offsets={11: 11})
    for b in range(13):
        c[f"sources/0/{b}"] = b"v1\n{}"
    for b in (2, 5, 8):
        c[f"sources/0/{b}.compact"] = b"v1\n{}"
    sources = {p for p in paths(c.plan()) if p.startswith("sources/")}
    assert sources == {"sources/0/5.compact", "sources/0/8.compact", "sources/0/9", "sources/0/10", "sources/0/11"}


def test_missing_source_log_entry_is_a_race():
    c = base(3, log_offsets={2: 2})
    c["sources/0/0"] = c["sources/0/2"] = b"v1\n{}"
    with pytest.raises(CheckpointRaceError, match="lacks entries"):
        c.plan()


def test_non_file_sources_copied_whole_and_no_offset_sources_skipped():
    c = Ckpt({"metadata": json.dumps({"id": QUERY_ID}).encode()})
    c["offsets/0"] = offsets({"topic": {"0": 5}}, "-")
    c["commits/0"] = commit()
    c["sources/0/0"] = b"\x00v1\n{}"
    c["sources/1/0"] = b"v1\n{}"
    got = paths(c.plan())
    assert "sources/0/0" in got and "sources/1/0" not in got
    assert "offsets/0" in got  # batch 0 needs no earlier offsets


def test_hdfs_state_newest_snapshot_and_following_deltas():
    c = base(10)  # N = 9 -> state version 10
    for part in (0, 1):
        for v in range(1, 12):
            c[f"state/0/{part}/{v}.delta"] = b"d"
        c[f"state/0/{part}/5.snapshot"] = b"s"
        c[f"state/0/{part}/8.snapshot"] = b"s"
        c[f"state/0/{part}/11.snapshot"] = b"s"  # belongs to a later batch
        c[f"state/0/{part}/.9.delta.crc"] = b"hadoop"  # Hadoop's hidden checksum: never copied
        c[f"state/0/{part}/.12.delta.3f2a.TID7.tmp"] = b"partial"
    c["state/0/0/_metadata/schema"] = b"\x00\x02v2"
    c["state/0/_metadata/metadata"] = b"v1\n{}"
    got = {p for p in paths(c.plan()) if p.startswith("state/")}
    expected = {"state/0/_metadata/metadata", "state/0/0/_metadata/schema"}
    for part in (0, 1):
        expected |= {f"state/0/{part}/8.snapshot", f"state/0/{part}/9.delta", f"state/0/{part}/10.delta"}
    assert got == expected


def test_hdfs_without_snapshot_needs_every_delta():
    c = base(3)
    for v in (1, 2, 3):
        c[f"state/0/0/{v}.delta"] = b"d"
    assert {p for p in paths(c.plan()) if p.startswith("state/")} == {f"state/0/0/{v}.delta" for v in (1, 2, 3)}
    del c["state/0/0/2.delta"]
    with pytest.raises(CheckpointRaceError, match="cannot load version 3"):
        c.plan()


def test_stream_join_stores_each_planned():
    c = base(2)
    stores = ["left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues", "right-keyWithIndexToValue"]
    for store in stores:
        for part in (0, 1):
            for v in (1, 2, 3):
                c[f"state/0/{part}/{store}/{v}.delta"] = b"d"
        c[f"state/0/0/{store}/_metadata/schema"] = b"s"
    got = {p for p in paths(c.plan()) if p.startswith("state/")}
    assert len(got) == 4 * 2 * 2 + 4  # versions 1..2 of each store and partition, plus 4 schemas
    assert "state/0/1/right-keyToNumValues/2.delta" in got and "state/0/1/right-keyToNumValues/3.delta" not in got


def test_rocksdb_v1_zip_changelogs_and_referenced_ssts():
    c = base(6)  # version 6
    ssts = {"000008-aaa.sst": 3, "000009-bbb.sst": 4}
    c["state/0/0/4.zip"] = rocks_zip(ssts)
    c["state/0/0/2.zip"] = rocks_zip({"000001-old.sst": 2})
    for v in range(1, 8):
        c[f"state/0/0/{v}.changelog"] = b"c"
    c["state/0/0/SSTs/000008-aaa.sst"] = b"abc"
    c["state/0/0/SSTs/000009-bbb.sst"] = b"abcd"
    c["state/0/0/SSTs/000001-old.sst"] = b"ab"
    got = {p for p in paths(c.plan()) if p.startswith("state/")}
    assert got == {"state/0/0/4.zip", "state/0/0/5.changelog", "state/0/0/6.changelog",
                   "state/0/0/SSTs/000008-aaa.sst", "state/0/0/SSTs/000009-bbb.sst"}


def test_a_zip_known_at_its_listed_version_is_planned_without_reading_it():
    c = base(3)
    c["state/0/0/2.zip"] = rocks_zip({"000008-aaa.sst": 3})
    c["state/0/0/3.changelog"] = b"c"
    c["state/0/0/SSTs/000008-aaa.sst"] = b"abc"
    c["state/0/0/SSTs/000009-new.sst"] = b"abcd"
    first = c.plan()
    assert first.snapshots == {"state/0/0/2.zip": {"SSTs/000008-aaa.sst": 3}}
    read: list[str] = []

    def reader(path: str) -> bytes:
        read.append(path)
        return c[path]

    known = {"state/0/0/2.zip": ("v", {"SSTs/000009-new.sst": 4})}  # what a previous manifest says of it
    again = plan_checkpoint(c.listing(), reader, known_snapshots=known)
    assert "state/0/0/2.zip" not in read and "state/0/0/SSTs/000009-new.sst" in paths(again)
    assert again.snapshots == {"state/0/0/2.zip": {"SSTs/000009-new.sst": 4}}
    read.clear()  # listed at another version: the zip changed since, so it is read
    changed = plan_checkpoint(c.listing(), reader, known_snapshots={"state/0/0/2.zip": ("older", {})})
    assert "state/0/0/2.zip" in read and paths(changed) == paths(first)


def _rocks_stores(stores: int) -> Ckpt:
    """A RocksDB v1 checkpoint whose state is at version 2: per store a zip at 2 naming one SST."""
    c = base(2)
    for s in range(stores):
        c[f"state/0/{s}/2.zip"] = rocks_zip({f"00000{s}-a.sst": 3})
        c[f"state/0/{s}/SSTs/00000{s}-a.sst"] = b"abc"
    return c


def test_zips_are_read_together_and_planning_needs_no_thread_of_its_own(monkeypatch):
    """With parallelism, the stores' unknown zips are read at the same time; zips a previous manifest answers
    start no thread (planning is Python on the listing: a thread's start costs more than it does)."""
    import threading
    import time

    from airflow_savepoints.checkpoint import planner

    c = _rocks_stores(6)
    in_flight, most, lock = [0], [0], threading.Lock()

    def reader(path: str) -> bytes:
        if path.endswith(".zip"):
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            time.sleep(0.05)
            with lock:
                in_flight[0] -= 1
        return c[path]

    pools: list[int] = []

    class CountedPool(planner.ThreadPoolExecutor):
        def __init__(self, max_workers=None, **kwargs):
            pools.append(max_workers)
            super().__init__(max_workers, **kwargs)

    monkeypatch.setattr(planner, "ThreadPoolExecutor", CountedPool)
    plan = plan_checkpoint(c.listing(), reader, parallelism=4)
    assert plan.files == c.plan().files and most[0] == 4, most  # six zips, four at a time
    pools.clear()
    known = {p: ("v", files) for p, files in plan.snapshots.items()}
    again = plan_checkpoint(c.listing(), reader, parallelism=4, known_snapshots=known)
    assert again.files == plan.files and pools == [3], pools  # only metadata, offsets/1, commits/1, together


def test_with_parallelism_the_first_failure_in_store_order_is_raised():
    c = _rocks_stores(6)
    del c["state/0/3/2.zip"]  # store 3 cannot load version 2 (a changelog, no zip), known before any read
    c["state/0/3/1.changelog"] = b"c"
    c["state/0/1/2.zip"] = b"not a zip"  # store 1's zip is broken, known once it is read

    def reader(path: str) -> bytes:
        return c[path]

    with pytest.raises(CheckpointError) as one:
        plan_checkpoint(c.listing(), reader)
    with pytest.raises(CheckpointError) as many:
        plan_checkpoint(c.listing(), reader, parallelism=4)
    assert "state/0/1/2.zip" in str(many.value) and str(many.value) == str(one.value)


def test_rocksdb_v1_missing_sst_is_a_race():
    c = base(3)
    c["state/0/0/3.zip"] = rocks_zip({"000008-aaa.sst": 3})
    with pytest.raises(CheckpointRaceError, match="SSTs/000008-aaa.sst"):
        c.plan()


def test_rocksdb_v2_follows_committed_unique_ids_with_sidecars():
    c = base(5)
    c["commits/4"] = commit({"0": [["u5p0"], ["u5p1"]]})  # version 5 ids per partition
    for part in (0, 1):
        c[f"state/0/{part}/3_s{part}.zip"] = rocks_zip({f"00001{part}-x.sst": 1})
        c[f"state/0/{part}/SSTs/00001{part}-x.sst"] = b"x"
        c[f"state/0/{part}/4_c{part}.changelog"] = b"c"
        c[f"state/0/{part}/5_u5p{part}.changelog"] = b"c"
        c[f"state/0/{part}/5_u5p{part}.changelog.crc"] = b"{}"
        c[f"state/0/{part}/5_retry{part}.changelog"] = b"c"  # an abandoned task attempt
        c[f"state/0/{part}/6_next{part}.changelog"] = b"c"
    plan = c.plan()
    got = {p for p in paths(plan) if p.startswith("state/")}
    assert plan.checkpoint_format_version == 2 and plan.changelog_checkpointing
    for part in (0, 1):
        assert {f"state/0/{part}/3_s{part}.zip", f"state/0/{part}/4_c{part}.changelog",
                f"state/0/{part}/5_u5p{part}.changelog", f"state/0/{part}/5_u5p{part}.changelog.crc",
                f"state/0/{part}/SSTs/00001{part}-x.sst"} <= got
        assert f"state/0/{part}/5_retry{part}.changelog" not in got
        assert f"state/0/{part}/6_next{part}.changelog" not in got
    sidecar = next(f for f in plan.files if f.path.endswith(".crc"))
    assert sidecar.sidecar_of == sidecar.path[:-4]


def test_a_v2_store_whose_lineage_needs_three_zips_is_planned_alike_with_its_zips_read_together():
    """Version 3 has zips of two task attempts (not a stop: the lineage may go further back), version 2 one zip:
    the store needs three zips, read one round after another, each once, and planned as one after another."""
    c = base(4)
    c["commits/3"] = commit({"0": [["u4"]]})
    c["state/0/0/4_u4.changelog"] = b"c"
    for name, sst in (("3_a.zip", "000001-a.sst"), ("3_b.zip", "000002-b.sst"), ("2_s.zip", "000003-s.sst")):
        c[f"state/0/0/{name}"] = rocks_zip({sst: 1})
        c[f"state/0/0/SSTs/{sst}"] = b"x"
    read: list[str] = []

    def reader(path: str) -> bytes:
        read.append(path)
        return c[path]

    together = plan_checkpoint(c.listing(), reader, parallelism=4)
    zips = sorted(p for p in read if p.endswith(".zip"))
    assert zips == ["state/0/0/2_s.zip", "state/0/0/3_a.zip", "state/0/0/3_b.zip"], read
    assert together.files == c.plan().files and len(together.snapshots) == 3


def test_transform_with_state_metadata_v2_and_schema_files():
    c = base(7)
    schema = "file:/old/ckpt/state/0/_stateSchema/default/0_abc"
    body = {"operatorInfo": {"operatorId": 0}, "stateStoreInfo": [{"storeName": "default", "stateSchemaFilePaths": [schema]}]}
    c["state/0/_metadata/v2/0"] = b"v2\n" + json.dumps(body).encode()
    c["state/0/_metadata/v2/9"] = b"v2\n" + json.dumps(body).encode()  # a later run: not for batch 6
    c["state/0/_stateSchema/default/0_abc"] = b"schema"
    c["state/0/_stateSchema/default/9_def"] = b"schema"
    got = {p for p in paths(c.plan()) if p.startswith("state/")}
    assert got == {"state/0/_metadata/v2/0", "state/0/_stateSchema/default/0_abc"}


def test_errors_for_non_checkpoints_and_uncommitted_ones():
    with pytest.raises(NotACheckpointError, match="not a Spark streaming checkpoint"):
        Ckpt({"notes.txt": b"x"}).plan()
    c = Ckpt({"metadata": json.dumps({"id": QUERY_ID}).encode(), "offsets/0": offsets({"logOffset": 0})})
    with pytest.raises(NoCommittedBatchError, match="no committed micro-batch"):
        c.plan()
    c = base(3)
    del c["metadata"]
    with pytest.raises(CheckpointError, match="no 'metadata' file"):
        c.plan()
    c = base(3)
    c["offsets/2"] = b"garbage"
    with pytest.raises(CheckpointError, match="offsets/2 is truncated"):
        c.plan()
    c["offsets/2"] = b"garbage\n{}"
    with pytest.raises(CheckpointError, match="offsets/2 does not start with a version line"):
        c.plan()


def test_offset_log_v2_named_sources():
    c = Ckpt({"metadata": json.dumps({"id": QUERY_ID}).encode()})
    c["offsets/0"] = offsets('events:{"logOffset":0}', version=2)
    c["commits/0"] = commit()
    c["sources/events/0"] = b"v1\n{}"
    c["sources/events/1"] = b"v1\n{}"
    plan = c.plan()
    assert plan.offset_log_version == 2 and plan.source_offsets == {"events": {"logOffset": 0}}
    assert {p for p in paths(plan) if p.startswith("sources/")} == {"sources/events/0"}


def test_complete_state_of_the_planned_batch_travels_with_its_offsets():
    """offsets/N+1 planned and state N+2 complete in every store: both go, as Spark's recovery needs."""
    c = base(4)  # N = 3, state version 4
    c["offsets/4"] = offsets({"logOffset": 4})
    for part in (0, 1):
        for v in range(1, 6):
            c[f"state/0/{part}/{v}.delta"] = b"d"
    plan = c.plan()
    assert plan.includes_next_offsets and plan.includes_next_state
    assert {"state/0/0/5.delta", "state/0/1/5.delta", "state/0/1/4.delta"} <= paths(plan)
    del c["state/0/1/5.delta"]  # batch 4 still running: partition 1 has not written version 5
    plan = c.plan()
    assert plan.includes_next_offsets and not plan.includes_next_state
    assert not {p for p in paths(plan) if p.endswith("/5.delta")}


def test_a_local_file_gone_between_the_scan_and_its_stat_is_a_race(tmp_path):
    """On a local disk the names are read first and the planned files stat'ed together afterwards: a
    planned file, sidecar or snapshot zip Spark removed in between is a race; a gone file of state N+2
    only leaves that version out. The stats taken are the listing's (the copier does not stat again)."""
    c = base(4)  # N = 3, state version 4, offsets/4 planned: state 5 too if complete
    c["offsets/4"] = offsets({"logOffset": 4})
    for v in range(1, 6):
        c[f"state/0/0/{v}.delta"] = b"d"
        c[f"state/0/0/.{v}.delta.crc"] = b"hadoop"
    c["state/0/0/4.delta.crc"] = b"{}"
    c["state/0/1/3.zip"] = rocks_zip({"000008-aaa.sst": 3})
    c["state/0/1/SSTs/000008-aaa.sst"] = b"abc"
    for v in (4, 5):
        c[f"state/0/1/{v}.changelog"] = b"c"
    store = Store(str(tmp_path))
    for rel, data in c.items():
        store.write_bytes_atomic(rel, data)

    def plan(gone: str | None = None):
        listing = store.list_files_lazily()
        if gone:
            os.remove(tmp_path / gone)  # after the scan, before the planner's stats
        return plan_checkpoint(listing, store.read_bytes, where="ckpt"), listing

    whole, listing = plan()
    assert whole.includes_next_state and "state/0/0/5.delta" in paths(whole)
    assert next(f for f in whole.files if f.path == "state/0/0/4.delta.crc").sidecar_of == "state/0/0/4.delta"
    assert [(f.size, f.version) for f in whole.files] == [(s.size, s.version) for s in map(store.stat, paths_of(whole))]
    assert all(listing._stats[f.path] is listing.get(f.path) for f in whole.files)  # noqa: SLF001 - stat'ed once
    without_next, _ = plan("state/0/1/5.changelog")
    assert not without_next.includes_next_state and not {p for p in paths(without_next) if "/5." in p}
    for gone, message in (("state/0/0/3.delta", "needed for batch 3: 'state/0/0/3.delta' is not there"),
                          ("state/0/0/4.delta.crc", "'state/0/0/4.delta.crc' vanished while planning"),
                          ("state/0/1/3.zip", "'state/0/1/3.zip' is not there")):
        with pytest.raises(CheckpointRaceError, match=re.escape(message)):
            plan(gone)
        store.write_bytes_atomic(gone, c[gone])


def paths_of(plan) -> list[str]:
    return [f.path for f in plan.files]


def test_first_reads_start_the_batchs_logs_once_the_listing_is_past_them():
    """Told a listing's pages in key order, ``FirstReads`` starts the newest committed batch's offsets and commit
    and the next batch's offsets once a page reaches past every ``offsets/`` name (not before: the next page
    could list more), and only once."""
    from concurrent.futures import Future

    started: list[str] = []

    def start(path: str) -> Future:
        started.append(path)
        future: Future = Future()
        future.set_result(path.encode())
        return future

    first, stat = FirstReads(start), FileStat(size=1, version="v")
    first({"commits/7": stat, "commits/8": stat, "metadata": stat, "offsets/7": stat, "offsets/8": stat})
    assert started == []
    first({"offsets/9": stat, "offsets/.9.tmp": stat, "sources/0/0": stat})
    assert started == ["offsets/8", "commits/8", "offsets/9"] and list(first.started) == started
    first({"state/0/0/1.delta": stat})
    assert len(started) == 3
