"""storage/known_files.py and ``Store.read_known``: a file of a known name is read only if it is a
regular file within its kind's cap; anything else is a typed error naming it (issue 40, item 3)."""

from __future__ import annotations

import os

import pytest

from airflow_savepoints.errors import (
    FileTooLargeError,
    LinkedFileError,
    MalformedFileError,
    NotARegularFileError,
    SymlinkError,
)
from airflow_savepoints.storage import Store
from airflow_savepoints.storage.known_files import CAPS

DEEP = b"[" * 200000


@pytest.mark.timeout(20)  # a FIFO opened for reading without O_NONBLOCK waits here for ever
def test_a_folder_a_fifo_a_link_an_oversize_file_and_deep_json_are_typed_errors_naming_the_file(tmp_path):
    store = Store(str(tmp_path))
    (tmp_path / "ok.json").write_bytes(b'{"a": 1}')
    (tmp_path / "folder.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")  # read until memory ran out, before
    (tmp_path / "big.json").write_bytes(b" " * (CAPS["lease"] + 1))
    (tmp_path / "deep.json").write_bytes(DEEP)  # a RecursionError, before

    assert store.read_json("ok.json", "lease") == {"a": 1}
    cases = {"folder.json": (NotARegularFileError, "a folder"), "fifo.json": (NotARegularFileError, "a FIFO"),
             "zero.json": (LinkedFileError, "symbolic link"), "big.json": (FileTooLargeError, "over"),
             "deep.json": (MalformedFileError, "nests JSON deeper")}
    for name, (error, words) in cases.items():
        with pytest.raises(error, match=words) as caught:
            store.read_json(name, "lease")
        assert str(tmp_path / name) in caught.value.message and caught.value.hint
    assert isinstance(LinkedFileError("x"), SymlinkError) and LinkedFileError.code == "symlink_refused"
    with pytest.raises(FileNotFoundError):
        store.read_known("missing.json", "lease")


@pytest.mark.s3
def test_on_s3_a_key_prefix_in_place_of_a_file_and_an_oversize_object_are_refused_before_the_body_is_read(s3):
    store = Store(f"s3://{s3}/root")
    store.write_bytes_atomic("job/_lease.json/inside", b"{}")  # keys below the name, no object of the name
    store.write_bytes_atomic("big.json", b" " * (CAPS["lease"] + 1))
    store.write_bytes_atomic("deep.json", DEEP)
    store.write_bytes_atomic("ok.json", b'{"a": 1}')
    assert store.read_json("ok.json", "lease") == {"a": 1}
    with pytest.raises(NotARegularFileError, match="a folder") as caught:
        store.read_known("job/_lease.json", "lease")
    assert f"s3://{s3}/root/job/_lease.json" in caught.value.message
    with pytest.raises(FileTooLargeError, match=f"s3://{s3}/root/big.json"):
        store.read_known("big.json", "lease")
    with pytest.raises(MalformedFileError, match="deep.json"):
        store.read_json("deep.json", "lease")
    with pytest.raises(FileNotFoundError):
        store.read_known("job/missing.json", "lease")


@pytest.mark.parametrize("scheme,root", [
    pytest.param("gs", "gcs_bucket", marks=pytest.mark.gcs, id="gcs"),
    pytest.param("abfs", "azure_container", marks=pytest.mark.azure, id="azure"),
])
def test_on_gcs_and_azure_an_oversize_object_is_refused_without_downloading_it(scheme, root, request, monkeypatch):
    """Issue 40: a forged 24 MiB object where a 1 MiB lease belongs costs at most the cap + 1 bytes of download
    (GCS: a ranged read beside its metadata; Azure: the blob's size from Get Blob's answer, before its chunks),
    and is a typed error naming it; a small one and an empty one read as before, a missing one is missing."""
    from airflow_savepoints.storage.backends import azure

    store = Store(f"{scheme}://{request.getfixturevalue(root)}/root")
    store.write_bytes_atomic("big.json", b" " * (24 * 1024 * 1024))
    store.write_bytes_atomic("ok.json", b'{"a": 1}')
    store.write_bytes_atomic("empty.json", b"")
    received: list[int] = []
    if scheme == "gs":
        fs = store.backend.fs
        ranged = type(fs)._cat_file

        async def counted(self, path, *args, **kwargs):
            data = await ranged(self, path, *args, **kwargs)
            received.append(len(data))
            return data

        monkeypatch.setattr(type(fs), "_cat_file", counted)
    else:
        chunk = azure.BlobReader.next_chunk

        def counted(self, size):  # the chunks read past Get Blob's own first one
            data = chunk(self, size)
            received.append(len(data))
            return data

        monkeypatch.setattr(azure.BlobReader, "next_chunk", counted)
    assert store.read_json("ok.json", "lease") == {"a": 1}
    received.clear()
    with pytest.raises(FileTooLargeError, match=f"root/big.json is over {CAPS['lease']} bytes"):
        store.read_known("big.json", "lease")
    assert sum(received) <= CAPS["lease"] + 1, received  # before: all 24 MiB
    with pytest.raises(MalformedFileError, match="empty.json"):
        store.read_json("empty.json", "lease")
    with pytest.raises(FileNotFoundError):
        store.read_known("missing.json", "lease")
