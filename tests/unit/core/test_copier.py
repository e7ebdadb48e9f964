"""The copier: per file, the first copy method the destination offers that applies, with a CRC32C of
every file and where it came from; on a local disk and on moto's S3 server (127.0.0.1)."""

from __future__ import annotations

import google_crc32c
import pytest

from airflow_savepoints.core.copier import (
    LINK,
    PREVIOUS,
    READ,
    SERVER_COPY,
    STORE,
    STREAM,
    CopyOptions,
    KnownChecksum,
    copy_file,
    copy_many,
)
from airflow_savepoints.storage import Store

DATA = {"offsets/3": b"v1\n{}\n", "state/0/0/4.delta": b"delta" * 300, "state/0/1/4.delta": b"other" * 200}


def crc(data: bytes) -> int:
    return google_crc32c.value(data)


def filled(store: Store) -> Store:
    for rel, data in DATA.items():
        store.write_bytes_atomic(rel, data)
    return store


def test_between_local_stores_each_file_is_linked_and_its_inode_hashed(tmp_path):
    source, target = filled(Store(str(tmp_path / "ckpt"))), Store(str(tmp_path / "sp"))
    listing = source.list_files()
    copied = copy_many(source, target, sorted(DATA), CopyOptions(4), stats=listing)
    for rel, data in DATA.items():
        assert (copied[rel].method, copied[rel].checksum_source, copied[rel].crc) == (LINK, READ, crc(data))
        assert copied[rel].source_version == listing[rel].version == target.stat(rel).version  # the same inode


def test_stream_mode_writes_new_files_and_records_the_version_it_read(tmp_path):
    source, target = filled(Store(str(tmp_path / "ckpt"))), Store(str(tmp_path / "sp"))
    copied = copy_file(source, "offsets/3", target, mode="stream")
    assert (copied.method, copied.checksum_source, copied.crc) == (STREAM, READ, crc(DATA["offsets/3"]))
    assert copied.source_version == source.stat("offsets/3").version != target.stat("offsets/3").version
    with pytest.raises(ValueError, match="copy mode"):
        copy_file(source, "offsets/3", target, mode="fast")


def test_a_known_checksum_is_reused_by_linking_the_previous_savepoints_file(tmp_path):
    source, target = filled(Store(str(tmp_path / "ckpt"))), Store(str(tmp_path / "sp2"))
    previous = filled(Store(str(tmp_path / "sp1")))
    rel = "state/0/0/4.delta"
    known = {rel: KnownChecksum(previous, rel, len(DATA[rel]), 1234, "savepoint-prev01-x")}  # 1234: not re-read
    copied = copy_many(source, target, [rel, "offsets/3"], CopyOptions(4), known=known)
    assert (copied[rel].method, copied[rel].checksum_source, copied[rel].crc) == (LINK, PREVIOUS, 1234)
    assert copied[rel].reused_from == "savepoint-prev01-x" and copied["offsets/3"].checksum_source == READ
    assert target.stat(rel).version == previous.stat(rel).version


def test_a_previous_file_of_another_size_or_gone_is_not_reused(tmp_path):
    source, target = filled(Store(str(tmp_path / "ckpt"))), Store(str(tmp_path / "sp2"))
    previous = filled(Store(str(tmp_path / "sp1")))
    rel, gone = "state/0/0/4.delta", "state/0/1/4.delta"
    previous.remove_file(gone)
    known = {rel: KnownChecksum(previous, rel, len(DATA[rel]) + 1, 1, "p"),
             gone: KnownChecksum(previous, gone, len(DATA[gone]), 1, "p")}
    copied = copy_many(source, target, [rel, gone], CopyOptions(4), known=known)
    for path in (rel, gone):
        assert (copied[path].method, copied[path].checksum_source, copied[path].crc) == (LINK, READ, crc(DATA[path]))
        assert target.stat(path).version == source.stat(path).version


@pytest.mark.s3
def test_between_locations_on_s3_files_are_copied_by_the_store_with_its_crc32c(s3):
    source, target = filled(Store(f"s3://{s3}/ckpt")), Store(f"s3://{s3}/sp")
    listing = source.list_files()
    copied = copy_many(source, target, sorted(DATA), CopyOptions(4), stats=listing)
    for rel, data in DATA.items():
        assert (copied[rel].method, copied[rel].checksum_source, copied[rel].crc) == (SERVER_COPY, STORE, crc(data))
        assert copied[rel].source_version == listing[rel].version and target.read_bytes(rel) == data


