"""Amazon S3 and S3-compatible stores (``s3://``, ``s3a://``, ``s3n://``) through s3fs.

Exclusive create is a conditional PUT (``If-None-Match: *``); a copy between two locations on one
endpoint is ``CopyObject`` guarded by the listed ETag (``CopySourceIfMatch``), asking the store for
the CRC32C of the copy. Errors are told apart by S3's error codes: s3fs turns a botocore
``ClientError`` into an ``OSError`` and keeps the original as its cause (or context).

Stores of one process share an aiobotocore session (:func:`shared_session`), so botocore's service data is
loaded once. Requests name this tool in their ``User-Agent`` (:data:`USER_AGENT`). Per request the client's CPU
is mostly botocore's; the back end sets its session's timestamp parser
(:func:`parse_timestamp`, botocore's documented ``set_parser_defaults``) to one that reads S3's two
forms without dateutil's general parser, about a tenth of the CPU of a copy or a read. An ``http://``
endpoint with no proxy before it is reached without TLS, so its client loads no CA bundle
(:func:`plain_http_endpoint`); an ``https://`` one keeps botocore's verification.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import os
import platform
import posixpath
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import IO, Any, ClassVar

import fsspec.asyn
from botocore.utils import get_environ_proxies
from botocore.utils import parse_timestamp as botocore_timestamp
from dateutil.tz import tzutc

from airflow_savepoints import __version__
from airflow_savepoints.errors import SourceChangedError
from airflow_savepoints.storage.backends.base import (
    SERVER_COPY,
    STREAM,
    Backend,
    FileStat,
    OnError,
    OnPage,
    ServerCopy,
    StreamReader,
    TooLarge,
    exception_chain,
    modified_time,
)
from airflow_savepoints.storage.backends.generic import ObjectStoreBackend

SERVER_COPY_MAX = 5 * 1024**3  # one CopyObject copies at most 5 GiB
READ_CHUNK = 1 << 20  # a read of the rest of an object takes its body this much at a time
MAX_CONNECTIONS = 256  # per client: the largest ``parallelism`` the CLI and operators accept
USER_AGENT = f"airflow-savepoints/{__version__} python/{platform.python_version()}"  # aiobotocore adds botocore/<version>

PRECONDITION_FAILED = {"PreconditionFailed", "412"}
CONFLICT = {"ConditionalRequestConflict", "409"}  # a concurrent conditional write to the same key
NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "404"}
DENIED = {"AccessDenied", "403"}
BAD_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
COPY_REFUSED = {"InvalidRequest", "EntityTooLarge", "NotImplemented"}  # e.g. over 5 GiB: stream instead


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code of the botocore ``ClientError`` behind ``exc`` (its HTTP status if it names
    none); None if no ClientError is behind it."""
    for error in exception_chain(exc):
        response = getattr(error, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            code = (response.get("Error") or {}).get("Code")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return str(code or status or "") or None
    return None


def parse_timestamp(value: Any) -> datetime:
    """botocore's ``parse_timestamp``, equal in value, with the two forms S3 sends read directly: ISO 8601
    in UTC (``2026-11-26T00:10:00.000Z``, listings and copy results) and an HTTP date (``Last-Modified``);
    dateutil's general parser, which botocore uses, takes about 150 us for each. Anything else: botocore's."""
    if isinstance(value, str):
        try:
            if value.endswith("Z") and "T" in value:
                return datetime.fromisoformat(value[:-1]).replace(tzinfo=tzutc())
            if value.endswith(" GMT"):
                return email.utils.parsedate_to_datetime(value).replace(tzinfo=tzutc())
        except (TypeError, ValueError):
            pass
    return botocore_timestamp(value)


_SESSIONS: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_SESSIONS_LOCK = threading.Lock()


def _forget_sessions() -> None:
    """In a forked child (an Airflow task's process): its own sessions, and a lock no parent's thread holds."""
    global _SESSIONS_LOCK
    _SESSIONS.clear()
    _SESSIONS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_sessions)


