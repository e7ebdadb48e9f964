"""Google Cloud Storage (``gs://``, ``gcs://``) through gcsfs.

Exclusive create is an upload with ``ifGenerationMatch=0``; a copy between two locations of one
service is ``rewriteTo`` guarded by the listed generation (``ifSourceGenerationMatch``), and its
result carries the CRC32C GCS keeps for every object, so no byte passes through the worker. A
listing carries each object's generation and CRC32C. gcsfs raises ``FileExistsError`` for a 412
(a precondition failed) and ``FileNotFoundError`` for a 404.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import posixpath
from typing import Any, ClassVar

from fsspec.asyn import sync

from airflow_savepoints.errors import SourceChangedError
from airflow_savepoints.storage.backends.base import SERVER_COPY, STREAM, Backend, FileStat, ServerCopy, TooLarge
from airflow_savepoints.storage.backends.generic import ObjectStoreBackend

REWRITE = "b/{}/o/{}/rewriteTo/b/{}/o/{}"


def gcs_crc32c(value: Any) -> int | None:
    """GCS's ``crc32c`` (base64 of the big-endian value) as an int."""
    return int.from_bytes(base64.b64decode(value), "big") if value else None


class GCSBackend(ObjectStoreBackend):
    """GCS: conditional uploads and rewrites by generation, CRC32C from the store."""

    credentials_hint: ClassVar[str] = "set GOOGLE_APPLICATION_CREDENTIALS or fsspec's gcs configuration"

    def file_stat(self, info: dict[str, Any]) -> FileStat:
        stat = super().file_stat(info)
        generation = info.get("generation")
        return dataclasses.replace(stat, generation=str(generation) if generation else None,
                                   crc32c=gcs_crc32c(info.get("crc32c")))

    def read_stamped(self, path: str) -> tuple[bytes, float | None]:
        """The object's bytes and its metadata's time, asked for together (one round trip, two requests):
        a download tells the time only to the second (Last-Modified), while the store's clock
        (``lease.store_now``) is read from the metadata, to the microsecond; gcsfs's ``info`` would also
        list the name as a folder beside it."""
        data, info = self._with_metadata(path)
        for answer in (data, info):
            if isinstance(answer, BaseException):
                raise answer
        return data, self.file_stat(info).modified

    def _with_metadata(self, path: str, end: int | None = None) -> list[Any]:
        """``[bytes (up to end), metadata]`` of ``path``, asked for at once; each an exception if it failed."""

        async def both() -> list[Any]:
            download = self.fs._cat_file(path, start=0, end=end) if end is not None else self.fs._cat_file(path)
            return await asyncio.gather(download, self.fs._get_object(path), return_exceptions=True)

        return sync(self.fs.loop, both)

    def read_capped(self, path: str, cap: int) -> tuple[bytes, float | None]:
        """As ``read_stamped`` (the same two requests at once), the download a range of at most ``cap`` + 1
        bytes: a forged object of any size costs no more than that; over ``cap`` by its metadata, ``TooLarge``."""
        data, info = self._with_metadata(path, end=cap + 1)
        if isinstance(info, BaseException):
            raise info
        size = int(info.get("size") or 0)
        if size > cap:
            raise TooLarge(size)
        if isinstance(data, BaseException):
            if size == 0:  # an empty object has no range to read
                return b"", self.file_stat(info).modified
            raise data
        if len(data) > cap:  # replaced since
            raise TooLarge(len(data))
        return data, self.file_stat(info).modified

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """An upload with ``ifGenerationMatch=0`` (gcsfs ``mode="create"``; one request up to 50 MiB)."""
        return self.create_if_absent(path, data, lambda: self.fs.pipe_file(path, data, mode="create"),
                                     lambda exc: isinstance(exc, FileExistsError))

    def copy_methods(self, source: Backend) -> tuple[str, ...]:
        return (SERVER_COPY, STREAM) if isinstance(source, GCSBackend) and self.same_service(source) else (STREAM,)

    def server_copy(self, source: Backend, src_path: str, path: str, *, listed: FileStat | None,
                    size: int | None) -> ServerCopy | None:
        """``rewriteTo`` (repeated with its token until done), with ``ifSourceGenerationMatch`` = the
        listed generation; a copy whose CRC32C differs from the listed one is undone and reported."""
        src_bucket, src_key, _ = source.fs.split_path(src_path)
        bucket, key, _ = self.fs.split_path(path)
        guard = {"ifSourceGenerationMatch": listed.generation} if listed and listed.generation else {}
        try:
            out = self._rewrite(src_bucket, src_key, bucket, key, guard)
        except FileExistsError as exc:  # gcsfs's name for a 412: the source is another generation now
            raise SourceChangedError(src_path) from exc
        except PermissionError:
            return None  # these credentials may not read the source: stream instead
        finally:
            self.invalidate(posixpath.dirname(path))
        crc = gcs_crc32c((out.get("resource") or {}).get("crc32c"))
        if listed and listed.crc32c is not None and crc is not None and crc != listed.crc32c:
            with contextlib.suppress(Exception):  # a store that ignored the precondition copied other bytes
                self.fs.rm_file(path)
            raise SourceChangedError(src_path)
        return ServerCopy(crc=crc, guarded=bool(guard))

    def _rewrite(self, src_bucket: str, src_key: str, bucket: str, key: str, guard: dict[str, str]) -> dict:
        out = self.fs.call("POST", REWRITE, src_bucket, src_key, bucket, key, json_out=True,
                           headers={"Content-Type": "application/json"}, **guard)
        while not out.get("done", True):
            out = self.fs.call("POST", REWRITE, src_bucket, src_key, bucket, key, json_out=True,
                               headers={"Content-Type": "application/json"}, rewriteToken=out["rewriteToken"],
                               **guard)
        return out
