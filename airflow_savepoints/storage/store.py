"""A directory tree on any fsspec filesystem, addressed by paths relative to its root.

Every read, write, listing and deletion of the package goes through :class:`Store`, so that URL
schemes, credentials, error messages and the "never leave the root" rule live in one place.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import posixpath
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, NoReturn

import fsspec
from fsspec.registry import known_implementations

from airflow_savepoints.errors import (
    CredentialsError,
    InvalidPathError,
    MissingBackendError,
    OutsideRootError,
    StorageError,
    StorageFullError,
    StoragePermissionError,
    UnknownSchemeError,
)

# URL scheme -> fsspec protocol. s3a/s3n name the same objects as s3 (Hadoop's names for them).
SCHEME_ALIASES = {
    "s3a": "s3",
    "s3n": "s3",
    "gs": "gcs",
    "abfss": "abfs",
    "az": "abfs",
    "local": "file",
}
OBJECT_STORES = {"s3", "gcs", "abfs", "memory"}

_memory_create_lock = threading.Lock()


@dataclass(frozen=True)
class FileStat:
    """What a listing says of one file: its size and a token that changes when it is replaced."""

    size: int
    version: str
    modified: float | None = None  # seconds since the epoch, when the store reports it
    etag: str | None = None  # the object store's ETag, when it reports one


class SourceChangedError(Exception):
    """A server-side copy found the source replaced since it was listed (its ETag changed)."""


@dataclass(frozen=True)
class ServerCopy:
    """The result of a copy inside an object store; ``crc`` is the CRC32C the store computed, if any."""

    crc: int | None


SERVER_COPY_MAX = 5 * 1024**3  # one CopyObject copies at most 5 GiB
UPLOAD_BLOCK = 8 * 1024 * 1024  # multipart upload part size: what a streamed upload holds in memory


def local_version(st: os.stat_result) -> str:
    """The version token of a local file from its stat: ``_version_token`` of fsspec's entry for it
    (inode, then mtime; written out because listings call it once per file)."""
    return f"{st.st_ino}:{st.st_mtime}"


def local_file_stat(st: os.stat_result) -> FileStat:
    """A local file's listing entry from its stat."""
    return FileStat(size=st.st_size, version=local_version(st), modified=st.st_mtime)