def shared_session(kwargs: dict[str, Any]) -> Any:
    """One aiobotocore session per process for the same session arguments (a profile) and the same ``AWS_*``
    environment (where credentials and the region are found), its responses' timestamps parsed with
    :func:`parse_timestamp`. A session loads botocore's service data once (about 60 ms of CPU): a second
    store's client then costs a few milliseconds, not a session's start. A changed environment gets its own, and so
    does a forked process (an Airflow task's): the credentials a session caches may hold a lock of its parent's loop."""
    import aiobotocore.session

    key = (repr(sorted(kwargs.items())), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
        if session is None:
            session = _SESSIONS[key] = aiobotocore.session.AioSession(**kwargs)
            _fast_timestamps(session)
        return session


def _fast_timestamps(session: Any) -> None:
    with contextlib.suppress(Exception):
        session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)


def use_shared_session(fs: Any) -> None:
    """Give ``fs`` the process's :func:`shared_session` for its arguments, or have the session its caller gave
    it parse timestamps with :func:`parse_timestamp` too. s3fs would make its own session on the first call
    (``AioSession(**fs.kwargs)``); one it makes on a refresh is botocore's as it comes."""
    if getattr(fs, "session", False) is None and isinstance(getattr(fs, "kwargs", None), dict):
        fs.session = shared_session(fs.kwargs)
    elif getattr(fs, "session", None) is not None:
        _fast_timestamps(fs.session)


def plain_http_endpoint(options: dict[str, Any]) -> bool:
    """Whether ``options`` name an ``http://`` endpoint that neither the configuration nor the environment
    puts a proxy before: no TLS is spoken to it, so its client needs no CA bundle."""
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    if not isinstance(endpoint, str) or not endpoint.lower().startswith("http://"):
        return False
    return not (options.get("config_kwargs") or {}).get("proxies") and not get_environ_proxies(endpoint)


