"""The contract of a storage back end, with fsspec's generic way of keeping it.

A :class:`Backend` does what one kind of store does natively, on full filesystem paths: listing with
version tokens, atomic writes, exclusive create, links, server-side copies, the store's own
checksums, and telling its errors apart. :class:`~airflow_savepoints.storage.store.Store` adds the
root guard, URLs and error translation around every call. Like fsspec's ``AbstractFileSystem``,
this class holds the behaviour every back end shares; a back end overrides what its store does
better (``local.py``, ``s3.py``) and ``generic.py`` keeps the rest on plain fsspec calls.
"""

from __future__ import annotations

import contextlib
import errno
import io
import posixpath
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, ClassVar, NoReturn

import fsspec

# How a file can reach a store, cheapest first (``Backend.copy_methods``); the copier names them too.
LINK, SERVER_COPY, STREAM = "link", "server_copy", "stream"

UPLOAD_BLOCK = 8 * 1024 * 1024  # multipart upload part size: what a streamed upload holds in memory

# Exception classes (by name, their libraries being optional) that mean missing or refused credentials.
CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                     "DefaultCredentialsError", "ClientAuthenticationError"}
# Nothing answered at the address: refused, no route to the host or its network.
UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN}
# Libraries whose own (non-OSError) exceptions mean the store could not be reached or answered badly.
TRANSPORT_MODULES = {"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "azure"}

OnError = Callable[[OSError, str], NoReturn]
OnPage = Callable[[Mapping[str, "FileStat"]], object]  # told each page of a listing, as it arrives


class WrongKind(Exception):  # noqa: N818 - a signal to the Store, which raises the typed error
    """``read_capped`` found no regular file at the path: its ``args[0]`` says what is there."""


class TooLarge(Exception):  # noqa: N818
    """``read_capped`` found a file over the cap: its ``args[0]`` is the size seen (at least cap + 1)."""


@dataclass(frozen=True)
class FileStat:
    """What a listing says of one file: its size and a token that changes when it is replaced."""

    size: int
    version: str
    modified: float | None = None  # seconds since the epoch, when the store reports it
    etag: str | None = None  # the object store's ETag, when it reports one
    generation: str | None = None  # the object's generation, on stores that number them (GCS)
    crc32c: int | None = None  # the CRC32C the store keeps for the file, where it keeps one (GCS)


@dataclass(frozen=True)
class ServerCopy:
    """The result of a copy inside an object store; ``crc`` is the CRC32C the store computed, if any,
    ``crc64`` its CRC64 (Azure's synchronous copy); ``guarded``: the copy was of exactly the listed
    version of the source (its ETag or generation)."""

    crc: int | None
    guarded: bool = False
    crc64: int | None = None

    def checksum(self, algorithm: str) -> int | None:
        """The store's checksum of the copy by ``algorithm`` ("crc32c" or "crc64"), if it gave one."""
        return {"crc32c": self.crc, "crc64": self.crc64}.get(algorithm)


class Backend:
    """One kind of store reached through one fsspec filesystem ``fs``. Paths are the filesystem's own
    (no scheme); every method may raise the filesystem's exceptions, which the Store translates."""

    local: ClassVar[bool] = False  # files on this machine's disks (work is CPU-bound, links possible)
    has_folders: ClassVar[bool] = True  # False for object stores: a folder exists only through its files
    # Seconds between two reads of a file someone waits on (a stop request, its answer): each is a request,
    # billed on object stores; a local or HDFS read costs a system call or a NameNode RPC, so it is read more often.
    poll_interval: ClassVar[float] = 0.5
    credentials_hint: ClassVar[str] = "configure credentials for this store"
    error_hint: ClassVar[str] = "check the location and try again"

    def __init__(self, fs: Any, protocol: str):
        self.fs, self.protocol = fs, protocol

    @classmethod
    def filesystem_class(cls, protocol: str) -> type:
        """The fsspec filesystem class the store is made with: fsspec's for ``protocol`` (an ImportError
        names what to install)."""
        return fsspec.get_filesystem_class(protocol)

    @classmethod
    def filesystem_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The options the fsspec filesystem is made with (a back end may add its own defaults)."""
        return options

    @classmethod
    def location(cls, path: str) -> tuple[str, dict[str, Any]]:
        """The filesystem path of a URL's ``path`` (what follows ``scheme://``), and the options its
        authority stands for, where the store puts a server there rather than a bucket."""
        return path, {}

    # --- addressing --------------------------------------------------------------------------------
    def url(self, scheme: str, path: str) -> str:
        """The URL of ``path`` as the user wrote its scheme."""
        return f"{scheme}://{path}"

    def spark_url(self, scheme: str, path: str) -> str:
        """The URL Spark writes for ``path``."""
        return self.url(scheme, path)

    def strip(self, path: str) -> str:
        """A path the filesystem returned, without its protocol."""
        return self.fs._strip_protocol(path)

    def real_path(self, path: str) -> str:
        """``path`` with every symbolic link in it resolved (stores without links: itself)."""
        return path

    @property
    def is_local_disk(self) -> bool:
        """A local filesystem reached without fsspec caching or wrapping (plain ``os`` calls are safe)."""
        return False

    # --- reading -----------------------------------------------------------------------------------
    def invalidate(self, path: str) -> None:
        """Forget what the filesystem cached of ``path`` (and of its parents' listings)."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def invalidate_tree(self, path: str) -> None:
        """``invalidate``, and forget the cached listings of every folder below ``path`` too: a recursive
        listing fills them (s3fs) and never replaces one it has, so a file added since would be missing
        from them, and a read of it that looks there would fail."""
        self.invalidate(path)
        cache = getattr(self.fs, "dircache", None)
        if not cache:
            return
        prefix = self.strip(path).rstrip("/") + "/"
        with contextlib.suppress(Exception):
            for key in [k for k in list(cache) if isinstance(k, str) and k.startswith(prefix)]:
                cache.pop(key, None)

    def file_stat(self, info: dict[str, Any]) -> FileStat:
        """A listing entry from the filesystem's ``info`` dict (its version token: see ``version_token``)."""
        etag = info.get("ETag") or info.get("etag")
        return FileStat(size=int(info.get("size") or 0), version=version_token(info), modified=modified_time(info),
                        etag=str(etag) if etag else None)

    def list_files(self, base: str) -> dict[str, FileStat]:
        """Every file below ``base`` in ONE recursive listing, keyed by path relative to ``base``."""
        self.invalidate_tree(base)
        try:
            found = self.fs.find(base, detail=True, withdirs=False)
        except FileNotFoundError:
            return {}
        return self.files_below(base, found.values())

    def files_below(self, base: str, infos: Iterable[dict[str, Any]]) -> dict[str, FileStat]:
        """The files among the listing entries ``infos`` (the filesystem's ``info`` dicts) that lie below
        ``base``, keyed by path relative to ``base``."""
        prefix = self.strip(base).rstrip("/") + "/"  # as the filesystem writes it (memory: a leading /)
        out: dict[str, FileStat] = {}
        for info in infos:
            path = self.strip(info["name"])
            if path.startswith(prefix) and info.get("type") != "directory":
                out[path[len(prefix):]] = self.file_stat(info)
        return out

    def list_files_lazily(self, base: str, on_error: OnError, links: list[str] | None = None,
                          on_page: OnPage | None = None) -> Mapping[str, FileStat]:
        """``list_files``, where a back end can defer the stat of each file to its first lookup; symbolic
        links met are added to ``links`` if given (stores without links have none). A back end that lists in
        pages of keys in order may tell ``on_page`` each page's files as it arrives (S3); others never call it."""
        return self.list_files(base)

    def stat_files(self, base: str, paths: Iterable[str], on_error: OnError) -> dict[str, FileStat]:
        """The entries of ``paths`` (relative to ``base``) as they are now; a missing file is left out."""
        listing = self.list_files(base)
        return {p: listing[p] for p in paths if p in listing}

    def symlinks(self, path: str, limit: int) -> list[str]:
        """Symbolic links below ``path`` (the first ``limit``, sorted); stores without links have none."""
        return []

    def symlink_target(self, path: str) -> str | None:
        """Where ``path`` points if it is itself a symbolic link, else None."""
        return None

    def exists(self, path: str) -> bool:
        self.invalidate(path)
        return self.fs.exists(path)

    def isdir(self, path: str) -> bool:
        self.invalidate(path)
        return self.fs.isdir(path)

    def isfile(self, path: str) -> bool:
        self.invalidate(path)
        return self.fs.isfile(path)

    def listdir(self, path: str, folders_only: bool = False) -> list[str]:
        """Names of the direct children of ``path`` (only its folders, if asked); empty if it does not exist."""
        self.invalidate(path)
        try:
            entries = self.fs.ls(path, detail=folders_only)
        except FileNotFoundError:
            return []
        if folders_only:
            entries = [entry["name"] for entry in entries if entry.get("type") == "directory"]
        names, itself = set(), self.strip(path).rstrip("/")
        for entry in entries:
            entry = self.strip(entry).rstrip("/")
            name = posixpath.basename(entry)
            if name and entry != itself:
                names.add(name)
        return sorted(names)

    def stat(self, path: str) -> FileStat:
        self.invalidate(path)
        return self.file_stat(self.fs.info(path))

    def read_bytes(self, path: str) -> bytes:
        return self.fs.cat_file(path)

    def read_stamped(self, path: str) -> tuple[bytes, float | None]:
        """The bytes of ``path`` and its modification time on the store's clock (a back end that can
        tell both in one request does: the leases read theirs this way)."""
        data = self.read_bytes(path)
        return data, self.stat(path).modified

    def read_capped(self, path: str, cap: int) -> tuple[bytes, float | None]:
        """``read_stamped`` of a regular file of at most ``cap`` bytes, else ``WrongKind`` (a folder in
        its place, a link) or ``TooLarge``. Generic: its listing entry first, then the read."""
        info = self.fs.info(path)
        if info.get("islink"):
            raise WrongKind("a symbolic link")
        if info.get("type") != "file":
            raise WrongKind(f"a {info.get('type') or 'non-file'}")
        if int(info.get("size") or 0) > cap:
            raise TooLarge(int(info.get("size") or 0))
        data, modified = self.read_stamped(path)
        if len(data) > cap:  # replaced since
            raise TooLarge(len(data))
        return data, modified

    def folder_in_place(self, path: str) -> bool:
        """Whether a folder (an object store: a key prefix) stands where the file ``path`` is missing."""
        try:
            return self.isdir(path)
        except Exception:  # noqa: BLE001 - the file is missing either way
            return False

    def open_read(self, path: str, block_size: int | None) -> tuple[IO[bytes], str | None]:
        """A binary reader of ``path`` and the version token of exactly the file it reads, when the
        store can pin one (None: a replacement during the read could go unseen; list it again after)."""
        kwargs = {"block_size": block_size} if block_size else {}
        return self.fs.open(path, "rb", **kwargs), None

    # --- writing -----------------------------------------------------------------------------------
    def open_write(self, path: str) -> IO[bytes]:
        return self.fs.open(path, "wb", block_size=UPLOAD_BLOCK)

    def makedirs(self, path: str) -> None:
        if self.has_folders:
            self.fs.makedirs(path, exist_ok=True)

    def make_parents(self, paths: Iterable[str]) -> None:
        """Make the folders ``paths`` go into, so that writing or linking them needs no check each."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that readers see either nothing or the whole file."""
        raise NotImplementedError

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` only if it does not exist yet; True if this call created it.
        The file is complete the moment it becomes visible."""
        raise NotImplementedError

    def touch(self, path: str) -> None:
        """Create (or empty) ``path`` with one plain write: no temporary file of its own."""
        self.fs.pipe_file(path, b"")

    # --- copying without moving the bytes -----------------------------------------------------------
    def copy_methods(self, source: Backend) -> tuple[str, ...]:
        """How files of ``source`` can be copied here, cheapest first; ``STREAM`` (read, then write
        here) always applies and comes last. A method may still decline for one file."""
        return (STREAM,)

    def link(self, source: str, target: str, *, parent_ready: bool) -> FileStat | None:
        """Hard-link ``source`` as ``target``; the linked file's stat, or None if links are refused."""
        return None

    def link_checked(self, pairs: list[tuple[str, str]], listed: list[FileStat | None]) -> list[tuple[int, bool] | None]:
        """Hard-link each ``(source, target)`` (the targets' folders exist) and stat each linked inode: its
        size and whether it is the version ``listed`` for the pair, None where no link was made (links refused,
        or the source missing); an existing target raises."""
        return [None] * len(pairs)

    def server_copy(self, source: Backend, src_path: str, path: str, *, listed: FileStat | None,
                    size: int | None) -> ServerCopy | None:
        """Copy ``src_path`` of ``source`` to ``path`` inside the store; with ``listed`` (the source's
        listing entry), only if the source is still that version (else ``SourceChangedError``). None
        when the store declines (``size`` over its limit, refused): stream instead."""
        return None

    # --- deleting ----------------------------------------------------------------------------------
    def remove_file(self, path: str) -> None:
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def remove_empty_folders(self, paths: Iterable[str]) -> None:
        """Remove each of the folders ``paths`` that is empty, deepest first (stores without folders: none)."""

    # --- errors ------------------------------------------------------------------------------------
    def error_code(self, exc: BaseException) -> str | None:
        """The store's own name for the error behind ``exc`` (S3: the error code), if it gives one."""
        return None

    def is_credentials_problem(self, exc: BaseException) -> bool:
        """Whether ``exc`` means missing, invalid or expired credentials."""
        return any(type(e).__name__ in CREDENTIAL_ERRORS for e in exception_chain(exc))

    def is_unreachable(self, exc: BaseException) -> bool:
        """Whether ``exc`` means nothing answered at the store's address (after the client's own retries)."""
        return any(isinstance(e, ConnectionRefusedError) or (isinstance(e, OSError) and e.errno in UNREACHABLE_ERRNOS)
                   for e in exception_chain(exc))

    def is_transport_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` comes from the client library reaching the store (after its own retries)."""
        return any(type(e).__module__.split(".")[0] in TRANSPORT_MODULES for e in exception_chain(exc))


class StreamReader(io.RawIOBase):
    """A file read front to back from one download, in the pieces asked for: a back end gives its
    next chunk as it comes (``next_chunk``, ``b""`` at the end). fsspec's file objects ask for the
    size first, a second request for every file read."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = b""

    def next_chunk(self, size: int) -> bytes:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.pending) < size:
            chunk = self.next_chunk(size - len(self.pending) if size >= 0 else -1)
            if not chunk:
                break
            self.pending += chunk
        cut = len(self.pending) if size < 0 else size
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def modified_time(info: dict[str, Any]) -> float | None:
    """Last modification time in epoch seconds from any back end's listing entry."""
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


def version_token(info: dict[str, Any]) -> str:
    """A token that changes when a file is replaced: inode + mtime locally, ETag (GCS: its MD5 or
    generation) + mtime elsewhere."""
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation")
    mtime = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("updated")
    ino = info.get("ino")
    return ":".join(str(p) for p in (ino, etag, mtime) if p not in (None, ""))
