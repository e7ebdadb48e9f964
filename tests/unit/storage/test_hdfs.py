"""The HDFS back end's exclusive create without a Hadoop cluster (this machine has none): fsspec's
memory store stands in for pyarrow's HDFS client, and fsspec's real WebHDFS client is pointed at
127.0.0.1. What needs a NameNode (a rename refused because the name is taken) is not tested here."""

from __future__ import annotations

import socket

import fsspec
import pytest
import requests

from airflow_savepoints.errors import StorageError
from airflow_savepoints.storage import Store
from airflow_savepoints.storage.backends import backend_class
from airflow_savepoints.storage.backends.hdfs import AtomicCreateUnavailableError, HdfsBackend


def data_filesystem(**options):
    """A fresh in-memory filesystem carrying ``options`` as pyarrow's would carry its own."""
    return fsspec.filesystem("memory", skip_instance_cache=True, **options)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hdfs_urls_get_the_hdfs_back_end():
    assert backend_class("hdfs") is HdfsBackend


def test_without_a_webhdfs_address_an_exclusive_create_is_refused_and_leaves_nothing():
    fs = data_filesystem(host="default")  # the NameNode from the Hadoop configuration: no HTTP address known
    backend = HdfsBackend(fs, "hdfs")
    with pytest.raises(AtomicCreateUnavailableError, match="webhdfs=") as raised:
        backend.create_exclusive("/sp/job/_inflight.json", b"lease")
    assert raised.value.code == "no_atomic_create" and "9870" in raised.value.hint
    assert not fs.find("/sp")


def test_the_webhdfs_address_comes_from_its_option_else_the_namenode_host():
    derived = HdfsBackend(data_filesystem(host="nn1", user="etl"), "hdfs").webhdfs
    assert (derived.url, derived.user) == ("http://nn1:9870/webhdfs/v1", "etl")
    given = HdfsBackend(data_filesystem(host="nn1", webhdfs={"host": "nn2", "port": 50070, "use_https": True}),
                        "hdfs").webhdfs
    assert given.url == "https://nn2:50070/webhdfs/v1"


def test_an_unreachable_namenode_fails_the_create_and_leaves_no_temporary_file():
    fs = data_filesystem(host="127.0.0.1", webhdfs={"host": "127.0.0.1", "port": closed_port()})
    backend = HdfsBackend(fs, "hdfs")
    with pytest.raises(requests.ConnectionError):
        backend.create_exclusive("/sp/job/_inflight.json", b"lease")
    assert not fs.find("/sp")
    fs.pipe_file("/sp/job/_inflight.json", b"theirs")  # taken: refused whatever the rename said
    assert backend.create_exclusive("/sp/job/_inflight.json", b"ours") is False
    assert fs.find("/sp") == ["/sp/job/_inflight.json"] and fs.cat_file("/sp/job/_inflight.json") == b"theirs"


def test_an_hdfs_store_fails_with_a_clear_error_where_pyarrow_finds_no_hadoop():
    with pytest.raises(StorageError) as raised:
        Store("hdfs:///sp", {"host": "127.0.0.1", "port": closed_port()}).list_files()
    assert raised.value.code == "storage_error" and "HADOOP_HOME" in raised.value.hint
