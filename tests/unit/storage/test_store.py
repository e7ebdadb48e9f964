"""Store: URL forms, the root guard, listings and error reporting, on a local disk and on a real S3 server (moto on 127.0.0.1)."""

from __future__ import annotations

import os
import threading

import fsspec
import pytest

from airflow_savepoints.errors import (
    InvalidPathError,
    MissingBackendError,
    OutsideRootError,
    StoragePermissionError,
    UnknownSchemeError,
)
from airflow_savepoints.storage import Store, split_url


@pytest.mark.parametrize(
    "url,expected",
    [
        ("/data/sp", ("file", "file", "/data/sp")),
        ("/data/sp/", ("file", "file", "/data/sp")),
        ("file:///data/sp", ("file", "file", "/data/sp")),
        ("file:/data/sp", ("file", "file", "/data/sp")),  # how Spark writes local paths
        ("s3://bucket/sp", ("s3", "s3", "bucket/sp")),
        ("s3a://bucket/sp", ("s3a", "s3", "bucket/sp")),
        ("gs://bucket/sp", ("gs", "gcs", "bucket/sp")),
        ("abfs://container/sp", ("abfs", "abfs", "container/sp")),
        ("hdfs://namenode/sp", ("hdfs", "hdfs", "namenode/sp")),
    ],
)
def test_url_forms(url, expected):
    assert split_url(url) == expected


@pytest.mark.parametrize("url,error", [("relative/sp", InvalidPathError), ("", InvalidPathError),
                                       ("s3://", InvalidPathError), ("zzz://x/y", UnknownSchemeError)])
def test_bad_urls(url, error):
    with pytest.raises(error) as info:
        Store(url)
    assert info.value.hint


def test_gs_abfs_and_hdfs_go_to_their_fsspec_backends():
    """Each scheme reaches its own fsspec backend; a missing package is named in the error."""
    for scheme, package in (("gs", "gcsfs"), ("abfs", "adlfs")):
        try:
            cls = fsspec.get_filesystem_class(split_url(f"{scheme}://b/x")[1])
        except ImportError:
            with pytest.raises(MissingBackendError, match=package) as info:
                Store(f"{scheme}://bucket/x")
            assert package in str(info.value)
        else:
            assert cls.__module__.startswith(package)
    assert fsspec.get_filesystem_class("hdfs").__module__ == "hdfs_native.fsspec"  # the hdfs extra's, by its entry point


def test_local_operations_and_root_guard(tmp_path):
    store = Store(str(tmp_path / "root"))
    store.write_bytes_atomic("a/b/file", b"12345")
    assert store.list_files() == {"a/b/file": store.stat("a/b/file")}
    assert store.stat("a/b/file").size == 5
    assert store.listdir("a") == ["b"] and store.isdir("a") and store.isfile("a/b/file")
    before = store.stat("a/b/file").version
    store.write_bytes_atomic("a/b/file", b"12345")  # replaced by rename: same size, new version token
    assert store.stat("a/b/file").version != before
    assert not [p for p in os.listdir(tmp_path / "root" / "a" / "b") if p.endswith(".tmp")]
    for bad in ("../x", "a/../../x", "a//b", "./a"):
        with pytest.raises(OutsideRootError):
            store.read_bytes(bad)
    with pytest.raises(OutsideRootError):
        store.remove_tree("")
    child = store.child("a")
    assert child.list_files() == {"b/file": store.stat("a/b/file")}
    assert store.contains(child) and not child.contains(store)
    assert not Store(str(tmp_path / "root2")).contains(store)  # a sibling with a common prefix
    child.remove_tree("b")
    assert store.list_files() == {}
    assert store.list_files("missing") == {}


def test_create_exclusive_is_atomic_locally(tmp_path):
    store = Store(str(tmp_path))
    wins = []
    barrier = threading.Barrier(8)

    def contend(i):
        barrier.wait()
        if store.create_exclusive("lock", str(i).encode()):
            wins.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and store.read_bytes("lock") == str(wins[0]).encode()


