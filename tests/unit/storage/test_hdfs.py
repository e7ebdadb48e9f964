"""The HDFS back end without a NameNode: its URLs, the storage options it refuses before anything
is reached, and a NameNode address that never answers a connection. hdfs-native's client reaches the
NameNode only when first used (and the store's probe leaves an unknown host to it), so a store is made
here without one; what needs a NameNode (renames, listings, the lease, no hdfs-native installed) is
tested on a real one in tests/test_hdfs.py and tests/unit/storage/test_backends.py."""

from __future__ import annotations

import socket
import time

import pytest

from airflow_savepoints.errors import InvalidInputError, InvalidPathError, StorageUnreachableError
from airflow_savepoints.storage import Store
from airflow_savepoints.storage.backends import backend_class
from airflow_savepoints.storage.backends.hdfs import HdfsBackend
from tests.conftest import require_part
from tests.support.hdfs import missing_hdfs_native

require_part("hdfs", missing_hdfs_native())


def test_hdfs_urls_get_the_hdfs_back_end():
    assert backend_class("hdfs") is HdfsBackend


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


def test_a_store_at_an_hdfs_url_names_its_namenode_in_its_options_and_urls():
    store = Store("hdfs://namenode:8020/sp", {"user": "etl"})
    assert type(store.fs).__module__ == "hdfs_native.fsspec" and store.root == "/sp"
    assert {k: store.fs.storage_options[k] for k in ("host", "port", "user")} == {"host": "namenode", "port": 8020, "user": "etl"}
    assert store.child("job").url_of("_catalog.json") == "hdfs://namenode:8020/sp/job/_catalog.json"
    explicit = Store("hdfs://namenode:8020/sp", {"host": "other", "port": 9000})  # given options win
    assert (explicit.fs.host, explicit.fs.port, explicit.url) == ("other", 9000, "hdfs://other:9000/sp")
    assert Store.location_of("hdfs://namenode:8020/sp") == ("hdfs", "/sp")  # how the console matches jobs
    assert Store.location_of("s3a://bucket/sp") == ("s3", "bucket/sp")


@pytest.mark.parametrize(("options", "named"), [
    ({"webhdfs": {"host": "namenode", "port": 9870}}, "'webhdfs' is not supported"),  # pyarrow's WebHDFS address (removed)
    ({"dfs.replication": 2}, "'dfs.replication' is not a string"),  # hdfs-native takes Hadoop configuration: strings
])
def test_an_hdfs_storage_option_hdfs_native_cannot_take_is_refused_naming_it(options, named):
    with pytest.raises(InvalidInputError, match=named) as raised:
        Store("hdfs://namenode:8020/sp", options)
    assert raised.value.code == "invalid_input" and raised.value.hint


def test_a_namenode_address_that_drops_connections_fails_within_the_connect_timeout(tmp_path, monkeypatch):
    """A listening socket whose backlog is full drops every new SYN, as a firewall does: hdfs-native 0.14.7
    alone waits for ever there (no connect timeout). The store fails within ipc.client.connect.timeout,
    from the storage options or else from the Hadoop configuration files."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):  # fills the backlog: never accepted
            started = time.monotonic()
            with pytest.raises(StorageUnreachableError, match=f"NameNode at hdfs://127.0.0.1:{port}") as raised:
                Store(f"hdfs://127.0.0.1:{port}/sp", {"ipc.client.connect.timeout": "300"})
            assert raised.value.code == "storage_unreachable" and "ipc.client.connect.timeout" in raised.value.hint
            (tmp_path / "core-site.xml").write_text("<configuration><property><name>ipc.client.connect.timeout</name>"
                                                    "<value>300</value></property></configuration>")
            monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
            with pytest.raises(StorageUnreachableError, match="within 0.3 s"):
                Store(f"hdfs://127.0.0.1:{port}/sp")
            assert time.monotonic() - started < 5


def test_an_hdfs_url_without_a_namenode_anywhere_is_refused_naming_the_fixes(tmp_path, monkeypatch):
    """``hdfs:///sp`` with no fs.defaultFS in the options or the Hadoop configuration: a typed error, not
    hdfs-native's bare RuntimeError; with fs.defaultFS in core-site.xml the URL is taken."""
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    with pytest.raises(InvalidPathError, match="names no NameNode") as raised:
        Store("hdfs:///sp")
    assert raised.value.code == "invalid_path" and "HADOOP_CONF_DIR" in raised.value.hint
    (tmp_path / "core-site.xml").write_text("<configuration><property><name>fs.defaultFS</name>"
                                            "<value>hdfs://127.0.0.1:1</value></property></configuration>")
    assert Store("hdfs:///sp").url == "hdfs:///sp"