class S3Backend(ObjectStoreBackend):
    """S3 through s3fs's ``call_s3`` where s3fs has no call for what is needed."""

    credentials_hint: ClassVar[str] = \
        "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or a profile), or fsspec's s3 configuration"

    def __init__(self, fs: Any, protocol: str):
        super().__init__(fs, protocol)
        use_shared_session(fs)

    @classmethod
    def filesystem_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """botocore keeps 10 connections per client by default, which would cap ``parallelism`` at 10
        requests in flight: the pool is sized to the largest parallelism (unless configured). Requests name
        this tool in their ``User-Agent`` (:data:`USER_AGENT`, unless configured), as S3's access logs and
        CloudTrail show it; botocore otherwise builds its own from about thirty parts twice per request,
        each sanitised character by character, a quarter of the client's CPU per copy. A client of a
        plain ``http://`` endpoint skips ``verify`` (unless configured): aiobotocore would otherwise load
        the CA bundle for each client, about 20 ms of CPU, for connections that never use it."""
        config = {"max_pool_connections": MAX_CONNECTIONS, "user_agent": USER_AGENT,
                  **(options.get("config_kwargs") or {})}
        options = {**options, "config_kwargs": config}
        if plain_http_endpoint(options):
            options["client_kwargs"] = {"verify": False, **(options.get("client_kwargs") or {})}
        return options

    def error_code(self, exc: BaseException) -> str | None:
        return s3_error_code(exc)

    def is_credentials_problem(self, exc: BaseException) -> bool:
        return self.error_code(exc) in BAD_CREDENTIALS or super().is_credentials_problem(exc)

    def read_bytes(self, path: str) -> bytes:
        return self.read_stamped(path)[0]

    def read_stamped(self, path: str) -> tuple[bytes, float | None]:
        """One ``GetObject`` (s3fs's ``cat_file`` asks for the size first, a HEAD, unless a listing told
        it: that doubles the requests for the small files the catalog and the leases read)."""
        with ObjectReader(self.fs, path) as reader:
            return reader.read(), reader.modified

    def read_capped(self, path: str, cap: int) -> tuple[bytes, float | None]:
        """One ``GetObject`` whose length is checked before its body is read (a HEAD first would double
        the requests of every lease read)."""
        with ObjectReader(self.fs, path, cap=cap) as reader:
            data = reader.read(cap + 1)
        if len(data) > cap:
            raise TooLarge(len(data))
        return data, reader.modified

    def folder_in_place(self, path: str) -> bool:
        """Keys below the missing object's name (one listing, only when it is missing)."""
        return Backend.folder_in_place(self, path)

    def open_read(self, path: str, block_size: int | None) -> tuple[IO[bytes], str | None]:
        return ObjectReader(self.fs, path), None

    def list_files(self, base: str, on_page: OnPage | None = None) -> dict[str, FileStat]:
        """One ``ListObjectsV2`` per page through s3fs's own page loop (each page's request retried), kept in no
        cache (s3fs's ``find`` would keep ~25 MiB of raw entries for 20,000 files, for the life of the filesystem
        object; reads need no size from it: :class:`ObjectReader`). ``find`` also asks again when nothing is below
        ``base`` (a HEAD and a listing of the name itself): two more round trips before an empty folder is known
        empty. ``on_page`` is told each page's files as it arrives (keys in order on S3's general purpose buckets).
        Each key's latest version, whether or not the filesystem is version-aware."""
        try:
            return fsspec.asyn.sync(self.fs.loop, self._list_in_pages, base, on_page)
        except FileNotFoundError:
            return {}

    def list_files_lazily(self, base: str, on_error: OnError, links: list[str] | None = None,
                          on_page: OnPage | None = None) -> Mapping[str, FileStat]:
        return self.list_files(base, on_page)

    async def _list_in_pages(self, base: str, on_page: OnPage | None) -> dict[str, FileStat]:
        bucket, key, _ = self.fs.split_path(self.strip(base).rstrip("/"))
        prefix = key + "/" if key else ""
        found: dict[str, FileStat] = {}
        async for page in self.fs._list_pages("list_objects_v2", Bucket=bucket, Prefix=prefix, Delimiter="",
                                              **self.fs.req_kw):
            entries = page.get("Contents", [])
            for entry in entries:  # as s3fs's own listing fills them
                entry["type"], entry["size"] = "file", entry["Size"]
                self.fs._fill_info(entry, bucket)
            files = self.files_below(base, entries)
            found.update(files)
            if on_page is not None:
                on_page(files)
        return found

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """A conditional PUT; a 412 means the key exists. A retried PUT (its first response was lost)
        also gets a 412 when the first attempt created the object: it is ours if it holds our bytes
        (callers put a unique token in them)."""
        bucket, key, _ = self.fs.split_path(path)
        return self.create_if_absent(
            path, data, lambda: self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*"),
            lambda exc: self.error_code(exc) in PRECONDITION_FAILED | CONFLICT)

    def copy_methods(self, source: Backend) -> tuple[str, ...]:
        return (SERVER_COPY, STREAM) if isinstance(source, S3Backend) and self.same_service(source) else (STREAM,)

    def server_copy(self, source: Backend, src_path: str, path: str, *, listed: FileStat | None,
                    size: int | None) -> ServerCopy | None:
        """``CopyObject`` with ``ChecksumAlgorithm=CRC32C`` (and ``CopySourceIfMatch`` = ``etag``). None
        over 5 GiB, when the store refuses the copy, or when these credentials may not read the source."""
        if size is not None and size > SERVER_COPY_MAX:
            return None
        etag = listed.etag if listed else None
        src_bucket, src_key, _ = source.fs.split_path(src_path)
        bucket, key, _ = self.fs.split_path(path)
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, "CopySource": {"Bucket": src_bucket, "Key": src_key},
                                  "ChecksumAlgorithm": "CRC32C"}
        if etag:
            params["CopySourceIfMatch"] = etag
        try:
            out = self.fs.call_s3("copy_object", **params)
        except Exception as exc:
            return self._copy_declined(exc, src_path)
        finally:
            if getattr(self.fs, "dircache", True):  # an empty listing cache has nothing to forget
                self.invalidate(posixpath.dirname(path))
        result = out.get("CopyObjectResult") or {}
        if etag and etags_comparable(etag, out) and result.get("ETag") and result["ETag"].strip('"') != etag.strip('"'):
            # a store that ignored CopySourceIfMatch copied other bytes than were listed: undo, report
            with contextlib.suppress(Exception):
                self.fs.rm_file(path)
            raise SourceChangedError(src_path)
        value = result.get("ChecksumCRC32C")
        return ServerCopy(crc=int.from_bytes(base64.b64decode(value), "big") if value else None, guarded=bool(etag))

    def _copy_declined(self, exc: Exception, src_path: str) -> None:
        """None for a copy to stream instead; raises what the caller must see."""
        code = self.error_code(exc)
        if code in PRECONDITION_FAILED:
            raise SourceChangedError(src_path) from exc
        if isinstance(exc, FileNotFoundError) or code in NOT_FOUND:
            raise FileNotFoundError(src_path) from exc
        if code in COPY_REFUSED | DENIED or isinstance(exc, PermissionError) or self.is_credentials_problem(exc):
            return None  # too big, or the target's credentials may not read the source: stream
        raise exc