def test_read_only_target_is_reported(tmp_path):
    if os.geteuid() == 0:
        target = Store("/sys/airflow-savepoints-test")  # sysfs: not writable even for root
    else:
        (tmp_path / "ro").mkdir(mode=0o555)
        target = Store(str(tmp_path / "ro" / "x"))
    with pytest.raises(StoragePermissionError) as info:
        target.write_bytes_atomic("f", b"x")
    assert "writable" in info.value.hint or "read-only" in info.value.message


@pytest.mark.s3
def test_s3_and_s3a_name_the_same_objects(s3):
    via_s3a = Store(f"s3a://{s3}/sp")
    via_s3a.write_bytes_atomic("job/file", b"abc")
    via_s3 = Store(f"s3://{s3}/sp")
    assert via_s3.read_bytes("job/file") == b"abc"
    assert set(via_s3.list_files()) == {"job/file"} == set(via_s3a.list_files())
    assert via_s3a.url_of("job") == f"s3a://{s3}/sp/job" and via_s3.url_of("job") == f"s3://{s3}/sp/job"
    etag = via_s3.stat("job/file").version
    via_s3.write_bytes_atomic("job/file", b"abd")
    assert via_s3.stat("job/file").version != etag
    assert via_s3.create_exclusive("job/lock", b"1") and not via_s3a.create_exclusive("job/lock", b"2")
    assert via_s3.read_bytes("job/lock") == b"1"
    via_s3.remove_tree("job")
    assert via_s3.list_files() == {}


def test_local_listing_reads_names_and_stats_on_lookup(tmp_path):
    store = Store(str(tmp_path / "root"))
    for rel in ("offsets/0", "state/0/1/1.delta", "state/0/1/.1.delta.crc"):
        store.write_bytes_atomic(rel, b"x" * 3)
    listing = store.list_files_lazily()
    assert sorted(listing) == ["offsets/0", "state/0/1/.1.delta.crc", "state/0/1/1.delta"]
    assert listing["offsets/0"] == store.stat("offsets/0")
    os.remove(tmp_path / "root" / "state/0/1/1.delta")  # Spark purged it after the names were read
    assert "state/0/1/1.delta" in listing and listing.get("state/0/1/1.delta") is None
    with pytest.raises(KeyError):
        listing["state/0/1/1.delta"]
    assert store.list_files() == {p: store.stat(p) for p in ("offsets/0", "state/0/1/.1.delta.crc")}


def test_links_and_folders_made_in_slices_keep_each_files_answer_in_order(tmp_path, monkeypatch):
    """``make_parents`` and ``link_checked_from`` spread their system calls over threads in slices: every folder
    is made whichever thread reaches a child first, each answer stays at its pair's place (a missing source is
    None there), and an existing target in a later slice still raises."""
    from airflow_savepoints.storage.backends import local

    monkeypatch.setattr(local, "SYSCALL_THREADS", 3)
    source, target = Store(str(tmp_path / "src")), Store(str(tmp_path / "dst"))
    rels = [f"state/0/{n % 150}/deep/{n}.sst" for n in range(900)]
    source.make_parents(rels)
    for n, rel in enumerate(rels):
        source.write_bytes_atomic(rel, b"x" * n)
    missing = {rels[400], rels[899]}  # in the second and third slices
    for rel in missing:
        os.remove(source.path_of(rel))
    target.make_parents(rels)
    assert all(os.path.isdir(target.path_of(os.path.dirname(rel))) for rel in rels)
    listing = source.list_files_lazily()
    got = target.link_checked_from(source, [(rel, rel) for rel in rels], [listing.get(rel) for rel in rels])
    assert [g and g[0] for g in got] == [None if rel in missing else n for n, rel in enumerate(rels)]
    assert all(g[1] for rel, g in zip(rels, got, strict=True) if rel not in missing)  # the listed versions
    others = [(rels[n], f"other/{n}.sst") for n in range(601) if rels[n] not in missing]
    target.make_parents([rel for _, rel in others])
    with pytest.raises(FileExistsError):  # the last pair's target, in the second slice
        target.link_checked_from(source, [*others, (rels[5], rels[5])], [None] * 601)
    assert all(os.path.exists(target.path_of(rel)) for _, rel in others)  # the first slice linked its own
