"""Azure Blob Storage and ADLS Gen2 (``abfs://``, ``abfss://``, ``az://``) through adlfs.

Exclusive create is a Put Blob with ``If-None-Match: *`` (adlfs ``overwrite=False``). A copy between
two locations of one account is guarded by the listed ETag (``x-ms-source-if-match``):

* up to 256 MiB, a synchronous Copy Blob From URL, the source authorized by a short read-only SAS
  (shared-key credentials), the client's own SAS, or its OAuth token. Azure answers with the CRC64
  of the bytes it copied (``x-ms-content-crc64``), which the savepoint records instead of reading
  the copy back. The first CRC64 of a store is checked against the copy read back (Microsoft's
  ``azure-storage-extensions`` computes it); one that does not match is never trusted again.
* otherwise (larger, no way to authorize the source, or the service refuses the synchronous copy):
  Copy Blob, waited for until it completes, and the copy is read back for its CRC32C.

Azure keeps no CRC32C, and an MD5 (Content-MD5) only of blobs put in one request, which Spark's
ABFS writes are not. Errors are told apart by the HTTP status azure-core gives (412: a precondition
failed, 404: gone).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import logging
import posixpath
import threading
from datetime import UTC, datetime, timedelta
from typing import IO, Any, ClassVar

from fsspec.asyn import sync

from airflow_savepoints.errors import SourceChangedError
from airflow_savepoints.storage.backends import base
from airflow_savepoints.storage.backends.base import SERVER_COPY, STREAM, Backend, FileStat, ServerCopy, TooLarge
from airflow_savepoints.storage.backends.generic import ObjectStoreBackend

COPY_POLL = 0.2  # seconds between looks at a pending copy
SYNC_COPY_LIMIT = 256 * 1024 * 1024  # Copy Blob From URL copies sources up to this size
SOURCE_SAS_LIFETIME = timedelta(hours=1)
TOKEN_SCOPE = "https://storage.azure.com/.default"
SYNC_COPY_REFUSED = (400, 403, 501)  # not allowed or not implemented (an emulator): copy asynchronously
NO_ACCOUNT = "Must provide either a connection_string or account_name"  # adlfs's ValueError: no account, no credentials
log = logging.getLogger(__name__)


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

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sync_copy = True  # until the service refuses it
        self.crc64_trusted: bool | None = None  # None: no CRC64 from this store checked yet
        self._trust_lock = threading.Lock()

    def is_credentials_problem(self, exc: BaseException) -> bool:
        return super().is_credentials_problem(exc) or any(
            isinstance(e, ValueError) and NO_ACCOUNT in str(e) for e in base.exception_chain(exc))

    def error_code(self, exc: BaseException) -> str | None:
        status = http_status(exc)
        return str(status) if status else None

    def create_exclusive(self, path: str, data: bytes) -> bool:
        return self.create_if_absent(path, data, lambda: self.fs.pipe_file(path, data, overwrite=False),
                                     lambda exc: isinstance(exc, FileExistsError) or http_status(exc) in (409, 412))

    def list_files(self, base: str) -> dict[str, FileStat]:
        """One List Blobs by prefix per page. adlfs's ``find`` first asks whether ``base`` is a blob itself
        (Get Blob Properties: one more round trip before every listing, of the checkpoint, a job folder, a
        savepoint) and asks again when nothing is below it; neither answer changes what is below ``base``."""
        container, blobs, _ = self.fs.split_path(self.strip(base).strip("/") + "/")

        async def listing() -> list[dict[str, Any]]:
            async with self.fs.service_client.get_container_client(container=container) as client:
                return await self.fs._details([b async for b in client.list_blobs(include=["metadata"],
                                                                                  name_starts_with=blobs)])

        try:
            return self.files_below(base, sync(self.fs.loop, listing))
        except Exception as exc:
            if http_status(exc) == 404:  # no such container: nothing below base
                return {}
            raise

    def read_stamped(self, path: str) -> tuple[bytes, float | None]:
        """One Get Blob: its bytes and its ``Last-Modified`` (the time Get Blob Properties, a second request,
        would give); a lease or lock held by another is read this way."""
        with BlobReader(self.fs, path) as reader:
            return reader.read(), reader.modified

    def read_capped(self, path: str, cap: int) -> tuple[bytes, float | None]:
        """One Get Blob whose size (in its answer) is checked before any chunk past the first is read."""
        with BlobReader(self.fs, path) as reader:
            if reader.size is not None and reader.size > cap:
                raise TooLarge(reader.size)
            data = reader.read(cap + 1)
            if len(data) > cap:  # replaced since
                raise TooLarge(len(data))
            return data, reader.modified

    def open_read(self, path: str, block_size: int | None) -> tuple[IO[bytes], str | None]:
        return BlobReader(self.fs, path), None

    def copy_methods(self, source: Backend) -> tuple[str, ...]:
        return (SERVER_COPY, STREAM) if isinstance(source, AzureBackend) and self.same_service(source) else (STREAM,)

    def server_copy(self, source: Backend, src_path: str, path: str, *, listed: FileStat | None,
                    size: int | None) -> ServerCopy | None:
        """Copy Blob (From URL, synchronously, when it can) with the listed ETag as the source's precondition."""
        etag = listed.etag if listed else None
        try:
            crc64 = sync(self.fs.loop, self._copy, source, src_path, path, etag, size)
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
        return ServerCopy(crc=None, guarded=bool(etag), crc64=self._checked_crc64(crc64, path))

    def _checked_crc64(self, crc64: int | None, path: str) -> int | None:
        """``crc64`` if CRC64s from this store can be trusted: the first is compared with the copy read back."""
        if crc64 is None or self.crc64_trusted is False:
            return None
        if self.crc64_trusted:
            return crc64
        try:
            from azure.storage.extensions import checksums
        except ImportError:
            return None  # cannot be checked, nor restores of it verified: read the copy back instead
        with self._trust_lock:  # one copy is checked; the others wait for its verdict
            if self.crc64_trusted is None:
                value = 0
                with BlobReader(self.fs, path) as reader:
                    while chunk := reader.read(1024 * 1024):
                        value = checksums.crc64.compute(chunk, value)
                self.crc64_trusted = value == crc64
                if not self.crc64_trusted:
                    log.warning("the store's CRC64 of %s (%016x) is not that of its bytes (%016x): reading copies back "
                                "instead", path, crc64, value)
        return crc64 if self.crc64_trusted else None

    async def _copy(self, source: Backend, src_path: str, path: str, etag: str | None, size: int | None) -> int | None:
        """Copy ``src_path`` to ``path``; the CRC64 Azure gives for a synchronous copy, if it gave one."""
        from azure.core import MatchConditions

        src_container, src_blob, _ = source.fs.split_path(src_path)
        container, blob, _ = self.fs.split_path(path)
        source_client = source.fs.service_client.get_blob_client(src_container, src_blob)
        target = self.fs.service_client.get_blob_client(container, blob)
        guard = {"source_etag": etag, "source_match_condition": MatchConditions.IfNotModified} if etag else {}
        authorized = await _authorized_source(source_client) if self.sync_copy and size is not None \
            and size <= SYNC_COPY_LIMIT else None
        if authorized is not None:
            url, extra = authorized
            answered: dict[str, str | None] = {}  # azure-core's response headers are case-insensitive
            try:
                answer = await target.start_copy_from_url(
                    url, requires_sync=True,
                    raw_response_hook=lambda r: answered.update(crc64=r.http_response.headers.get("x-ms-content-crc64")),
                    **extra, **guard)
            except Exception as exc:
                if http_status(exc) not in SYNC_COPY_REFUSED:
                    raise
                log.info("synchronous copies refused by %s (%s): copying asynchronously", self.fs.account_name, exc)
                self.sync_copy = False
            else:
                if answer.get("copy_status") == "success":
                    value = answered.get("crc64")
                    return int.from_bytes(base64.b64decode(value), "little") if value else None
                await self._wait(target, src_path, path, answer.get("copy_status"))
                return None
        status = (await target.start_copy_from_url(source_client.url, **guard)).get("copy_status")
        await self._wait(target, src_path, path, status)
        return None

    @staticmethod
    async def _wait(target, src_path: str, path: str, status: str | None) -> None:
        while status == "pending":
            await asyncio.sleep(COPY_POLL)
            status = (await target.get_blob_properties()).copy.status
        if status != "success":
            raise OSError(f"the copy of {src_path} to {path} ended {status}")