class ObjectReader(StreamReader):
    """An object read from one ``GetObject`` (its body as it comes), no HEAD for its size first; a
    small object takes one trip to the event loop (the GET and its first chunk). A body cut off
    mid-way is resumed where it stopped (a ranged GET guarded by the first response's ETag), up to
    the filesystem's ``retries`` times. ``modified``: the object's time, from the first response."""

    def __init__(self, fs: Any, path: str, cap: int | None = None):
        super().__init__()
        self.cap = cap  # an object longer than this is refused (TooLarge) before its body is read
        bucket, key, version = fs.split_path(path)
        self.fs, self.offset, self.end, self.etag, self.resumes, self.body = fs, 0, None, None, 0, None
        self.modified: float | None = None
        self.request = {"Bucket": bucket, "Key": key, **({"VersionId": version} if version else {})}
        self.pending = self._resumable(self._get)

    async def _get(self) -> bytes:
        """The object from ``offset`` on, and its first chunk."""
        resume = {"Range": f"bytes={self.offset}-", "IfMatch": self.etag} if self.offset and self.etag else {}
        response = await self.fs._call_s3("get_object", **self.request, **resume)
        self.etag, self.body = self.etag or response.get("ETag"), response["Body"]
        if self.modified is None:
            self.modified = modified_time(response)
        length = response.get("ContentLength")
        self.end = None if length is None else self.offset + int(length)
        if self.cap is not None and self.end is not None and self.end > self.cap:
            self._close_body()
            raise TooLarge(self.end)
        return await self._read(READ_CHUNK if self.cap is None else min(READ_CHUNK, self.cap + 1))

    async def _read(self, size: int) -> bytes:
        chunk = await self.body.read(size)
        self.offset += len(chunk)
        return chunk

    def _resumable(self, step, *args) -> bytes:
        try:
            return fsspec.asyn.sync(self.fs.loop, step, *args)
        except TooLarge:
            raise
        except Exception:
            if self.resumes >= self.fs.retries or not self.etag:
                raise
            self.resumes += 1
            self._close_body()
            return self._resumable(self._get)

    def next_chunk(self, size: int) -> bytes:
        if self.end is not None and self.offset >= self.end:
            return b""
        return self._resumable(self._read, size if size > 0 else READ_CHUNK)

    def _close_body(self) -> None:
        if self.body is not None:
            with contextlib.suppress(Exception):
                self.body.close()

    def close(self) -> None:
        if not self.closed:
            self._close_body()
        super().close()


def etags_comparable(etag: str, copy_response: dict[str, Any]) -> bool:
    """Whether a copy's ETag must equal its source's: both the MD5 of the bytes (a single-part
    source, no KMS or customer-key encryption, which make ETags opaque)."""
    if "-" in etag.strip('"'):
        return False  # a multipart source: its ETag is not the MD5 a single-part copy gets
    encryption = str(copy_response.get("ServerSideEncryption") or "")
    return "kms" not in encryption and not copy_response.get("SSECustomerAlgorithm")