@pytest.mark.s3
def test_on_s3_a_previous_copy_whose_crc_disagrees_is_replaced_from_the_checkpoint(s3):
    source, target, previous = filled(Store(f"s3://{s3}/ckpt")), Store(f"s3://{s3}/sp2"), filled(Store(f"s3://{s3}/sp1"))
    rel, other = "state/0/0/4.delta", "state/0/1/4.delta"
    known = {rel: KnownChecksum(previous, rel, len(DATA[rel]), crc(DATA[rel]), "p"),
             other: KnownChecksum(previous, other, len(DATA[other]), crc(b"what was recorded"), "p")}
    copied = copy_many(source, target, [rel, other], CopyOptions(4), known=known, stats=source.list_files())
    assert (copied[rel].method, copied[rel].checksum_source, copied[rel].reused_from) == (SERVER_COPY, STORE, "p")
    assert (copied[other].checksum_source, copied[other].reused_from, copied[other].crc) == (STORE, None, crc(DATA[other]))


@pytest.mark.s3
def test_between_a_local_disk_and_s3_files_are_streamed(s3, tmp_path):
    local, bucket = filled(Store(str(tmp_path / "ckpt"))), Store(f"s3://{s3}/sp")
    up = copy_file(local, "offsets/3", bucket)
    assert (up.method, up.crc, up.source_version) == (STREAM, crc(DATA["offsets/3"]), local.stat("offsets/3").version)
    down = copy_file(bucket, "offsets/3", Store(str(tmp_path / "restored")))
    assert (down.method, down.crc, down.source_version) == (STREAM, crc(DATA["offsets/3"]), None)  # not pinned


def test_bounded_map_refills_the_window_past_a_slow_item():
    """A slow first item holds up its own worker only: the items beyond the window (4 per worker) still run
    while it waits, and the results keep their order. Refilling only as the oldest item ends would wait here."""
    import threading

    from airflow_savepoints.core.copier import bounded_map

    far = threading.Event()

    def work(i: int) -> int:
        if i == 0:
            assert far.wait(timeout=10), "no item past the window ran while the first was slow"
        if i == 4 * 4 + 10:
            far.set()
        return i

    assert bounded_map(work, list(range(60)), 4) == list(range(60))


def test_bounded_map_announces_its_last_wave_once_while_the_last_items_run():
    """``on_last_wave`` is called once every item is handed to the pool and no more than one per worker is
    left: the last four items here wait for the call, and all the others are done when it comes."""
    import threading

    from airflow_savepoints.core.copier import bounded_map

    finished: list[int] = []
    seen: list[int] = []
    announced = threading.Event()

    def work(i: int) -> int:
        if i >= 96:
            assert announced.wait(timeout=10), "the last wave was not announced while it ran"
        finished.append(i)
        return i

    def last_wave() -> None:
        seen.append(len(finished))
        announced.set()

    assert bounded_map(work, list(range(100)), 4, last_wave) == list(range(100))
    assert seen == [96]


def test_bounded_map_raises_the_failure_of_the_first_item_in_order():
    import threading

    from airflow_savepoints.core.copier import bounded_map

    later_failed = threading.Event()

    def work(i: int) -> int:
        if i == 5:
            later_failed.wait(timeout=10)
            raise ValueError("item 5")
        if i == 9:
            later_failed.set()
            raise ValueError("item 9")
        return i

    with pytest.raises(ValueError, match="item 5"):
        bounded_map(work, list(range(200)), 4)


def test_bounded_map_keeps_order_queues_a_few_items_per_worker_and_stops_at_the_first_failure():
    import threading

    from airflow_savepoints.core.copier import bounded_map

    started, lock = [], threading.Lock()

    def work(i: int) -> int:
        with lock:
            started.append(i)
        if i == 50:
            raise ValueError("item 50")
        return i * i

    assert bounded_map(work, list(range(40)), 4) == [i * i for i in range(40)]
    started.clear()
    with pytest.raises(ValueError, match="item 50"):
        bounded_map(work, list(range(10_000)), 4)
    assert max(started) < 50 + 4 * 4 + 4  # queued no further than the window past the failure
