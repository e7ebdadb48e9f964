"""The back end contract (storage/backends), kept by each back end on its real store: a local disk,
moto's S3 server, fake-gcs-server, Azurite, a NameNode and DataNode (HDFS, through hdfs-native) on
127.0.0.1, and fsspec's memory store (the generic object-store back end)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial

import google_crc32c
import pytest

from airflow_savepoints.core.copier import checksum_of
from airflow_savepoints.errors import CredentialsError, SourceChangedError, StoragePermissionError
from airflow_savepoints.storage import LINK, SERVER_COPY, STREAM, Store
from airflow_savepoints.storage.backends import backend_class, known_backends, register_backend
from airflow_savepoints.storage.backends.azure import AzureBackend
from airflow_savepoints.storage.backends.base import exception_chain
from airflow_savepoints.storage.backends.gcs import GCSBackend
from airflow_savepoints.storage.backends.generic import FsspecBackend, ObjectStoreBackend
from airflow_savepoints.storage.backends.local import LocalBackend
from airflow_savepoints.storage.backends.s3 import SERVER_COPY_MAX, S3Backend, parse_timestamp, s3_error_code

S3, GCS, AZURE = (pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs),
                  pytest.param("azure", marks=pytest.mark.azure))
HDFS = pytest.param("hdfs", marks=pytest.mark.hdfs)
KINDS = ["local", S3, GCS, AZURE, HDFS, "memory"]
EMULATED = {"s3": ("s3://{}/root", "s3"), "gcs": ("gs://{}/root", "gcs_bucket"),
            "azure": ("abfs://{}/root", "azure_container"), "hdfs": ("{}/root", "hdfs_root")}


@pytest.fixture(params=KINDS)
def store(request, tmp_path) -> Iterator[Store]:
    """An empty folder on one kind of store (moto, fake-gcs-server and Azurite on 127.0.0.1)."""
    if request.param == "local":
        yield Store(str(tmp_path / "root"))
    elif request.param in EMULATED:
        url, bucket = EMULATED[request.param]
        yield Store(url.format(request.getfixturevalue(bucket)))
    else:
        memory = Store(f"memory://unit-{time.monotonic_ns()}/root")
        yield memory
        with suppress(FileNotFoundError):
            memory.fs.rm(memory.root, recursive=True)


def test_each_kind_of_store_gets_its_own_back_end():
    assert backend_class("file") is LocalBackend and backend_class("s3") is S3Backend
    assert backend_class("gcs") is GCSBackend and backend_class("abfs") is AzureBackend
    assert backend_class("memory") is ObjectStoreBackend
    assert backend_class("ftp") is FsspecBackend  # not listed: the generic one, with folders
    assert isinstance(Store("s3a://bucket/x").backend, S3Backend)


def test_a_file_waited_on_is_read_often_only_where_a_read_costs_no_request():
    """A stop request and its answer are polled: 0.1 s on a local disk or HDFS, never more often than every
    0.5 s where each read is a billed request (a job's driver reads its stop request all day long)."""
    assert Store("/tmp/x").poll_interval == 0.1 and backend_class("hdfs").poll_interval == 0.1
    for protocol in ("s3", "gcs", "abfs", "memory", "ftp"):
        assert backend_class(protocol).poll_interval >= 0.5, protocol


def test_a_protocol_cannot_be_taken_over_by_accident():
    with pytest.raises(ValueError, match="already served"):
        register_backend("s3", LocalBackend)
    register_backend("s3", S3Backend)  # the same class again: fine
    assert known_backends["s3"].endswith("s3.S3Backend")


def test_an_atomic_write_is_seen_whole_and_leaves_no_temporary_file(store):
    store.write_bytes_atomic("a/b/file", b"first")
    first = store.stat("a/b/file")
    store.write_bytes_atomic("a/b/file", b"second!")
    assert store.read_bytes("a/b/file") == b"second!"
    assert list(store.list_files()) == ["a/b/file"]  # no temporary file beside it
    assert store.stat("a/b/file").size == 7 and first.size == 5


def test_exclusive_create_between_racers_has_exactly_one_winner(store):
    def contend(i: int, name: str, barrier: threading.Barrier, wins: list[int]) -> None:
        barrier.wait()
        if store.create_exclusive(name, f"racer {i}".encode()):
            wins.append(i)

    for round_ in range(3):
        wins: list[int] = []
        barrier = threading.Barrier(6)
        threads = [threading.Thread(target=contend, args=(i, f"lease-{round_}", barrier, wins)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1, wins
        assert store.read_bytes(f"lease-{round_}") == f"racer {wins[0]}".encode()


@pytest.mark.s3
def test_s3_exclusive_create_is_a_conditional_put_and_a_retried_one_recognises_its_own_bytes(s3):
    store = Store(f"s3://{s3}/root")
    assert store.create_exclusive("lease", b"token-1")
    assert store.create_exclusive("lease", b"token-1")  # its first response was lost: the object is ours
    assert not store.create_exclusive("lease", b"token-2")
    assert store.read_bytes("lease") == b"token-1"


@pytest.mark.s3
def test_s3_listing_tells_each_page_as_it_arrives_in_key_order(s3, tmp_path):
    """``on_page`` is told each ``ListObjectsV2`` page (1,000 keys) as it comes, paths relative to the listed
    folder, in key order; together the pages are the listing. A local disk lists at once and never calls it."""
    store = Store(f"s3://{s3}/paged")
    store.fs.pipe({f"{s3}/paged/f/{i:04d}": b"x" for i in range(1001)})
    pages: list[dict] = []
    listing = store.list_files_lazily(on_page=lambda page: pages.append(dict(page)))
    assert [len(page) for page in pages] == [1000, 1]
    assert list(pages[0]) == sorted(pages[0]) and max(pages[0]) < min(pages[1]) == "f/1000"
    assert {path: stat for page in pages for path, stat in page.items()} == dict(listing) == store.list_files()
    (tmp_path / "a").write_bytes(b"x")
    assert dict(Store(str(tmp_path)).list_files_lazily(on_page=pages.append)).keys() == {"a"} and len(pages) == 2


@pytest.mark.s3
def test_a_version_aware_s3_store_lists_each_files_latest_version_once(s3):
    """In a versioned bucket, a version-aware filesystem's listing gives a file written twice once, its latest
    version, exactly as a plain filesystem's listing does."""
    plain = Store(f"s3://{s3}/versioned", {"skip_instance_cache": True})
    plain.fs.call_s3("put_bucket_versioning", Bucket=s3, VersioningConfiguration={"Status": "Enabled"})
    plain.write_bytes_atomic("f", b"first")
    plain.write_bytes_atomic("f", b"second, longer")
    plain.write_bytes_atomic("g/h", b"x")
    aware = Store(f"s3://{s3}/versioned", {"skip_instance_cache": True, "version_aware": True})
    listed = aware.list_files_lazily(on_page=lambda page: None)
    assert sorted(listed) == ["f", "g/h"] and listed["f"].size == len(b"second, longer")
    assert dict(listed) == plain.list_files()


@pytest.mark.parametrize("store", [GCS, AZURE], indirect=True)
def test_gcs_and_azure_copy_inside_the_store_only(store, tmp_path):
    assert store.copy_methods(store.child("x")) == (SERVER_COPY, STREAM)
    assert store.copy_methods(Store(str(tmp_path))) == (STREAM,) == Store(str(tmp_path)).copy_methods(store)


@pytest.mark.s3
def test_copy_methods_are_ordered_cheapest_first_and_end_with_a_stream(s3, tmp_path):
    local, other_disk = Store(str(tmp_path / "a")), Store(str(tmp_path / "b"))
    bucket, memory = Store(f"s3://{s3}/a"), Store("memory://unit/a")
    elsewhere = Store(f"s3://{s3}/b", {"client_kwargs": {"region_name": "eu-west-3"}})  # other settings
    assert local.copy_methods(other_disk) == (LINK, STREAM)
    assert bucket.copy_methods(bucket.child("x")) == (SERVER_COPY, STREAM)
    for target, source in ((bucket, local), (local, bucket), (memory, memory), (bucket, elsewhere)):
        assert target.copy_methods(source) == (STREAM,)
    assert local.link_from(bucket, "f", "f") is None and bucket.server_copy_from(local, "f", "f") is None


@pytest.mark.parametrize("value", ["2026-11-26T00:10:00.000Z", "2026-11-26T00:10:00Z", "2026-11-26T23:59:59.123456789Z",
                                   "Thu, 26 Nov 2026 00:10:00 GMT", "2026-11-26T00:10:00+01:00", "1700000000.5", 1700000000,
                                   "Thu, 31 Nov 2026 00:10:00 GMT"])
def test_s3_timestamps_read_as_botocore_reads_them(value):
    from botocore.utils import parse_timestamp as botocore_timestamp

    try:
        expected = botocore_timestamp(value)
    except ValueError:
        with pytest.raises(ValueError):
            parse_timestamp(value)
        return
    parsed = parse_timestamp(value)
    assert parsed == expected and parsed.utcoffset() == expected.utcoffset()


@pytest.mark.s3
def test_s3_responses_use_the_fast_timestamp_parser_and_give_the_same_times(s3):
    store = Store(f"s3://{s3}/stamps")
    store.write_bytes_atomic("a", b"x")
    factory = store.backend.fs.session.get_component("response_parser_factory")
    assert factory.create_parser("rest-xml")._timestamp_parser is parse_timestamp
    listed, (_, read) = store.list_files()["a"].modified, store.read_stamped("a")
    assert abs(listed - read) < 1 and abs(listed - time.time()) < 600  # the listing's milliseconds, the header's seconds


@pytest.mark.s3
def test_s3_stores_share_one_session_until_the_aws_environment_changes(s3, monkeypatch):
    """A second store's client is made from the first one's session (botocore's service data loaded once); a
    changed AWS_* environment (other credentials) gets a session of its own, which finds them."""
    first, second = (Store(f"s3://{s3}/shared", {"skip_instance_cache": True}) for _ in range(2))
    first.write_bytes_atomic("a", b"x")
    assert second.backend.fs is not first.backend.fs and second.backend.fs.session is first.backend.fs.session
    assert second.read_bytes("a") == b"x"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")
    other = Store(f"s3://{s3}/three", {"skip_instance_cache": True})
    assert other.backend.fs.session is not first.backend.fs.session
    assert asyncio.run(other.backend.fs.session.get_credentials()).access_key == "someone-else"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a forked process (an Airflow task's) makes its own: the parent's may hold its loop's locks
        forked = Store(f"s3://{s3}/three", {"skip_instance_cache": True}).backend.fs.session
        os.write(write_end, b"own" if forked is not other.backend.fs.session else b"parent's")
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    assert os.read(read_end, 16) == b"own"


@pytest.mark.s3
def test_s3_requests_name_this_tool_in_their_user_agent_unless_one_is_configured(s3, s3_endpoint):
    """Seen in S3's access logs and CloudTrail; botocore's own is built from about thirty parts per request. The
    proxy notes each request's User-Agent (its hook for response headers, adding none)."""
    from airflow_savepoints import __version__
    from tests.support.fault_proxy import FaultProxy

    seen: list[str] = []
    proxy = FaultProxy(s3_endpoint).start()
    proxy.add_headers = lambda method, target, headers, status: seen.append(headers.get("User-Agent", "")) or {}
    try:
        ours = Store(f"s3://{s3}/ua", {"endpoint_url": proxy.url, "skip_instance_cache": True})
        ours.write_bytes_atomic("a", b"x")
        assert ours.read_bytes("a") == b"x"
        assert seen and all(agent.startswith(f"airflow-savepoints/{__version__} python/") for agent in seen), seen
        seen.clear()
        theirs = {"endpoint_url": proxy.url, "skip_instance_cache": True, "config_kwargs": {"user_agent": "my-platform/2"}}
        assert Store(f"s3://{s3}/ua", theirs).read_bytes("a") == b"x"
        assert seen and all(agent.startswith("my-platform/2") for agent in seen), seen
    finally:
        proxy.stop()


@pytest.mark.hdfs
def test_hdfs_has_no_server_side_copy_its_files_stream(hdfs_root):
    """HDFS has no copy operation: a savepoint on the same NameNode streams through the DataNodes."""
    store = Store(f"{hdfs_root}/sp")
    store.write_bytes_atomic("f", b"bytes")
    assert store.copy_methods(store.child("x")) == (STREAM,) == store.copy_methods(Store(f"{hdfs_root}/ckpt"))
    assert store.server_copy_from(store, "f", "g") is None and store.link_from(store, "f", "g") is None
    assert not store.exists("g")


@pytest.mark.hdfs
def test_hdfs_creates_exclusively_with_the_namenodes_rename_and_leaves_no_temporary_file(hdfs_root):
    store = Store(hdfs_root)
    assert type(store.fs).__module__ == "hdfs_native.fsspec" and store.url == hdfs_root
    assert store.create_exclusive("job/_lease.json", b"first")
    assert not store.create_exclusive("job/_lease.json", b"second")  # rename2 without OVERWRITE: refused
    assert store.create_exclusive("job/_lease.json", b"first") is False  # the file exists: taken, whoever wrote it
    store.write_bytes_atomic("job/_lease.json", b"renewed")  # rename2 with OVERWRITE
    assert store.read_bytes("job/_lease.json") == b"renewed" and list(store.list_files()) == ["job/_lease.json"]
    data, modified = store.read_stamped("job/_lease.json")
    assert data == b"renewed" and abs(modified - time.time()) < 60  # the NameNode's clock, in seconds


def test_a_local_link_is_an_independent_copy_of_the_bytes(tmp_path):
    source, target = Store(str(tmp_path / "ckpt")), Store(str(tmp_path / "sp"))
    source.write_bytes_atomic("state/1.delta", b"planned")
    linked = target.link_from(source, "state/1.delta", "state/1.delta")
    assert linked == target.stat("state/1.delta") and linked.size == 7
    source.write_bytes_atomic("state/1.delta", b"rewritten by Spark")  # a new file renamed over the name
    assert target.read_bytes("state/1.delta") == b"planned"
    with pytest.raises(FileExistsError):
        target.link_from(source, "state/1.delta", "state/1.delta")
    with pytest.raises(FileNotFoundError):
        target.link_from(source, "state/gone", "state/gone")


def test_a_local_read_pins_the_file_it_opened(tmp_path):
    store = Store(str(tmp_path))
    store.write_bytes_atomic("f", b"old bytes")
    listed = store.stat("f")
    reader = store.open_read("f")
    store.write_bytes_atomic("f", b"new bytes")  # replaced while being read
    with reader:
        assert reader.read() == b"old bytes"
    assert reader.version == listed.version != store.stat("f").version


@pytest.mark.s3
def test_an_object_store_read_pins_no_version(s3):
    store = Store(f"s3://{s3}/root")
    store.write_bytes_atomic("f", b"bytes")
    with store.open_read("f") as reader:
        assert reader.read() == b"bytes"
    assert reader.version is None  # a replacement mid-read could mix two objects: list it again after


def test_checksums_are_crc32c_of_the_bytes(store):
    data = bytes(range(256)) * 5000  # more than one read chunk
    store.write_bytes_atomic("f", data)
    assert checksum_of(store, "f") == (len(data), google_crc32c.value(data))


def test_a_reader_gives_the_bytes_in_the_pieces_asked_for_and_a_missing_file_is_not_found(store):
    data = bytes(range(256)) * 40_000  # 10 MB: more than one download chunk on Azure
    store.write_bytes_atomic("big", data)
    with store.open_read("big") as reader:
        pieces = [reader.read(3), reader.read(1 << 20)]
        pieces.append(reader.read())
    assert [len(p) for p in pieces[:2]] == [3, 1 << 20] and b"".join(pieces) == data
    assert store.read_stamped("big")[0] == data
    with pytest.raises(FileNotFoundError):
        store.open_read("missing").read()
    with pytest.raises(FileNotFoundError):
        store.read_stamped("missing")


@pytest.mark.parametrize("store", [S3, GCS, AZURE], indirect=True)
def test_a_server_copy_is_guarded_and_gives_the_stores_crc32c_where_it_keeps_one(store):
    data = b"state" * 1000
    store.write_bytes_atomic("ckpt/f", data)
    listed = store.list_files("ckpt")["f"]
    copied = store.server_copy_from(store.child("ckpt"), "f", "sp/f", listed=listed)
    assert copied is not None and copied.guarded and store.read_bytes("sp/f") == data
    assert copied.crc == (None if store.protocol == "abfs" else google_crc32c.value(data))  # Azure keeps MD5s


@pytest.mark.parametrize("store", [S3, GCS, AZURE], indirect=True)
def test_a_server_copy_detects_a_source_rewritten_since_it_was_listed(store):
    store.write_bytes_atomic("ckpt/f", b"as listed")
    listed = store.stat("ckpt/f")
    store.write_bytes_atomic("ckpt/f", b"rewritten")
    with pytest.raises(SourceChangedError, match="ckpt/f"):
        store.server_copy_from(store, "ckpt/f", "sp/f", listed=listed)
    assert not store.exists("sp/f")  # nothing of the other bytes is left behind


@pytest.mark.s3
def test_s3_server_copy_declines_what_it_cannot_copy_and_reports_a_missing_source(s3):
    store = Store(f"s3://{s3}/root")
    store.write_bytes_atomic("f", b"x")
    assert store.server_copy_from(store, "f", "g", size=SERVER_COPY_MAX + 1) is None  # over 5 GiB: stream
    with pytest.raises(FileNotFoundError, match="gone"):
        store.server_copy_from(store, "gone", "g")


def test_a_file_added_after_a_listing_is_listed_and_read_the_next_time(store):
    """A long-lived process (scheduler, triggerer) lists a checkpoint again after Spark added a batch."""
    store.write_bytes_atomic("offsets/1", b"1")
    assert list(store.list_files()) == ["offsets/1"]
    writer = Store(store.url, _fs=store.fs.__class__(**store.fs.storage_options, skip_instance_cache=True)) \
        if not store.is_local else store  # another process's filesystem object: our cache knows nothing of it
    writer.write_bytes_atomic("offsets/2", b"2")
    assert sorted(store.list_files()) == ["offsets/1", "offsets/2"]
    assert store.read_bytes("offsets/2") == b"2" and store.stat("offsets/2").size == 1


def test_a_listing_of_folders_only_leaves_files_out(store):
    store.write_bytes_atomic("orders/savepoint-a/_metadata", b"{}")
    store.write_bytes_atomic("payments/x", b"1")
    store.write_bytes_atomic("README.md", b"not a job")
    assert store.listdir() == ["README.md", "orders", "payments"]
    assert store.listdir(folders_only=True) == ["orders", "payments"]
    assert store.listdir("missing", folders_only=True) == []


@pytest.mark.parametrize("store", ["local", S3, GCS, AZURE, HDFS], indirect=True)
def test_version_tokens_change_when_a_file_is_replaced(store):  # fsspec's memory store keeps no versions
    store.write_bytes_atomic("f", b"one")
    before = store.list_files()["f"]
    assert store.stat("f") == before
    store.write_bytes_atomic("f", b"two")
    assert store.list_files()["f"].version != before.version


@pytest.mark.s3
def test_s3_errors_are_told_apart_by_their_codes(s3):
    store = Store(f"s3://{s3}/root")
    store.create_exclusive("lease", b"1")
    bucket, key, _ = store.fs.split_path(store.path_of("lease"))
    with pytest.raises(FileExistsError) as info:  # s3fs's translation keeps botocore's error behind it
        store.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"2", IfNoneMatch="*")
    assert s3_error_code(info.value) == "PreconditionFailed"
    with pytest.raises(FileNotFoundError) as info:
        store.fs.call_s3("get_object", Bucket=bucket, Key="missing")
    assert s3_error_code(info.value) == "NoSuchKey" and s3_error_code(ValueError("NoSuchKey")) is None


@contextmanager
def moto_checking_credentials(endpoint: str):
    """moto's server checking every request's credentials; yields the keys of a user with no policy."""
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
    user = f"nobody-{time.monotonic_ns()}"
    iam.create_user(UserName=user)
    keys = iam.create_access_key(UserName=user)["AccessKey"]

    def reset_auth(count: bytes) -> None:
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count, method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()

    reset_auth(b"0")
    try:
        yield keys["AccessKeyId"], keys["SecretAccessKey"]
    finally:
        reset_auth(b"inf")


@pytest.mark.s3
def test_s3_bad_credentials_and_refused_access_become_their_own_errors(s3, s3_endpoint):
    def store(key: str, secret: str) -> Store:
        return Store(f"s3://{s3}/root", {"key": key, "secret": secret, "skip_instance_cache": True})

    with moto_checking_credentials(s3_endpoint) as (key, secret):
        cases = [(store("AKIAUNKNOWNKEY000000", "x"), CredentialsError, "InvalidAccessKeyId"),
                 (store(key, "wrong secret"), CredentialsError, "SignatureDoesNotMatch"),
                 (store(key, secret), StoragePermissionError, "AccessDenied")]  # a user with no policy
        for target, error, code in cases:
            for attempt in (partial(target.write_bytes_atomic, "f", b"1"), partial(target.create_exclusive, "l", b"1"),
                            target.list_files):
                with pytest.raises(error) as info:
                    attempt()
                assert s3_error_code(info.value) == code and info.value.hint
        refused = store(key, secret)
        assert refused.server_copy_from(refused, "f", "g") is None  # may not read the source: stream instead



@pytest.mark.s3
def test_an_s3_client_keeps_a_connection_for_every_file_copied_at_once(s3, s3_endpoint):
    """botocore's default pool (10 connections) would cap ``parallelism`` at 10 requests in flight."""
    import fsspec

    from airflow_savepoints.storage.backends.s3 import MAX_CONNECTIONS

    store = Store(f"s3://{s3}", {"endpoint_url": s3_endpoint, "skip_instance_cache": True})
    store.list_files()  # the client is made
    assert store.fs.s3.meta.config.max_pool_connections == MAX_CONNECTIONS >= 256
    own = Store(f"s3://{s3}", {"endpoint_url": s3_endpoint, "skip_instance_cache": True,
                               "config_kwargs": {"max_pool_connections": 12, "connect_timeout": 7}})
    own.list_files()
    assert (own.fs.s3.meta.config.max_pool_connections, own.fs.s3.meta.config.connect_timeout) == (12, 7)
    fsspec.config.conf["s3"]["config_kwargs"] = {"connect_timeout": 9}  # fsspec's configuration, under ours
    configured = Store(f"s3://{s3}", {"skip_instance_cache": True})
    configured.list_files()
    assert (configured.fs.s3.meta.config.max_pool_connections, configured.fs.s3.meta.config.connect_timeout) == \
        (MAX_CONNECTIONS, 9)


@pytest.mark.s3
def test_an_http_s3_endpoint_loads_no_ca_bundle(s3, s3_endpoint, monkeypatch, tmp_path):
    """Without TLS the client skips the CA bundle: a bundle that does not exist would fail every
    request of a client that loads it (as one through a proxy still does)."""
    monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "no-such-bundle.pem"))
    given = Store(f"s3://{s3}/root", {"endpoint_url": s3_endpoint, "skip_instance_cache": True})
    given.write_bytes_atomic("f", b"1")
    configured = Store(f"s3://{s3}/root", {"skip_instance_cache": True})  # the endpoint from fsspec's configuration
    assert configured.read_bytes("f") == b"1"
    proxied = Store(f"s3://{s3}/root", {"endpoint_url": s3_endpoint, "skip_instance_cache": True,
                                        "config_kwargs": {"proxies": {"http": s3_endpoint}, "retries": {"max_attempts": 1}}})
    proxied.fs.retries = 1  # s3fs's own retries of the failure: one attempt is enough here
    with pytest.raises(Exception, match="no-such-bundle|No such file"):
        proxied.read_bytes("f")
    monkeypatch.setenv("HTTP_PROXY", "https://proxy.example:3128")  # TLS to the proxy: verified
    for endpoint in (s3_endpoint, "https://s3.example"):
        assert "verify" not in S3Backend.filesystem_options({"endpoint_url": endpoint}).get("client_kwargs", {})


@pytest.fixture(scope="module")
def self_signed_https(tmp_path_factory) -> Iterator[tuple[str, str, list[str]]]:
    """An HTTPS server on 127.0.0.1 with a self-signed certificate, answering every request with S3's
    404: (its URL, the certificate's file, the paths it was asked for)."""
    import datetime
    import http.server
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    asked: list[str] = []

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(self.path)
            body = b"<Error><Code>NoSuchKey</Code><Message>none</Message></Error>"
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", str(cert_file), asked
    server.shutdown()


def test_an_https_s3_endpoint_is_still_verified(self_signed_https):
    """An ``https://`` endpoint keeps botocore's verification: a certificate no CA vouches for is
    refused before any request is sent; trusted (``verify`` = its file), the same server answers."""
    url, cert_file, asked = self_signed_https
    options = {"endpoint_url": url, "key": "k", "secret": "s", "skip_instance_cache": True,
               "config_kwargs": {"retries": {"max_attempts": 1}}}
    untrusted = Store("s3://bucket/root", options)
    untrusted.fs.retries = 1  # s3fs's own retries of the failure: one attempt is enough here
    with pytest.raises(Exception) as refused:
        untrusted.read_bytes("f")
    assert "CERTIFICATE_VERIFY_FAILED" in " ".join(map(str, exception_chain(refused.value))) and asked == []
    trusted = Store("s3://bucket/root", {**options, "client_kwargs": {"verify": cert_file}})
    with pytest.raises(FileNotFoundError):
        trusted.read_bytes("f")
    assert asked == ["/bucket/root/f"]


@pytest.mark.s3
def test_an_s3_read_is_one_get_resumed_where_a_cut_off_body_stopped_and_a_listing_is_not_kept(s3, s3_endpoint):
    """No HEAD for the size (a listing no longer leaves it cached); a body cut off half-way is
    resumed with a ranged GET guarded by the ETag (the proxy cuts the first response)."""
    from tests.support.fault_proxy import FaultProxy, Rule

    data = bytes(range(256)) * 20_000  # 5 MB
    Store(f"s3://{s3}/root").write_bytes_atomic("big", data)
    proxy = FaultProxy(s3_endpoint).start()
    try:
        store = Store(f"s3://{s3}/root", {"endpoint_url": proxy.url, "skip_instance_cache": True})
        assert set(store.list_files()) == {"big"}
        assert not [key for key in store.fs.dircache if str(key).startswith(s3)]  # 20,000 raw entries stay nowhere
        proxy.set_rules(Rule(action="drop", methods={"GET"}, path="/root/big", times=1))
        with store.open_read("big") as reader:
            assert reader.read() == data
    finally:
        proxy.stop()
    reads = [(method, outcome) for method, target, outcome in proxy.log if "/root/big" in target]
    assert reads == [("GET", "drop"), ("GET", 206)], reads