def split_url(url: str) -> tuple[str, str, str]:
    """Split ``url`` into (scheme as written, fsspec protocol, path for that filesystem)."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidPathError("empty path", "give an absolute path or a URL such as s3://bucket/savepoints")
    url = url.strip()
    if "://" not in url:
        if url.startswith("file:"):  # Hadoop/Spark style file:/abs/path
            return "file", "file", _absolute_local(url[len("file:") :], url)
        return "file", "file", _absolute_local(url, url)
    scheme, rest = url.split("://", 1)
    scheme_lc = scheme.lower()
    protocol = SCHEME_ALIASES.get(scheme_lc, scheme_lc)
    if protocol == "file":
        return scheme_lc, "file", _absolute_local(rest, url)
    if protocol not in known_implementations and protocol not in fsspec.available_protocols():
        raise UnknownSchemeError(
            f"unknown URL scheme '{scheme}' in '{url}'",
            "use a local path or one of file://, s3://, s3a://, gs://, abfs://, hdfs://",
        )
    path = rest.rstrip("/")
    if not path:
        raise InvalidPathError(f"'{url}' names no bucket or path", "add the bucket and a folder, e.g. s3://bucket/sp")
    return scheme_lc, protocol, path


def _absolute_local(path: str, original: str) -> str:
    if not path.startswith("/"):
        raise InvalidPathError(
            f"'{original}' is a relative path",
            "give an absolute path (for example $PWD/" + original.lstrip("./") + ") or a file:// URL",
        )
    normal = posixpath.normpath(path)
    return "/" if normal == "/" else normal.rstrip("/")


def _make_filesystem(protocol: str, storage_options: dict[str, Any] | None):
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        hint = known_implementations.get(protocol, {}).get("err") or str(exc)
        raise MissingBackendError(
            f"no fsspec backend is installed for '{protocol}://'", f"{hint}; then try again"
        ) from exc
    except ValueError as exc:
        raise UnknownSchemeError(f"unknown URL scheme '{protocol}'", str(exc)) from exc
    options = dict(storage_options or {})
    fsspec.config.apply_config(cls, options)  # fsspec's own configuration (files and FSSPEC_* variables)
    if protocol == "file":
        options.setdefault("auto_mkdir", True)
    return cls(**options)


def _is_credentials_problem(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in _exception_chain(exc)}
    texts = " ".join(str(e) for e in _exception_chain(exc))
    return bool(
        names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                 "DefaultCredentialsError", "ClientAuthenticationError"}
        or "InvalidAccessKeyId" in texts
        or "SignatureDoesNotMatch" in texts
        or "Unable to locate credentials" in texts
    )


# Libraries whose own (non-OSError) exceptions mean the store could not be reached or answered badly.
_TRANSPORT_MODULES = {"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "azure"}


def _is_transport_error(exc: BaseException) -> bool:
    return any(type(e).__module__.split(".")[0] in _TRANSPORT_MODULES for e in _exception_chain(exc))


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


class Store:
    """One directory tree (``url``) on one fsspec filesystem.

    Paths given to the methods are relative to the root, use ``/``, and may not leave the root.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *, _fs=None):
        self.scheme, self.protocol, self.root = split_url(url)
        self.storage_options = dict(storage_options or {})
        self.fs = _fs if _fs is not None else self._guarded(lambda: _make_filesystem(self.protocol, storage_options))

    # --- addressing --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.url_of("")

    def url_of(self, rel: str = "") -> str:
        """The URL of ``rel`` with the scheme the user wrote (s3a stays s3a, local stays a path)."""
        path = self.path_of(rel)
        return path if self.protocol == "file" else f"{self.scheme}://{path}"

    def spark_url_of(self, rel: str = "") -> str:
        """The URL Spark would write for ``rel`` (``file:/abs`` for local files)."""
        path = self.path_of(rel)
        return f"file:{path}" if self.protocol == "file" else f"{self.scheme}://{path}"

    def path_of(self, rel: str = "") -> str:
        rel = self._clean(rel)
        if not rel:
            return self.root
        return f"{self.root}/{rel}" if self.root != "/" else "/" + rel  # roots never end with "/"

    def child(self, rel: str) -> Store:
        """A store rooted at ``rel`` below this one, sharing the filesystem object."""
        return self._with_root(self.path_of(rel))

    def parent(self) -> Store:
        """The store rooted one folder up, sharing the filesystem object."""
        return self._with_root(posixpath.dirname(self.root) or self.root)

    @property
    def name(self) -> str:
        return posixpath.basename(self.root)

    def _with_root(self, root: str) -> Store:
        other = Store.__new__(Store)
        other.scheme, other.protocol, other.root = self.scheme, self.protocol, root
        other.storage_options, other.fs = self.storage_options, self.fs
        return other

    def contains(self, other: Store) -> bool:
        """Whether ``other`` lies at or below this store's root on the same filesystem."""
        if other.protocol != self.protocol:
            return False
        return other.root == self.root or other.root.startswith(self.root.rstrip("/") + "/")

    def relative_to_root(self, full_path: str) -> str:
        full_path = full_path.rstrip("/")
        if self.protocol != "file":
            full_path = self.fs._strip_protocol(full_path).rstrip("/")
        if full_path == self.root:
            return ""
        prefix = self.root.rstrip("/") + "/"
        if not full_path.startswith(prefix):
            raise OutsideRootError(f"'{full_path}' is outside '{self.url}'", "this is a bug; please report it")
        return full_path[len(prefix) :]

    @staticmethod
    def _clean(rel: str) -> str:
        rel = (rel or "").strip("/")
        if not rel:
            return ""
        if "//" not in rel and "/." not in "/" + rel:  # no empty part and no part starting with "."
            return rel
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise OutsideRootError(
                f"path '{rel}' is not a plain relative path", "paths may not contain '.', '..' or empty parts"
            )
        return rel

    # --- error translation -------------------------------------------------------------------------
    def _guarded(self, fn):
        with self.translate_errors():
            return fn()

    @contextlib.contextmanager
    def translate_errors(self, what: str | None = None):
        """Turn backend exceptions into :class:`StorageError` subclasses that name the location."""
        try:
            yield
        except Exception as exc:
            self._raise_translated(exc, what or self.url)

    def _raise_translated(self, exc: Exception, where: str) -> NoReturn:
        translated = self._translated(exc, where)
        if translated is None:
            raise exc
        raise translated from exc

    def _translated(self, exc: Exception, where: str) -> Exception | None:
        """The :class:`StorageError` that ``exc`` stands for at ``where``; None to raise ``exc`` as is."""
        if isinstance(exc, FileNotFoundError | StorageError):
            return None
        if isinstance(exc, PermissionError):
            if _is_credentials_problem(exc):
                return self._credentials_error(where)
            return StoragePermissionError(
                f"permission denied at '{where}': {exc}",
                "check that the location is writable (not read-only) and that your credentials allow it",
            )
        if isinstance(exc, OSError):
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return StorageFullError(f"no space left at '{where}'", "free space or choose another location")
            if exc.errno == errno.EROFS:
                return StoragePermissionError(f"'{where}' is on a read-only filesystem", "choose a writable location")
            if _is_credentials_problem(exc):
                return self._credentials_error(where)
            hint = "check the location and try again"
            if getattr(self, "protocol", None) == "hdfs":
                hint = "pyarrow's HDFS client needs JAVA_HOME, HADOOP_HOME and CLASSPATH (hadoop classpath --glob)"
            return StorageError(f"storage error at '{where}': {exc}", hint)
        if _is_credentials_problem(exc):
            return self._credentials_error(where)
        if _is_transport_error(exc):  # e.g. botocore's ConnectionClosedError once s3fs's retries are spent
            return StorageError(f"storage error at '{where}': {type(exc).__name__}: {exc}",
                                "check the store's endpoint and network, and try again")
        return None

    def _credentials_error(self, where: str) -> CredentialsError:
        hints = {
            "s3": "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or a profile), or fsspec's s3 configuration",
            "gcs": "set GOOGLE_APPLICATION_CREDENTIALS or fsspec's gcs configuration",
            "abfs": "set AZURE_STORAGE_ACCOUNT_NAME/AZURE_STORAGE_ACCOUNT_KEY or fsspec's abfs configuration",
        }
        return CredentialsError(
            f"no valid credentials for '{where}'", hints.get(self.protocol, "configure credentials for this store")
        )

    # --- reading -----------------------------------------------------------------------------------
    def _invalidate(self, rel: str = "") -> None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(self.path_of(rel))

    @property
    def is_local_disk(self) -> bool:
        """A local filesystem reached without fsspec caching or wrapping (plain ``os`` calls are safe)."""
        return self.protocol == "file" and type(self.fs).__name__ == "LocalFileSystem"

    def list_files(self, rel: str = "") -> dict[str, FileStat]:
        """Every file below ``rel`` in ONE recursive listing, keyed by path relative to ``rel``."""
        base = self.path_of(rel)
        if self.is_local_disk:
            return self.list_files_lazily(rel).present()
        self._invalidate(rel)
        with self.translate_errors(self.url_of(rel)):
            try:
                found = self.fs.find(base, detail=True, withdirs=False)
            except FileNotFoundError:
                return {}
        prefix = base.rstrip("/") + "/"
        out: dict[str, FileStat] = {}
        for path, info in found.items():
            path = path if self.protocol == "file" else self.fs._strip_protocol(path)
            if not path.startswith(prefix) or info.get("type") == "directory":
                continue
            out[path[len(prefix) :]] = _file_stat(info)
        return out

    def list_files_lazily(self, rel: str = "") -> Mapping[str, FileStat]:
        """``list_files``, but on a local disk only the names are read at once; each file is stat'ed
        the first time it is looked up (for a planner that needs the stats of some of the files)."""
        if not self.is_local_disk:
            return self.list_files(rel)
        base = self.path_of(rel)
        with self.translate_errors(self.url_of(rel)):
            return LazyLocalListing(base, _scan_local_names(base), self._raise_translated)

    def stat_files(self, paths: Iterable[str]) -> dict[str, FileStat]:
        """The listing entries of ``paths`` as they are now (a missing file is left out): one stat
        per file on a local disk (cheaper than listing every version Spark keeps), else one listing."""
        if not self.is_local_disk:
            listing = self.list_files()
            return {p: listing[p] for p in paths if p in listing}
        return LazyLocalListing(self.root, list(paths), self._raise_translated).present()

    def exists(self, rel: str = "") -> bool:
        self._invalidate(rel)
        with self.translate_errors(self.url_of(rel)):
            return self.fs.exists(self.path_of(rel))

    def isdir(self, rel: str = "") -> bool:
        self._invalidate(rel)
        with self.translate_errors(self.url_of(rel)):
            return self.fs.isdir(self.path_of(rel))

    def isfile(self, rel: str = "") -> bool:
        self._invalidate(rel)
        with self.translate_errors(self.url_of(rel)):
            return self.fs.isfile(self.path_of(rel))

    def listdir(self, rel: str = "") -> list[str]:
        """Names of the direct children of ``rel`` (files and folders); empty if it does not exist."""
        self._invalidate(rel)
        base = self.path_of(rel)
        with self.translate_errors(self.url_of(rel)):
            try:
                entries = self.fs.ls(base, detail=False)
            except FileNotFoundError:
                return []
        names = []
        for entry in entries:
            entry = entry if self.protocol == "file" else self.fs._strip_protocol(entry)
            name = posixpath.basename(entry.rstrip("/"))
            if name and entry.rstrip("/") != base.rstrip("/"):
                names.append(name)
        return sorted(set(names))

    def stat(self, rel: str) -> FileStat:
        self._invalidate(rel)
        with self.translate_errors(self.url_of(rel)):
            info = self.fs.info(self.path_of(rel))
        return _file_stat(info)

    def read_bytes(self, rel: str) -> bytes:
        with self.translate_errors(self.url_of(rel)):
            return self.fs.cat_file(self.path_of(rel))

    def open_read(self, rel: str, block_size: int | None = None) -> IO[bytes]:
        """A binary reader; its read errors are translated like every other call's."""
        with self.translate_errors(self.url_of(rel)):
            kwargs = {"block_size": block_size} if block_size and self.protocol != "file" else {}
            return _Translated(self.fs.open(self.path_of(rel), "rb", **kwargs), self, self.url_of(rel))

    # --- writing -----------------------------------------------------------------------------------
    def open_write(self, rel: str) -> IO[bytes]:
        with self.translate_errors(self.url_of(rel)):
            if self.protocol == "file":
                os.makedirs(posixpath.dirname(self.path_of(rel)), exist_ok=True)
                handle = open(self.path_of(rel), "wb")  # noqa: SIM115 - the caller closes it
            else:
                handle = self.fs.open(self.path_of(rel), "wb", block_size=UPLOAD_BLOCK)
        # an object store uploads on write and close: their errors are translated too
        return _Translated(handle, self, self.url_of(rel))

    def makedirs(self, rel: str = "") -> None:
        if self.protocol in OBJECT_STORES:
            return  # object stores have no folders
        with self.translate_errors(self.url_of(rel)):
            self.fs.makedirs(self.path_of(rel), exist_ok=True)

    def write_bytes_atomic(self, rel: str, data: bytes) -> None:
        """Write ``data`` so that readers see either nothing or the whole file."""
        target = self.path_of(rel)
        with self.translate_errors(self.url_of(rel)):
            if self.protocol in OBJECT_STORES:
                self.fs.pipe_file(target, data)  # a PUT is atomic
                return
            parent = posixpath.dirname(target)
            tmp = posixpath.join(parent, f".{posixpath.basename(target)}.{uuid.uuid4().hex}.tmp")
            if self.protocol == "file":
                os.makedirs(parent, exist_ok=True)
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, target)
            else:
                self.fs.pipe_file(tmp, data)
                self.fs.mv(tmp, target)
        self._invalidate(rel)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` holding ``data`` only if it does not exist yet. True if this call created it.

        The file is complete the moment it becomes visible: locally a temp file is written, then
        hard-linked as ``rel`` (``link`` fails if ``rel`` exists); S3 uses a conditional PUT
        (If-None-Match). Other stores fall back to check-then-write, which two processes can race;
        docs/concepts.md says so.
        """
        target = self.path_of(rel)
        with self.translate_errors(self.url_of(rel)):
            if self.protocol == "file":
                parent = posixpath.dirname(target)
                os.makedirs(parent, exist_ok=True)
                tmp = posixpath.join(parent, f".{posixpath.basename(target)}.{uuid.uuid4().hex}.tmp")
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    return False
                except OSError as exc:
                    if exc.errno not in _NO_LINK_ERRNOS:
                        raise
                    return _create_without_link(target, data)  # a filesystem without hard links
                finally:
                    os.unlink(tmp)
                return True
            if self.protocol == "s3":
                return self._s3_put_if_absent(target, data)
            with _memory_create_lock:
                if self.fs.exists(target):
                    return False
                self.fs.pipe_file(target, data)
                return True

    def _s3_put_if_absent(self, target: str, data: bytes) -> bool:
        bucket, key, _ = self.fs.split_path(target)
        try:
            self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except Exception as exc:  # s3fs wraps botocore errors; look for the 412
            text = " ".join(str(e) for e in _exception_chain(exc))
            if "PreconditionFailed" in text or "412" in text or "ConditionalRequestConflict" in text:
                # A retried PUT (its first response was lost) also gets a 412 when the first attempt
                # created the object: it is ours if it holds our bytes (callers put a unique token in them).
                try:
                    return self.fs.cat_file(target) == data
                except FileNotFoundError:
                    return False
            raise
        finally:
            self._invalidate(posixpath.dirname(target))
        return True

    # --- copying without moving the bytes -----------------------------------------------------------
    def link_from(self, other: Store, src_rel: str, rel: str, *, parent_ready: bool = False) -> FileStat | None:
        """Hard-link ``other``'s file ``src_rel`` as ``rel`` here and return the linked file's stat.

        None when no link is possible: not both local, different filesystems, or links refused. A
        missing source raises FileNotFoundError; an existing target raises FileExistsError."""
        if self.protocol != "file" or other.protocol != "file":
            return None
        source, target = other.path_of(src_rel), self.path_of(rel)
        if not parent_ready:
            with self.translate_errors(self.url_of(rel)):
                os.makedirs(posixpath.dirname(target), exist_ok=True)
        try:  # no context manager: this runs once per file of a savepoint
            os.link(source, target, follow_symlinks=False)
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            if exc.errno in _NO_LINK_ERRNOS:
                return None
            self._raise_translated(exc, self.url_of(rel))
        try:
            st = os.stat(target)
        except OSError as exc:
            self._raise_translated(exc, self.url_of(rel))
        return local_file_stat(st)

    def server_copy_from(self, other: Store, src_rel: str, rel: str, *, etag: str | None = None) -> ServerCopy | None:
        """Copy ``other``'s ``src_rel`` to ``rel`` inside the object store (S3 ``CopyObject``), asking
        it for the CRC32C of the copy; with ``etag``, only if the source still has that ETag.

        None when not possible here (not both S3 on one endpoint, over 5 GiB, refused): stream instead.
        Raises FileNotFoundError if the source is gone and SourceChangedError if its ETag changed."""
        if self.protocol != "s3" or other.protocol != "s3" or not _same_endpoint(self, other):
            return None
        src_bucket, src_key, _ = other.fs.split_path(other.path_of(src_rel))
        bucket, key, _ = self.fs.split_path(self.path_of(rel))
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, "CopySource": {"Bucket": src_bucket, "Key": src_key},
                                  "ChecksumAlgorithm": "CRC32C"}
        if etag:
            params["CopySourceIfMatch"] = etag
        try:
            out = self.fs.call_s3("copy_object", **params)
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - s3fs wraps botocore errors; decide by their text
            text = " ".join(str(e) for e in _exception_chain(exc))
            if "PreconditionFailed" in text or "(412)" in text:
                raise SourceChangedError(f"{other.url_of(src_rel)} changed since it was listed") from exc
            if "NoSuchKey" in text or "Not Found" in text:
                raise FileNotFoundError(other.url_of(src_rel)) from exc
            if "InvalidRequest" in text and "larger than" in text:  # over 5 GiB: stream it
                return None
            if _is_credentials_problem(exc) or isinstance(exc, PermissionError):
                return None  # the target's credentials may not read the source: stream instead
            with self.translate_errors(self.url_of(rel)):
                raise
        finally:
            self._invalidate(posixpath.dirname(rel))
        result = out.get("CopyObjectResult") or {}
        if etag and _etags_comparable(etag, out) and result.get("ETag") and result["ETag"].strip('"') != etag.strip('"'):
            # a store that ignored CopySourceIfMatch copied other bytes than were listed: undo, report
            with contextlib.suppress(Exception):
                self.fs.rm_file(self.path_of(rel))
            raise SourceChangedError(f"{other.url_of(src_rel)} changed since it was listed")
        value = result.get("ChecksumCRC32C")
        return ServerCopy(crc=int.from_bytes(base64.b64decode(value), "big") if value else None)

    # --- deleting ----------------------------------------------------------------------------------
    def remove_file(self, rel: str) -> None:
        target = self.path_of(rel)
        if not self._clean(rel):
            raise OutsideRootError("refusing to delete the store's root as a file", "this is a bug; please report it")
        with self.translate_errors(self.url_of(rel)):
            try:
                self.fs.rm_file(target)
            except FileNotFoundError:
                pass
        self._invalidate(posixpath.dirname(rel))

    def remove_tree(self, rel: str) -> None:
        """Delete the folder ``rel`` below the root and everything in it; a missing folder is fine."""
        if not self._clean(rel):
            raise OutsideRootError("refusing to delete a store's whole root", "name a folder below the root")
        target = self.path_of(rel)
        with self.translate_errors(self.url_of(rel)):
            try:
                self.fs.rm(target, recursive=True)
            except FileNotFoundError:
                pass
        self._invalidate(rel)


class _Translated:
    """A file object whose I/O errors become the store's :class:`StorageError` naming the file."""

    def __init__(self, handle: IO[bytes], store: Store, where: str):
        self._handle, self._store, self._where = handle, store, where

    def read(self, *args):
        with self._store.translate_errors(self._where):
            return self._handle.read(*args)

    def readinto(self, buffer):
        with self._store.translate_errors(self._where):
            return self._handle.readinto(buffer)

    def write(self, data):
        with self._store.translate_errors(self._where):
            return self._handle.write(data)

    def flush(self) -> None:
        with self._store.translate_errors(self._where):
            self._handle.flush()

    def close(self) -> None:
        with self._store.translate_errors(self._where):
            self._handle.close()

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def __enter__(self) -> _Translated:
        return self

    def __exit__(self, *exc_info) -> None:
        if exc_info[0] is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the error being raised says what went wrong
            self._handle.close()


def _create_without_link(target: str, data: bytes) -> bool:
    """O_EXCL create, then write: for local filesystems that refuse hard links (readers may see it
    empty for a moment; a lease judges an unreadable file by its mtime, so that is not fatal)."""
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return True


_NO_LINK_ERRNOS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EACCES}


def _scan_local_names(base: str) -> list[str]:
    """The files of a local tree, relative to ``base``, with one ``scandir`` per folder (no stat)."""
    out: list[str] = []
    pending = [(base, "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except FileNotFoundError:
                continue  # removed since the folder was read
            if is_dir:
                pending.append((entry.path, prefix + entry.name + "/"))
            else:
                out.append(prefix + entry.name)
    return out


class LazyLocalListing(Mapping[str, FileStat]):
    """Local file names below ``base``; a file's stat (the same entry and version token fsspec's
    ``find`` gives) is taken when first looked up. A file removed since the scan is missing; any
    other error of the stat goes to ``on_error(exc, path)`` (the store's error translation)."""

    def __init__(self, base: str, names: list[str], on_error: Callable[[OSError, str], NoReturn]):
        self._base, self._names = base.rstrip("/") or "", dict.fromkeys(names)
        self._stats: dict[str, FileStat] = {}
        self._on_error = on_error

    def __getitem__(self, rel: str) -> FileStat:
        stat = self._stats.get(rel)
        if stat is None:
            if rel not in self._names:
                raise KeyError(rel)
            path = f"{self._base}/{rel}"
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                raise KeyError(rel) from None
            except OSError as exc:
                self._on_error(exc, path)
            stat = self._stats[rel] = local_file_stat(st)
        return stat

    def present(self) -> dict[str, FileStat]:
        """Every listed file that is still there, stat'ed."""
        return {name: stat for name in self._names if (stat := self.get(name)) is not None}

    def __contains__(self, rel: object) -> bool:
        return rel in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _etags_comparable(etag: str, copy_response: dict[str, Any]) -> bool:
    """Whether a copy's ETag must equal its source's: both the MD5 of the bytes (a single-part
    source, no KMS or customer-key encryption, which make ETags opaque)."""
    if "-" in etag.strip('"'):
        return False  # a multipart source: its ETag is not the MD5 a single-part copy gets
    encryption = str(copy_response.get("ServerSideEncryption") or "")
    return "kms" not in encryption and not copy_response.get("SSECustomerAlgorithm")


def _same_endpoint(a: Store, b: Store) -> bool:
    """Whether two S3 stores reach one service with the same settings (a server-side copy can work)."""
    if a.fs is b.fs:
        return True
    return getattr(a.fs, "storage_options", None) == getattr(b.fs, "storage_options", None) and \
        getattr(a.fs, "client_kwargs", None) == getattr(b.fs, "client_kwargs", None)


def _file_stat(info: dict[str, Any]) -> FileStat:
    etag = info.get("ETag") or info.get("etag")
    return FileStat(size=int(info.get("size") or 0), version=_version_token(info), modified=_modified(info),
                    etag=str(etag) if etag else None)


def _modified(info: dict[str, Any]) -> float | None:
    """Last modification time in epoch seconds from any backend's listing entry."""
    value = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("updated")
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _version_token(info: dict[str, Any]) -> str:
    """A token that changes when a file is replaced: inode + mtime locally, ETag + mtime elsewhere."""
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation")
    mtime = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("updated")
    ino = info.get("ino")
    parts = [str(p) for p in (ino, etag, mtime) if p not in (None, "")]
    return ":".join(parts)
