"""Azure Blob Storage and ADLS Gen2 (``abfs://``, ``abfss://``, ``az://``) through adlfs.

Exclusive create is a Put Blob with ``If-None-Match: *`` (adlfs ``overwrite=False``); a copy between
two locations of one account is Copy Blob guarded by the listed ETag (``x-ms-source-if-match``),
waited for until it completes. Azure keeps an MD5 (Content-MD5) of single-put blobs, not a CRC32C:
the copy's CRC32C is read from the copy (a download, no upload). Errors are told apart by the HTTP
status azure-core gives (412: a precondition failed, 404: gone).
"""

from __future__ import annotations

import asyncio
import posixpath
from typing import IO, ClassVar

from fsspec.asyn import sync

from airflow_savepoints.errors import SourceChangedError
from airflow_savepoints.storage.backends import base
from airflow_savepoints.storage.backends.base import SERVER_COPY, STREAM, Backend, FileStat, ServerCopy
from airflow_savepoints.storage.backends.generic import ObjectStoreBackend

COPY_POLL = 0.2  # seconds between looks at a pending copy


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of the azure-core error behind ``exc``, if there is one."""
    for error in base.exception_chain(exc):
        status = getattr(error, "status_code", None)
        if isinstance(status, int):
            return status
    return None


class AzureBackend(ObjectStoreBackend):
    """Azure Blob: conditional puts and ETag-guarded copies."""

    credentials_hint: ClassVar[str] = \
        "set AZURE_STORAGE_ACCOUNT_NAME/AZURE_STORAGE_ACCOUNT_KEY or fsspec's abfs configuration"

    def error_code(self, exc: BaseException) -> str | None:
        status = http_status(exc)
        return str(status) if status else None

    def create_exclusive(self, path: str, data: bytes) -> bool:
        return self.create_if_absent(path, data, lambda: self.fs.pipe_file(path, data, overwrite=False),
                                     lambda exc: isinstance(exc, FileExistsError) or http_status(exc) in (409, 412))

    def open_read(self, path: str, block_size: int | None) -> tuple[IO[bytes], str | None]:
        return BlobReader(self.fs, path), None

    def copy_methods(self, source: Backend) -> tuple[str, ...]:
        return (SERVER_COPY, STREAM) if isinstance(source, AzureBackend) and self.same_service(source) else (STREAM,)

    def server_copy(self, source: Backend, src_path: str, path: str, *, listed: FileStat | None,
                    size: int | None) -> ServerCopy | None:
        """Copy Blob with the listed ETag as the source's precondition."""
        etag = listed.etag if listed else None
        try:
            sync(self.fs.loop, self._copy, source, src_path, path, etag)
        except Exception as exc:
            status = http_status(exc)
            if status == 412:
                raise SourceChangedError(src_path) from exc
            if status == 404 or isinstance(exc, FileNotFoundError):
                raise FileNotFoundError(src_path) from exc
            if status == 403 or isinstance(exc, PermissionError):
                return None  # these credentials may not read the source: stream instead
            raise
        finally:
            self.invalidate(posixpath.dirname(path))
        return ServerCopy(crc=None, guarded=bool(etag))

    async def _copy(self, source: Backend, src_path: str, path: str, etag: str | None) -> None:
        from azure.core import MatchConditions

        src_container, src_blob, _ = source.fs.split_path(src_path)
        container, blob, _ = self.fs.split_path(path)
        source_client = source.fs.service_client.get_blob_client(src_container, src_blob)
        target = self.fs.service_client.get_blob_client(container, blob)
        guard = {"source_etag": etag, "source_match_condition": MatchConditions.IfNotModified} if etag else {}
        status = (await target.start_copy_from_url(source_client.url, **guard)).get("copy_status")
        while status == "pending":
            await asyncio.sleep(COPY_POLL)
            status = (await target.get_blob_properties()).copy.status
        if status != "success":
            raise OSError(f"the copy of {src_path} to {path} ended {status}")


class BlobReader(base.StreamReader):
    """A blob read from one download (its chunks as they come), no properties request first."""

    def __init__(self, fs, path: str):
        super().__init__()
        self.loop, self.path = fs.loop, path
        container, blob, _ = fs.split_path(path)
        client = fs.service_client.get_blob_client(container, blob)
        try:
            self.chunks = sync(self.loop, client.download_blob, max_concurrency=1).chunks()
        except Exception as exc:
            if http_status(exc) == 404:
                raise FileNotFoundError(path) from exc
            raise

    def next_chunk(self, size: int) -> bytes:
        try:
            return sync(self.loop, self.chunks.__anext__)
        except StopAsyncIteration:
            return b""
