"""Property-based tests of the planner: for generated checkpoints, the plan holds what Spark needs.

Hypothesis builds checkpoint listings in Spark's formats (tests/unit/checkpoint/test_planner.py's builder,
generalised): HDFS state stores (deltas, snapshots), RocksDB checkpoint format v1 (zips + SSTs,
with or without changelogs) and v2 (unique ids, lineage, abandoned task attempts), stream-stream
joins (four stores per partition), compacted file-source logs and Kafka sources, prefixes purged
by Spark's cleanup, a planned-but-uncommitted batch N+1 (with state N+2 complete or not), and temp
and Hadoop checksum files. ``needed`` below is an independent reading of the checkpoint spec
(/work/shared/reference/spark-checkpoint-spec.md §1.4-§2.1): what Spark reads to restart at N.

Properties: every planned file is in the listing; the plan holds every needed file; everything
else in it is one of the extras the spec allows (offsets/N+1 and its source-log tail, complete
state N+2, and for RocksDB v2 the files of abandoned attempts between the lineage's snapshot and
N+1); nothing of batches > N+1 (> N+2 for state) is planned; the error cases raise.
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_savepoints.checkpoint.planner import plan_checkpoint
from airflow_savepoints.errors import CheckpointError
from airflow_savepoints.storage import FileStat

EXAMPLES = 300
QUERY_ID = "2ee3efbd-e866-49e6-86c7-e5aaaa705e6d"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
JOIN_STORES = ["left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues", "right-keyWithIndexToValue"]


def rocks_zip(ssts: list[str]) -> bytes:
    meta = {"sstFiles": [{"localFileName": n.split("-")[0] + ".sst", "dfsSstFileName": n, "sizeBytes": 3} for n in ssts],
            "numKeys": 1}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("metadata", "v1\n" + json.dumps(meta))
    return buf.getvalue()


@dataclass
class Store:
    """One state store folder and, for the reference, how to load a version from it."""

    folder: str
    kind: str  # hdfs | rocks1 | rocks2
    snapshots: set[int] = field(default_factory=set)  # committed lineage snapshot versions (rocks2) or all (others)
    changelog: bool = True  # rocks1: changelog checkpointing on
    purged_below: int = 1
    uid: dict[int, str] = field(default_factory=dict)  # rocks2: committed unique id per version
    zip_ssts: dict[str, list[str]] = field(default_factory=dict)  # zip file -> the SSTs it lists
    top: int = 0  # newest version written


@dataclass
class Checkpoint:
    files: dict[str, bytes]
    n: int | None  # the batch the plan must be for (None: an error is expected)
    stores: list[Store]
    next_offsets: bool
    file_log: str | None  # "sources/0" when there is a file source
    log_offset: dict[int, int]  # batch -> file-source log offset
    compacts: set[int]
    kafka: str | None
    error: str | None = None


@st.composite
def checkpoints(draw) -> Checkpoint:
    files: dict[str, bytes] = {"metadata": json.dumps({"id": QUERY_ID}).encode()}
    n = draw(st.integers(0, 9))  # newest committed batch
    next_offsets = draw(st.booleans())
    fmt = draw(st.sampled_from([1, 1, 2]))
    # offsets/commits below this were purged by Spark (1 in 20: too far, offsets/N-1 gone)
    retain_from = n if draw(st.integers(0, 19)) == 0 else draw(st.integers(0, max(n - 1, 0)))
    last_batch = n + 1 if next_offsets else n

    # sources: a file source (log offset grows by 0 or 1 per batch, compacted every k entries) and maybe Kafka
    file_log = "sources/0" if draw(st.booleans()) else None
    log_offset: dict[int, int] = {}
    compacts: set[int] = set()
    offset = -1
    for b in range(last_batch + 1):
        offset += draw(st.integers(0 if b else 1, 1))
        log_offset[b] = offset
    kafka = None
    lines = {}
    if file_log:
        k = draw(st.integers(2, 5))
        newest_entry = log_offset[last_batch] + draw(st.integers(0, 2))  # entries past the offset: written while planning
        compacts = {i for i in range(newest_entry + 1) if (i + 1) % k == 0}
        keep_from = draw(st.sampled_from(sorted({0} | {c for c in compacts if c <= log_offset[n]})))
        for i in range(keep_from, newest_entry + 1):
            files[f"{file_log}/{i}" + (".compact" if i in compacts else "")] = b"v1\n{}"
    if draw(st.booleans()):
        kafka = "sources/1" if file_log else "sources/0"
        files[f"{kafka}/0"] = b"\x00v1\n{}"
    for b in range(last_batch + 1):
        entries = []
        if file_log:
            entries.append(json.dumps({"logOffset": log_offset[b]}))
        if kafka:
            entries.append(json.dumps({"orders": {"0": b * 10}}))
        lines[b] = entries

    # state: operators and their stores
    stores: list[Store] = []
    ops = draw(st.integers(0, 2))
    partitions = draw(st.integers(1, 2))
    kinds = ["rocks2"] * ops if fmt == 2 else [draw(st.sampled_from(["hdfs", "rocks1", "join"])) for _ in range(ops)]
    provider = ROCKS if fmt == 2 or "rocks1" in kinds else HDFS
    v_committed = n + 1
    next_state_everywhere = draw(st.booleans())
    for op, kind in enumerate(kinds):
        files[f"state/{op}/_metadata/metadata"] = b"v1\n{}"
        names = JOIN_STORES if kind == "join" else [None]
        for part in range(partitions):
            for name in names:
                folder = f"state/{op}/{part}" + (f"/{name}" if name else "")
                store = Store(folder, "hdfs" if kind == "join" else kind)
                top = v_committed
                if next_offsets and fmt == 1 and (next_state_everywhere or draw(st.booleans())):
                    top = v_committed + 1  # batch N+1's task for this store finished
                top += draw(st.integers(0, 1)) if next_offsets else 0  # an in-flight attempt may write one more
                store.top = top
                if part == 0:
                    files[f"{folder}/_metadata/schema"] = b"\x00\x02v2"
                _write_store(draw, files, store, top, v_committed)
                stores.append(store)
    conf = {"spark.sql.streaming.stateStore.providerClass": provider}
    for b in range(retain_from, last_batch + 1):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": conf}
        files[f"offsets/{b}"] = "\n".join(["v1", json.dumps(meta), *lines[b]]).encode()
    for b in range(retain_from, n + 1):
        if fmt == 2:
            ids = {}
            for op in range(ops):
                ids[str(op)] = [[s.uid.get(b + 1, "none") for s in stores if s.folder.startswith(f"state/{op}/{p}")]
                                for p in range(partitions)]
            files[f"commits/{b}"] = ("v2\n" + json.dumps({"nextBatchWatermarkMs": 0, "stateUniqueIds": ids})).encode()
        else:
            files[f"commits/{b}"] = b'v1\n{"nextBatchWatermarkMs":0}'
    # noise Spark leaves around: temp files and Hadoop's hidden checksums
    for path in draw(st.lists(st.sampled_from(sorted(files)), max_size=3)):
        head, _, name = path.rpartition("/")
        files[f"{head}/.{name}.5f2a.tmp".lstrip("/")] = b"partial"
        files[f"{head}/.{name}.crc".lstrip("/")] = b"hadoop"
    error = "purged" if n > 0 and retain_from == n else None
    return Checkpoint(files, n, stores, next_offsets, file_log, log_offset, compacts, kafka, error)


def _write_store(draw, files: dict[str, bytes], store: Store, top: int, v_committed: int) -> None:
    folder = store.folder
    snapshots = set(draw(st.lists(st.integers(1, max(top, 1)), max_size=3)))
    if store.kind == "hdfs":
        store.snapshots = snapshots
        usable = sorted(s for s in snapshots if s <= v_committed)
        store.purged_below = draw(st.sampled_from([1, *usable]))  # Spark's cleanup keeps a loadable chain
        for v in range(store.purged_below, top + 1):
            files[f"{folder}/{v}.delta"] = b"d"
        for s in snapshots:
            if s >= store.purged_below:
                files[f"{folder}/{s}.snapshot"] = b"s"
        return
    if store.kind == "rocks1":
        store.changelog = draw(st.booleans())
        if not store.changelog:
            snapshots = set(range(1, top + 1))  # every version is a zip
        store.snapshots = snapshots
        usable = sorted(s for s in snapshots if s <= v_committed)
        store.purged_below = draw(st.sampled_from([1, *usable])) if store.changelog else usable[-1] if usable else 1
        for v in range(store.purged_below, top + 1):
            if store.changelog:
                files[f"{folder}/{v}.changelog"] = b"c"
            if v in snapshots:
                ssts = [f"{v:06d}-{draw(st.sampled_from(['a', 'b']))}{v}.sst"]
                zip_name = f"{folder}/{v}.zip"
                files[zip_name] = rocks_zip(ssts)
                store.zip_ssts[zip_name] = ssts
                for sst in ssts:
                    files[f"{folder}/SSTs/{sst}"] = b"sst"
        return
    # rocks2: committed lineage with unique ids; abandoned attempts write other ids (sometimes a zip too)
    store.snapshots = snapshots
    usable = sorted(s for s in snapshots if s <= v_committed)
    store.purged_below = draw(st.sampled_from([1, *usable]))
    abandoned_zips = draw(st.booleans())
    for v in range(store.purged_below, top + 1):
        uid = f"c{v}-{zlib.crc32(folder.encode()) % 997}"
        store.uid[v] = uid
        files[f"{folder}/{v}_{uid}.changelog"] = b"c"
        if draw(st.booleans()):
            files[f"{folder}/{v}_{uid}.changelog.crc"] = b"{}"
        if v in snapshots:
            _rocks2_zip(files, store, f"{folder}/{v}_{uid}.zip", v)
        if draw(st.integers(0, 3)) == 0:  # a failed task attempt for this version
            files[f"{folder}/{v}_retry{v}.changelog"] = b"c"
            if abandoned_zips and draw(st.booleans()):
                _rocks2_zip(files, store, f"{folder}/{v}_retry{v}.zip", v)


def _rocks2_zip(files, store: Store, zip_name: str, v: int) -> None:
    ssts = [f"{v:06d}-{zip_name.rsplit('_', 1)[1][:-4]}.sst"]
    files[zip_name] = rocks_zip(ssts)
    store.zip_ssts[zip_name] = ssts
    for sst in ssts:
        files[f"{store.folder}/SSTs/{sst}"] = b"sst"


# ---- the reference: what Spark reads to restart at batch N (the spec, independently of the planner) -----

def store_needs(store: Store, files: dict[str, bytes], version: int) -> set[str] | None:
    """Files Spark reads to load ``version`` of this store; None if it cannot be loaded."""
    f = store.folder
    if store.kind == "hdfs":  # §1.7: newest snapshot S <= V, then S+1..V deltas (no snapshot: 1..V)
        base = max((s for s in store.snapshots if store.purged_below <= s <= version), default=0)
        need = {f"{f}/{base}.snapshot"} if base else set()
        need |= {f"{f}/{v}.delta" for v in range(base + 1, version + 1)}
        return need if need <= files.keys() else None
    if store.kind == "rocks1":  # §1.8: newest zip <= V with its SSTs, then changelogs
        base = max((s for s in store.snapshots if store.purged_below <= s <= version), default=0)
        need = set()
        if base:
            need |= {f"{f}/{base}.zip"} | {f"{f}/SSTs/{s}" for s in store.zip_ssts[f"{f}/{base}.zip"]}
        need |= {f"{f}/{v}.changelog" for v in range(base + 1, version + 1)}
        return need if need <= files.keys() else None
    # rocks2 (§1.3, §1.8): V's committed id, its lineage back to the newest committed snapshot
    if version not in store.uid:
        return None
    need = set()
    v = version
    while v >= 1:
        zip_name = f"{f}/{v}_{store.uid[v]}.zip"
        if zip_name in files:
            need |= {zip_name} | {f"{f}/SSTs/{s}" for s in store.zip_ssts[zip_name]}
            break
        need.add(f"{f}/{v}_{store.uid[v]}.changelog")
        v -= 1
    return need


def rocks2_allowed_extras(store: Store, files: dict[str, bytes], version: int, needed: set[str]) -> set[str]:
    """The planner may take every zip/changelog (and a zip's SSTs) of versions between the lineage's snapshot and V."""
    versions = {int(p.rsplit("/", 1)[1].split("_")[0]) for p in needed if p.endswith((".zip", ".changelog"))}
    low = min(versions, default=version)
    # below the lineage's snapshot when other attempts have files at its version too: down to a version
    # whose files are one attempt's with a zip (or the purged prefix)
    if len(_ids_at(store, files, low)) > 1:
        low -= 1
        while low > store.purged_below and not (len(ids := _ids_at(store, files, low)) == 1
                                                and f"{store.folder}/{low}_{next(iter(ids))}.zip" in files):
            low -= 1
    extra = set()
    for path in files:
        name = path[len(store.folder) + 1:]
        if path.startswith(store.folder + "/") and "/" not in name and name[0].isdigit():
            v = int(name.split("_")[0].split(".")[0])
            if low <= v <= version:
                extra.add(path)
                extra |= {f"{store.folder}/SSTs/{s}" for s in store.zip_ssts.get(path, [])}
    return extra


def _ids_at(store: Store, files: dict[str, bytes], v: int) -> set[str]:
    prefix = f"{store.folder}/{v}_"
    return {p[len(prefix):].split(".")[0] for p in files if p.startswith(prefix) and "/" not in p[len(prefix):]}


def needed(c: Checkpoint) -> tuple[set[str], set[str], bool]:
    """(files Spark needs for N, extras the spec allows, whether state N+2 is complete in every store)."""
    n = c.n
    need = {"metadata", f"offsets/{n}", f"commits/{n}"} | ({f"offsets/{n - 1}"} if n > 0 else set())
    allowed: set[str] = set()
    if c.next_offsets:
        need.add(f"offsets/{n + 1}")  # included by design: the restart re-runs N+1 with the same offsets
    if c.file_log:  # §1.5: the two newest compacts <= L (Spark derives the interval from them), then the entries up to L
        last = c.log_offset[n + 1 if c.next_offsets else n]
        present = sorted(x for x in c.compacts if x <= last and f"{c.file_log}/{x}.compact" in c.files)
        need |= {f"{c.file_log}/{x}.compact" for x in present[-2:]}
        base = present[-1] if present else -1
        need |= {f"{c.file_log}/{i}" for i in range(base + 1, last + 1)}
    if c.kafka:
        need.add(f"{c.kafka}/0")
    for path in c.files:
        if path.startswith("state/") and (path.endswith("/_metadata/schema") or path.endswith("/_metadata/metadata")):
            need.add(path)
    v = n + 1
    for store in c.stores:
        got = store_needs(store, c.files, v)
        assert got is not None, f"generator bug: {store.folder} cannot load {v}"
        need |= got
        if store.kind == "rocks2":
            allowed |= rocks2_allowed_extras(store, c.files, v, got)
    next_complete = bool(c.stores) and c.next_offsets and all(s.kind != "rocks2" for s in c.stores) and all(
        store_needs(s, c.files, v + 1) is not None for s in c.stores)
    if next_complete:
        for store in c.stores:
            allowed |= store_needs(store, c.files, v + 1)
    sidecars = {p + ".crc" for p in need | allowed if p + ".crc" in c.files}
    return need | {s for s in sidecars if s[:-4] in need}, allowed | sidecars, next_complete


def batch_of(path: str) -> int | None:
    parts = path.split("/")
    if parts[0] in ("offsets", "commits"):
        return int(parts[1])
    return None


examples_run = {"count": 0, "errors": 0, "kinds": set()}


def test_300_generated_checkpoints_plan_exactly_what_spark_needs_to_restart_at_n():
    """The property over generated checkpoints, then what the examples covered: every kind of store."""
    examples_run.update(count=0, errors=0, kinds=set())
    plans_exactly_what_spark_needs()
    print(f"\nplanner property: {examples_run['count']} generated checkpoints ({examples_run['errors']} purged too far), "
          f"store kinds {sorted(examples_run['kinds'])}")
    assert examples_run["count"] >= EXAMPLES // 2 and examples_run["kinds"] >= {"hdfs", "rocks1", "rocks2"}, examples_run


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(c=checkpoints())
def plans_exactly_what_spark_needs(c: Checkpoint):
    examples_run["count"] += 1
    examples_run["kinds"] |= {s.kind for s in c.stores}
    listing = {p: FileStat(len(b), "v1") for p, b in c.files.items()}
    if c.error:
        examples_run["errors"] += 1
        with pytest.raises(CheckpointError, match=f"offsets/{c.n - 1} is gone"):
            plan_checkpoint(listing, c.files.__getitem__, where="generated")
        return
    plan = plan_checkpoint(listing, c.files.__getitem__, where="generated")
    together = plan_checkpoint(listing, c.files.__getitem__, where="generated", parallelism=4)  # zips read together
    assert together.files == plan.files and together.snapshots == plan.snapshots
    got = {f.path for f in plan.files}
    need, allowed, next_complete = needed(c)
    assert plan.batch_id == c.n and plan.query_id == QUERY_ID
    assert got <= listing.keys(), got - listing.keys()  # every planned file exists
    assert not {p for p in got if any(x.startswith(".") or x.endswith(".tmp") for x in p.split("/"))}
    missing = need - got
    assert not missing, f"Spark needs these to restart at {c.n}: {sorted(missing)}"
    extra = got - need - allowed
    assert not extra, f"planned but neither needed nor allowed: {sorted(extra)}"
    assert plan.includes_next_offsets == c.next_offsets
    assert plan.includes_next_state == next_complete
    assert all(batch_of(p) is None or batch_of(p) <= c.n + (1 if c.next_offsets else 0) for p in got)
    assert [f.path for f in plan.files][-1] == "metadata"


def test_an_abandoned_attempts_zip_does_not_cut_the_rocksdb_v2_lineage():
    """Found by the property: a failed task attempt's snapshot zip at version 6 made the planner stop
    there, leaving out the committed lineage's snapshot 4 and changelog 5 (restore would fail)."""
    files = {"metadata": json.dumps({"id": QUERY_ID}).encode()}
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"spark.sql.streaming.stateStore.providerClass": ROCKS}}
    for b in (5, 6):
        files[f"offsets/{b}"] = f"v1\n{json.dumps(meta)}".encode()
    files["commits/6"] = b'v2\n{"nextBatchWatermarkMs":0,"stateUniqueIds":{"0":[["c7"]]}}'
    for v in (4, 5, 6, 7):
        files[f"state/0/0/{v}_c{v}.changelog"] = b"c"
    files["state/0/0/4_c4.zip"] = rocks_zip(["000004-c4.sst"])
    files["state/0/0/SSTs/000004-c4.sst"] = b"sst"
    files["state/0/0/6_retry6.changelog"] = b"c"
    files["state/0/0/6_retry6.zip"] = rocks_zip(["000006-retry6.sst"])
    files["state/0/0/SSTs/000006-retry6.sst"] = b"sst"
    plan = plan_checkpoint({p: FileStat(len(b), "v") for p, b in files.items()}, files.__getitem__)
    got = {f.path for f in plan.files}
    assert {"state/0/0/7_c7.changelog", "state/0/0/6_c6.changelog", "state/0/0/5_c5.changelog", "state/0/0/4_c4.zip",
            "state/0/0/SSTs/000004-c4.sst"} <= got
