"""Savepoints on Azure that record the store's CRC64 instead of reading every copy back.

Azure answers a synchronous Copy Blob From URL with ``x-ms-content-crc64``, the CRC64 of the bytes
it copied. Azurite implements the copy but not that header (Azure/Azurite#444), so here the fault
proxy in front of Azurite adds it to each successful synchronous copy, computed from the copy as
Azurite stored it (read straight from Azurite, outside the proxy's counts). Everything else is
real: Azurite's copies and ETag guards, the savepoint, the restore, and Spark continuing a query
from a savepoint of its checkpoint on Azure.

A second proxy setting answers with a wrong CRC64: the first one a store gives is checked against
the copy read back, so a wrong one is never recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import fsspec
import google_crc32c
import pytest
from azure.storage.extensions import checksums as azure_checksums

from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.core.models import MANIFEST_FILE, MANIFEST_VERSION
from airflow_savepoints.demo.app import wait_for_batch
from airflow_savepoints.errors import MissingBackendError, SavepointError, VerificationError
from tests.conftest import remove_checkpoint, settled_copy
from tests.support.emulators import azurite_blob_service, azurite_connection_string, fsspec_configured
from tests.support.fault_proxy import AzureCrc64, FaultProxy
from tests.support.spark_shapes import ALL_FILES, FIRST_FILES, SHAPES, run_to_end
from tests.support.synthetic import write_checkpoint

pytestmark = pytest.mark.azure


def crc64(data: bytes) -> int:
    return azure_checksums.crc64.compute(data, 0)


@pytest.fixture
def azure_via_proxy(azure_emulator, monkeypatch):
    """A fresh container reached through a counting proxy in front of Azurite: (container, proxy)."""
    proxy = FaultProxy(azure_emulator.url, service="azure").start()
    name = f"crc64-{id(proxy):x}"
    azurite_blob_service(azure_emulator.url).create_container(name)
    with fsspec_configured(monkeypatch, "abfs", {"connection_string": azurite_connection_string(proxy.url)}):
        yield name, proxy
    proxy.stop()


def _upload(local: Path, container: str, folder: str) -> None:
    """The checkpoint as a writer other than ours put it (another client, like Spark's)."""
    fsspec.filesystem("abfs", skip_instance_cache=True).put(f"{local}/", f"{container}/{folder}", recursive=True)


def _read_backs(proxy: FaultProxy, folder: str) -> list[str]:
    """Objects of ``folder`` that were downloaded, but its manifest (read to restore or verify)."""
    return [name for kind, _, name in proxy.request_log
            if kind == "GET" and name and f"/{folder}/" in name and not name.endswith(MANIFEST_FILE)]


def test_a_savepoint_on_azure_records_the_stores_crc64_and_reads_one_copy_back(azure_via_proxy, azure_emulator,
                                                                                tmp_path):
    container, proxy = azure_via_proxy
    proxy.add_headers = header = AzureCrc64(azure_emulator.url)
    local = write_checkpoint(tmp_path / "checkpoint", batches=3)
    _upload(local, container, "checkpoint")
    checkpoint, savepoints = f"abfs://{container}/checkpoint", f"abfs://{container}/savepoints"

    proxy.reset()
    first = take_savepoint(checkpoint, "j", savepoint_dir=savepoints)
    manifest, folder = first.manifest, first.pointer.removeprefix(f"abfs://{container}/")
    assert manifest.format_version == MANIFEST_VERSION
    assert header.answered == len(manifest.files)  # each file one synchronous copy
    for entry in manifest.files:  # the store's CRC64 of the very bytes of the checkpoint's file
        assert (entry.algorithm, entry.method, entry.checksum_source) == ("crc64", "server_copy", "store"), entry
        assert entry.checksum == format(crc64((local / entry.path).read_bytes()), "016x"), entry.path
    assert len(_read_backs(proxy, folder)) == 1  # the first CRC64 checked against its copy; the rest trusted

    proxy.reset()
    verify_savepoint(first.pointer)  # every file read and its CRC64 computed here
    assert len(_read_backs(proxy, folder)) == len(manifest.files)

    restored = tmp_path / "restored"  # to a local disk: each file's CRC64 computed as it is downloaded
    restore_savepoint(first.pointer, str(restored))
    assert {p.relative_to(restored).as_posix(): p.read_bytes() for p in restored.rglob("*") if p.is_file()} == \
        {e.path: (local / e.path).read_bytes() for e in manifest.files}
    proxy.reset()  # inside the store: the copies' CRC64s are compared with the manifest's
    restore_savepoint(first.pointer, f"abfs://{container}/restored")
    copies_read = [name for name in _read_backs(proxy, "restored") if not name.rsplit("/", 1)[-1].startswith("_")]
    assert len(copies_read) == 1  # the first CRC64 of this store checked; no other copy read back

    second = take_savepoint(checkpoint, "j", savepoint_dir=savepoints)  # nothing changed: every file reused
    assert {(e.path, e.checksum, e.algorithm, e.reused_from) for e in second.manifest.files} == \
        {(e.path, e.checksum, "crc64", manifest.savepoint_id) for e in manifest.files}
    verify_savepoint(second.pointer)


def test_a_changed_file_of_a_crc64_savepoint_fails_its_check_and_its_restore(azure_via_proxy, azure_emulator, tmp_path):
    container, proxy = azure_via_proxy
    proxy.add_headers = AzureCrc64(azure_emulator.url)
    local = write_checkpoint(tmp_path / "checkpoint", batches=3, state_bytes=64)
    _upload(local, container, "checkpoint")
    info = take_savepoint(f"abfs://{container}/checkpoint", "j", savepoint_dir=f"abfs://{container}/savepoints")
    victim = "state/0/1/2.delta"
    entry = next(e for e in info.manifest.files if e.path == victim)
    blob = azurite_blob_service(azure_emulator.url).get_blob_client(
        container, f"{info.pointer.removeprefix(f'abfs://{container}/')}/{victim}")
    blob.upload_blob(b"\x07" * entry.size, overwrite=True)  # same size, other bytes

    with pytest.raises(VerificationError, match=rf"{victim}: crc64 checksum [0-9a-f]{{16}}, the manifest says {entry.checksum}"):
        verify_savepoint(info.pointer)
    for target in (tmp_path / "restored", f"abfs://{container}/restored"):  # downloaded; copied inside the store
        with pytest.raises(VerificationError, match=victim):
            restore_savepoint(info.pointer, str(target))
    assert not [p for p in (tmp_path / "restored").rglob("*") if p.is_file()]  # nothing restored, nothing left
    assert not fsspec.filesystem("abfs", skip_instance_cache=True).find(f"{container}/restored")


def test_a_spark_checksum_file_is_checked_against_its_main_file_whose_checksum_is_a_crc64(azure_via_proxy,
                                                                                         azure_emulator, tmp_path):
    container, proxy = azure_via_proxy
    proxy.add_headers = AzureCrc64(azure_emulator.url)
    local = write_checkpoint(tmp_path / "checkpoint", batches=3, state_bytes=64)
    main = local / "state/0/1/3.delta"
    crc = google_crc32c.value(main.read_bytes())
    sidecar = {"algorithm": "CRC32C", "value": crc - (1 << 32) if crc >= 1 << 31 else crc, "mainFileSize": 64}
    (local / "state/0/1/3.delta.crc").write_text(json.dumps(sidecar))  # Spark's own checksum file
    _upload(local, container, "checkpoint")
    checkpoint, savepoints = f"abfs://{container}/checkpoint", f"abfs://{container}/savepoints"
    info = take_savepoint(checkpoint, "j", savepoint_dir=savepoints)
    entries = {e.path: e for e in info.manifest.files}
    assert entries["state/0/1/3.delta"].algorithm == "crc64" and "state/0/1/3.delta.crc" in entries

    sidecar["value"] += 1  # Spark's checksum no longer matches the file
    fsspec.filesystem("abfs", skip_instance_cache=True).pipe_file(
        f"{container}/checkpoint/state/0/1/3.delta.crc", json.dumps(sidecar).encode())
    with pytest.raises(SavepointError, match="does not match its Spark checksum file"):
        take_savepoint(checkpoint, "k", savepoint_dir=savepoints)


def test_a_wrong_crc64_from_the_store_is_never_recorded(azure_via_proxy, azure_emulator, tmp_path, caplog):
    container, proxy = azure_via_proxy
    proxy.add_headers = AzureCrc64(azure_emulator.url, wrong=True)
    local = write_checkpoint(tmp_path / "checkpoint", batches=3)
    _upload(local, container, "checkpoint")
    info = take_savepoint(f"abfs://{container}/checkpoint", "j", savepoint_dir=f"abfs://{container}/savepoints")
    assert info.manifest.format_version == 1  # every file CRC32C, as an earlier release reads it
    for entry in info.manifest.files:  # each copy read back for its CRC32C
        assert (entry.algorithm, entry.checksum_source) == ("crc32c", "read"), entry
        assert entry.checksum == format(google_crc32c.value((local / entry.path).read_bytes()), "08x"), entry.path
    assert "is not that of its bytes" in caplog.text
    verify_savepoint(info.pointer)
    raw = json.loads(fsspec.filesystem("abfs", skip_instance_cache=True).cat(
        f"{info.pointer.removeprefix('abfs://')}/{MANIFEST_FILE}"))
    assert not [f for f in raw["files"] if "checksum_algorithm" in f]  # written as before


def test_without_azure_storage_extensions_copies_are_read_back_and_a_crc64_savepoint_names_the_extra(
        azure_via_proxy, azure_emulator, tmp_path, monkeypatch):
    container, proxy = azure_via_proxy
    proxy.add_headers = AzureCrc64(azure_emulator.url)
    local = write_checkpoint(tmp_path / "checkpoint", batches=3)
    _upload(local, container, "checkpoint")
    checkpoint, savepoints = f"abfs://{container}/checkpoint", f"abfs://{container}/savepoints"
    with_crc64 = take_savepoint(checkpoint, "j", savepoint_dir=savepoints)
    monkeypatch.setitem(sys.modules, "azure.storage.extensions", None)  # as without the [azure] extra: no CRC64 here

    without = take_savepoint(checkpoint, "k", savepoint_dir=savepoints)  # another job: nothing to reuse
    assert {(e.algorithm, e.checksum_source) for e in without.manifest.files} == {("crc32c", "read")}
    with pytest.raises(MissingBackendError, match="Azure CRC64") as refused:
        verify_savepoint(with_crc64.pointer)
    assert "pip install 'airflow-savepoints[azure]'" in refused.value.hint
    with pytest.raises(MissingBackendError):
        restore_savepoint(with_crc64.pointer, str(tmp_path / "restored"))
    assert not [p for p in (tmp_path / "restored").rglob("*") if p.is_file()]


@pytest.mark.slow
def test_a_query_continues_from_a_crc64_savepoint_of_its_checkpoint_on_azure(spark, references, azure_via_proxy,
                                                                              azure_emulator, tmp_path):
    container, proxy = azure_via_proxy
    proxy.add_headers = AzureCrc64(azure_emulator.url)
    name = "transform_with_state"  # RocksDB state, and operator metadata whose paths the restore rewrites (checked)
    shape, inputs, checkpoint, sink = SHAPES[name], tmp_path / "input", tmp_path / "checkpoint", tmp_path / "sink"
    shape.write_input(inputs, 0, FIRST_FILES)
    query = shape.start(spark, inputs, str(checkpoint), sink)
    wait_for_batch(query, 2)
    query.stop()
    # where Spark on Azure would have written it; its temp files left out (the session's state maintenance
    # may still write and rename them in the stopped query's checkpoint)
    _upload(settled_copy(checkpoint, tmp_path / "settled"), container, "checkpoint")
    info = take_savepoint(f"abfs://{container}/checkpoint", name, savepoint_dir=f"abfs://{container}/savepoints")
    assert {(e.algorithm, e.checksum_source) for e in info.manifest.files} == {("crc64", "store")}
    remove_checkpoint(checkpoint)

    shape.write_input(inputs, FIRST_FILES, ALL_FILES)
    restored = tmp_path / "restored"
    restore_savepoint(info.pointer, str(restored))  # every file's CRC64 checked as it is downloaded
    query = shape.start(spark, inputs, str(restored), tmp_path / "restored-sink")
    run_to_end(query)
    query.stop()
    n, first, again = info.manifest.batch_id, shape.read_sink(sink), shape.read_sink(tmp_path / "restored-sink")
    assert min(again) == n + 1
    assert {b: rows for b, rows in first.items() if b <= n} | again == references(name)
