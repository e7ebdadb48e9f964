"""The HDFS back end without a NameNode: its URLs, and the pyarrow fallback's exclusive create and
atomic write (WebHDFS renames) where they fail. fsspec's memory store stands in for pyarrow's HDFS
client (which needs libhdfs), and fsspec's real WebHDFS client is pointed at 127.0.0.1. What needs a
NameNode (a rename refused because the name is taken, one that replaces, through hdfs-native and
through WebHDFS) is tested on a real one in tests/test_hdfs.py and tests/unit/storage/test_backends.py."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from contextlib import suppress

import fsspec
import fsspec.implementations.memory
import pytest
import requests
from fsspec.registry import _registry

from airflow_savepoints.errors import AtomicCreateUnavailableError, InvalidPathError, StorageError
from airflow_savepoints.storage import Store
from airflow_savepoints.storage.backends import backend_class
from airflow_savepoints.storage.backends.hdfs import HdfsBackend


@pytest.fixture
def root() -> Iterator[str]:
    """A folder of its own in fsspec's memory store (one store for the whole process), removed after."""
    folder = f"/hdfs-unit-{uuid.uuid4().hex}"
    yield folder
    with suppress(FileNotFoundError):
        fsspec.filesystem("memory").rm(folder, recursive=True)


def data_filesystem(**options):
    """An in-memory filesystem carrying ``options`` as pyarrow's would carry its own."""
    return fsspec.filesystem("memory", skip_instance_cache=True, **options)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hdfs_urls_get_the_hdfs_back_end():
    assert backend_class("hdfs") is HdfsBackend


def test_without_a_webhdfs_address_an_exclusive_create_is_refused_and_leaves_nothing(root):
    fs = data_filesystem(host="default")  # the NameNode from the Hadoop configuration: no HTTP address known
    backend = HdfsBackend(fs, "hdfs")
    with pytest.raises(AtomicCreateUnavailableError, match="webhdfs=") as raised:
        backend.create_exclusive(f"{root}/job/_inflight.json", b"lease")
    assert raised.value.code == "no_atomic_create" and "9870" in raised.value.hint
    assert not fs.find(root)


def test_the_webhdfs_address_comes_from_its_option_else_the_namenode_host():
    derived = HdfsBackend(data_filesystem(host="nn1", user="etl"), "hdfs").webhdfs
    assert (derived.url, derived.user) == ("http://nn1:9870/webhdfs/v1", "etl")
    given = HdfsBackend(data_filesystem(host="nn1", webhdfs={"host": "nn2", "port": 50070, "use_https": True}),
                        "hdfs").webhdfs
    assert given.url == "https://nn2:50070/webhdfs/v1"


def test_an_unreachable_namenode_fails_the_create_and_leaves_no_temporary_file(root):
    fs = data_filesystem(host="127.0.0.1", webhdfs={"host": "127.0.0.1", "port": closed_port()})
    backend = HdfsBackend(fs, "hdfs")
    with pytest.raises(requests.ConnectionError):
        backend.create_exclusive(f"{root}/job/_inflight.json", b"lease")
    assert not fs.find(root)
    fs.pipe_file(f"{root}/job/_inflight.json", b"theirs")  # taken: refused whatever the rename said
    assert backend.create_exclusive(f"{root}/job/_inflight.json", b"ours") is False
    assert fs.find(root) == [f"{root}/job/_inflight.json"] and fs.cat_file(f"{root}/job/_inflight.json") == b"theirs"


def test_an_hdfs_store_fails_with_a_clear_error_where_pyarrow_finds_no_hadoop(monkeypatch):
    from fsspec.implementations.arrow import HadoopFileSystem

    monkeypatch.setitem(_registry, "hdfs", HadoopFileSystem)  # pyarrow's client, as without hdfs-native
    with pytest.raises(StorageError) as raised:
        Store("hdfs:///sp", {"host": "127.0.0.1", "port": closed_port()}).list_files()
    assert raised.value.code == "storage_error" and "HADOOP_CONF_DIR" in raised.value.hint


def test_an_atomic_write_the_namenode_cannot_rename_keeps_the_old_file_and_no_temporary_one(root):
    fs = data_filesystem(host="127.0.0.1", webhdfs={"host": "127.0.0.1", "port": closed_port()})
    fs.pipe_file(f"{root}/job/_catalog.json", b"old")
    with pytest.raises(requests.ConnectionError):
        HdfsBackend(fs, "hdfs").write_atomic(f"{root}/job/_catalog.json", b"new")
    assert fs.find(root) == [f"{root}/job/_catalog.json"] and fs.cat_file(f"{root}/job/_catalog.json") == b"old"


@pytest.mark.parametrize(("after_scheme", "path", "options"), [
    ("namenode:8020/sp", "/sp", {"host": "namenode", "port": 8020}),
    ("nameservice1/sp/job", "/sp/job", {"host": "nameservice1"}),  # an HA nameservice: its port is the configuration's
    ("/sp", "/sp", {}),  # hdfs:///sp: the NameNode of the options or the Hadoop configuration
])
def test_the_namenode_in_an_hdfs_url_becomes_the_filesystems_host_and_port(after_scheme, path, options):
    assert HdfsBackend.location(after_scheme) == (path, options)


def test_an_hdfs_url_with_a_bad_port_is_refused():
    with pytest.raises(InvalidPathError, match="NameNode port"):
        Store("hdfs://namenode:80x/sp")


class StandIn(fsspec.implementations.memory.MemoryFileSystem):
    """fsspec's memory store registered as ``hdfs`` for one test (pyarrow's client needs a Hadoop)."""

    protocol = "hdfs"


@pytest.fixture
def hdfs_stand_in(monkeypatch) -> None:
    monkeypatch.setitem(_registry, "hdfs", StandIn)  # undone after the test


def test_a_store_at_an_hdfs_url_reaches_its_namenode_and_names_it_in_its_urls(hdfs_stand_in, root):
    store = Store(f"hdfs://namenode:8020{root}", {"user": "etl"})
    assert (store.root, store.fs.storage_options) == (root, {"host": "namenode", "port": 8020, "user": "etl"})
    assert store.child("job").url_of("_catalog.json") == f"hdfs://namenode:8020{root}/job/_catalog.json"
    store.fs.pipe_file(f"{root}/job/x", b"data")
    assert store.child("job").read_bytes("x") == b"data"  # the path on the NameNode, not "namenode:8020/..."
    explicit = Store(f"hdfs://namenode:8020{root}", {"host": "other", "port": 9000})  # given options win
    assert explicit.fs.storage_options == {"host": "other", "port": 9000} and explicit.url == f"hdfs://other:9000{root}"
    assert Store(f"hdfs://{root}").url == f"hdfs://{root}"  # hdfs:///sp stays as written
    assert Store.location_of(f"hdfs://namenode:8020{root}") == ("hdfs", root)  # how the console matches jobs
    assert Store.location_of("s3a://bucket/sp") == ("s3", "bucket/sp")