async def _authorized_source(client) -> tuple[str, dict[str, str]] | None:
    """The source blob's URL and what authorizes Azure to read it for a synchronous copy: a read-only
    SAS signed with the account key, the client's own SAS (already in its URL), or its OAuth token."""
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    credential = client.credential
    key = getattr(credential, "account_key", None)
    if key:
        sas = generate_blob_sas(client.account_name, client.container_name, client.blob_name, account_key=key,
                                permission=BlobSasPermissions(read=True), expiry=datetime.now(UTC) + SOURCE_SAS_LIFETIME)
        return f"{client.url}?{sas}", {}
    if "sig=" in client.url:
        return client.url, {}
    if hasattr(credential, "get_token"):
        token = credential.get_token(TOKEN_SCOPE)
        token = await token if inspect.isawaitable(token) else token
        return client.url, {"source_authorization": f"Bearer {token.token}"}
    return None


class BlobReader(base.StreamReader):
    """A blob read from one download (its chunks as they come), no properties request first;
    ``modified``: the blob's time, from the download's answer."""

    def __init__(self, fs, path: str):
        super().__init__()
        self.loop, self.path = fs.loop, path
        container, blob, _ = fs.split_path(path)
        client = fs.service_client.get_blob_client(container, blob)
        try:
            download = sync(self.loop, client.download_blob, max_concurrency=1)
        except Exception as exc:
            if http_status(exc) == 404:
                raise FileNotFoundError(path) from exc
            raise
        self.modified = base.modified_time({"last_modified": download.properties.last_modified})
        self.size: int | None = download.properties.size  # the blob's, before its body is read
        self.chunks = download.chunks()

    def next_chunk(self, size: int) -> bytes:
        try:
            return sync(self.loop, self.chunks.__anext__)
        except StopAsyncIteration:
            return b""
