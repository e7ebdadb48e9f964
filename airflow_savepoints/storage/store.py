"""A directory tree on any fsspec filesystem, addressed by paths relative to its root.

Every read, write, listing and deletion of the package goes through :class:`Store`, so that URL
schemes, credentials, error messages and the "never leave the root" rule live in one place. What
differs between kinds of store (atomic writes, exclusive create, links, server-side copies, version
tokens, the store's own checksums) is done by the store's back end (``storage/backends``).
"""

from __future__ import annotations

import contextlib
import errno
import posixpath
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any, NoReturn

import fsspec
from fsspec.registry import known_implementations

from airflow_savepoints.errors import (
    CredentialsError,
    FileTooLargeError,
    InvalidPathError,
    LinkedFileError,
    MissingBackendError,
    NotARegularFileError,
    OutsideRootError,
    SourceChangedError,
    StorageError,
    StorageFullError,
    StoragePermissionError,
    StorageUnreachableError,
    UnknownSchemeError,
)
from airflow_savepoints.storage.backends import LINK, SERVER_COPY, Backend, FileStat, ServerCopy, backend_class
from airflow_savepoints.storage.backends.base import OnPage, TooLarge, WrongKind
from airflow_savepoints.storage.known_files import cap_of, parse_json

__all__ = ["EXTRA_OF_PROTOCOL", "SCHEME_ALIASES", "FileStat", "ServerCopy", "SourceChangedError", "Store", "split_url"]

# fsspec protocol -> the package extra that installs its backend (pyproject.toml)
EXTRA_OF_PROTOCOL = {"s3": "s3", "gcs": "gcs", "abfs": "azure", "az": "azure", "adl": "azure", "hdfs": "hdfs"}

# URL scheme -> fsspec protocol. s3a/s3n name the same objects as s3 (Hadoop's names for them).
SCHEME_ALIASES = {
    "s3a": "s3",
    "s3n": "s3",
    "gs": "gcs",
    "abfss": "abfs",
    "az": "abfs",
    "local": "file",
}
LOCAL = "file"  # the fsspec protocol of local paths


def split_url(url: str) -> tuple[str, str, str]:
    """Split ``url`` into (scheme as written, fsspec protocol, path for that filesystem)."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidPathError("empty path", "give an absolute path or a URL such as s3://bucket/savepoints")
    url = url.strip()
    if "://" not in url:
        if url.startswith("file:"):  # Hadoop/Spark style file:/abs/path
            return LOCAL, LOCAL, _absolute_local(url[len("file:") :], url)
        return LOCAL, LOCAL, _absolute_local(url, url)
    scheme, rest = url.split("://", 1)
    scheme_lc = scheme.lower()
    protocol = SCHEME_ALIASES.get(scheme_lc, scheme_lc)
    if backend_class(protocol).local:  # file://, local://: an absolute path on this machine
        return scheme_lc, protocol, _absolute_local(rest, url)
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
    kind = backend_class(protocol)
    try:
        cls = kind.filesystem_class(protocol)
    except ImportError as exc:
        hint = str(exc)  # fsspec's: the "err" of its known_implementations entry
        extra = EXTRA_OF_PROTOCOL.get(protocol)
        if extra:
            hint = f"pip install 'airflow-savepoints[{extra}]' ({hint})"
        raise MissingBackendError(
            f"no fsspec backend is installed for '{protocol}://'", f"{hint}; then try again"
        ) from exc
    except ValueError as exc:
        raise UnknownSchemeError(f"unknown URL scheme '{protocol}'", str(exc)) from exc
    # fsspec's own configuration (files and FSSPEC_* variables) under the options given, so that the back
    # end's defaults see it (an endpoint, a configured ``config_kwargs``)
    options = fsspec.config.apply_config(cls, dict(storage_options or {}))
    return cls(**kind.filesystem_options(options))


class Store:
    """One directory tree (``url``) on one fsspec filesystem, through the back end of its kind.

    Paths given to the methods are relative to the root, use ``/``, and may not leave the root.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *, _fs=None):
        self.scheme, self.protocol, self.root = split_url(url)
        self.storage_options = dict(storage_options or {})
        kind = backend_class(self.protocol)
        self.root, from_url = kind.location(self.root)
        options = {**from_url, **self.storage_options}  # options given explicitly win
        self.backend: Backend = kind(None, self.protocol)  # tells errors apart while the filesystem is made
        self.fs = _fs if _fs is not None else self._guarded(lambda: _make_filesystem(self.protocol, options))
        self.backend = kind(self.fs, self.protocol)

    @staticmethod
    def location_of(url: str) -> tuple[str, str]:
        """(protocol, root) of the store at ``url``, as a Store there would have them; nothing is reached."""
        _, protocol, path = split_url(url)
        return protocol, backend_class(protocol).location(path)[0]

    @staticmethod
    def is_store_root(url: str) -> bool:
        """Whether ``url`` is a filesystem root or a bucket (container) with no folder in it; nothing is reached."""
        protocol, root = Store.location_of(url)
        return root.strip("/") == "" if protocol == "file" else "/" not in root.strip("/")

    @staticmethod
    def overlapping(a: str, b: str) -> bool:
        """Whether one location lies at or below the other (compared as written, on the same store); nothing is reached."""
        (pa, ra), (pb, rb) = Store.location_of(a), Store.location_of(b)
        ra, rb = ra.rstrip("/"), rb.rstrip("/")
        return pa == pb and (ra == rb or ra.startswith(rb + "/") or rb.startswith(ra + "/"))

    # --- addressing --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.url_of("")

    def url_of(self, rel: str = "") -> str:
        """The URL of ``rel`` with the scheme the user wrote (s3a stays s3a, local stays a path)."""
        return self.backend.url(self.scheme, self.path_of(rel))

    def spark_url_of(self, rel: str = "") -> str:
        """The URL Spark would write for ``rel`` (``file:/abs`` for local files)."""
        return self.backend.spark_url(self.scheme, self.path_of(rel))

    def path_of(self, rel: str = "") -> str:
        rel = self._clean(rel)
        if not rel:
            return self.root
        return f"{self.root}/{rel}" if self.root != "/" else "/" + rel  # roots never end with "/"

    def paths_of(self, rels: Iterable[str]) -> list[str]:
        """``path_of`` of each of ``rels``, in one loop (a savepoint asks for hundreds): a plain relative path
        (no leading, trailing or doubled ``/``, no part starting with ``.``) is joined as it is, any other
        goes through ``path_of``."""
        root = self.root if self.root != "/" else ""
        return [f"{root}/{rel}" if rel and rel[0] != "/" and rel[-1] != "/" and "//" not in rel and "/." not in "/" + rel
                else self.path_of(rel) for rel in rels]

    def child(self, rel: str) -> Store:
        """A store rooted at ``rel`` below this one, sharing the filesystem object."""
        return self._with_root(self.path_of(rel))

    def parent(self) -> Store:
        """The store rooted one folder up, sharing the filesystem object."""
        return self._with_root(posixpath.dirname(self.root) or self.root)

    @property
    def name(self) -> str:
        return posixpath.basename(self.root)

    @property
    def is_local(self) -> bool:
        """Files on this machine's disks (links possible; copying is bound by the CPU, not the network)."""
        return self.backend.local

    @property
    def poll_interval(self) -> float:
        """Seconds between two reads of a file waited on here (longer where each read is a billed request)."""
        return self.backend.poll_interval

    @property
    def is_local_disk(self) -> bool:
        """A local filesystem reached without fsspec caching or wrapping (plain ``os`` calls are safe)."""
        return self.backend.is_local_disk

    def options_for(self, url: str) -> dict[str, Any] | None:
        """This store's options for another URL on the same kind of store (its keys, endpoint), else None."""
        return self.storage_options if split_url(url)[1] == self.protocol else None

    def _with_root(self, root: str) -> Store:
        other = Store.__new__(Store)
        other.scheme, other.protocol, other.root = self.scheme, self.protocol, root
        other.storage_options, other.fs, other.backend = self.storage_options, self.fs, self.backend
        return other

    def contains(self, other: Store) -> bool:
        """Whether ``other`` lies at or below this store's root on the same filesystem."""
        if other.protocol != self.protocol:
            return False
        return other.root == self.root or other.root.startswith(self.root.rstrip("/") + "/")

    def relative_to_root(self, full_path: str) -> str:
        full_path = self.backend.strip(full_path.rstrip("/")).rstrip("/")
        if full_path == self.root:
            return ""
        prefix = self.root.rstrip("/") + "/"
        if not full_path.startswith(prefix):
            raise OutsideRootError(f"'{full_path}' is outside '{self.url}'", "this is a bug; please report it")
        return full_path[len(prefix) :]

    def real_path(self, path: str) -> str:
        """``path`` (on this store's filesystem) with its symbolic links resolved; object stores: itself."""
        return self.backend.real_path(path)

    def resolved(self) -> Store:
        """This store with every symbolic link in its root resolved (object stores: itself)."""
        real = self.backend.real_path(self.root)
        return self if real == self.root else self._with_root(real)

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
        if isinstance(exc, FileNotFoundError | StorageError | SourceChangedError):  # the caller decides
            return None
        backend = self.backend
        if backend.is_credentials_problem(exc):
            return self._credentials_error(where)
        if isinstance(exc, PermissionError):
            return StoragePermissionError(
                f"permission denied at '{where}': {exc}",
                "check that the location is writable (not read-only) and that your credentials allow it",
            )
        if backend.is_unreachable(exc):
            return StorageUnreachableError(f"cannot reach the store of '{where}': {exc}", backend.error_hint)
        if isinstance(exc, OSError):
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return StorageFullError(f"no space left at '{where}'", "free space or choose another location")
            if exc.errno == errno.EROFS:
                return StoragePermissionError(f"'{where}' is on a read-only filesystem", "choose a writable location")
            return StorageError(f"storage error at '{where}': {exc}", backend.error_hint)
        if backend.is_transport_error(exc):  # e.g. botocore's ConnectionClosedError
            return StorageError(f"storage error at '{where}': {type(exc).__name__}: {exc}",
                                "check the store's endpoint and network, and try again")
        return None

    def _credentials_error(self, where: str) -> CredentialsError:
        return CredentialsError(f"no valid credentials for '{where}'", self.backend.credentials_hint)

    # --- reading -----------------------------------------------------------------------------------
    def list_files(self, rel: str = "") -> dict[str, FileStat]:
        """Every file below ``rel`` in ONE recursive listing, keyed by path relative to ``rel``."""
        with self.translate_errors(self.url_of(rel)):
            return self.backend.list_files(self.path_of(rel))

    def list_files_lazily(self, rel: str = "", links: list[str] | None = None,
                          on_page: OnPage | None = None) -> Mapping[str, FileStat]:
        """``list_files``, but on a local disk only the names are read at once; each file is stat'ed
        the first time it is looked up (for a planner that needs the stats of some of the files). The
        symbolic links met (as ``symlinks`` finds them) are added to ``links`` if given: one walk for both.
        On S3, ``on_page`` is told each page's files (paths relative to ``rel``) as it arrives, in key order,
        on the store's event loop (it must not wait); other stores never call it."""
        with self.translate_errors(self.url_of(rel)):
            return self.backend.list_files_lazily(self.path_of(rel), self._raise_translated, links, on_page)

    def stat_files(self, paths: Iterable[str]) -> dict[str, FileStat]:
        """The listing entries of ``paths`` as they are now (a missing file is left out): one stat
        per file on a local disk (cheaper than listing every version Spark keeps), else one listing."""
        with self.translate_errors():
            return self.backend.stat_files(self.root, paths, self._raise_translated)

    def symlinks(self, rel: str = "", limit: int = 10) -> list[str]:
        """Symbolic links below ``rel`` (the first ``limit``); never follows one (``rel`` itself may be
        a link, like a savepoint root). Object stores have no links: always empty."""
        with self.translate_errors(self.url_of(rel)):
            return self.backend.symlinks(self.path_of(rel), limit)

    def symlink_target(self, rel: str = "") -> str | None:
        """Where ``rel`` (the root itself by default) points if it is a symbolic link, else None."""
        with self.translate_errors(self.url_of(rel)):
            return self.backend.symlink_target(self.path_of(rel))

    def exists(self, rel: str = "") -> bool:
        with self.translate_errors(self.url_of(rel)):
            return self.backend.exists(self.path_of(rel))

    def isdir(self, rel: str = "") -> bool:
        with self.translate_errors(self.url_of(rel)):
            return self.backend.isdir(self.path_of(rel))

    def isfile(self, rel: str = "") -> bool:
        with self.translate_errors(self.url_of(rel)):
            return self.backend.isfile(self.path_of(rel))

    def listdir(self, rel: str = "", folders_only: bool = False) -> list[str]:
        """Names of the direct children of ``rel`` (files and folders, or only folders); empty if it does not exist."""
        with self.translate_errors(self.url_of(rel)):
            return self.backend.listdir(self.path_of(rel), folders_only)

    def stat(self, rel: str) -> FileStat:
        with self.translate_errors(self.url_of(rel)):
            return self.backend.stat(self.path_of(rel))

    def read_bytes(self, rel: str) -> bytes:
        with self.translate_errors(self.url_of(rel)):
            return self.backend.read_bytes(self.path_of(rel))

    def read_stamped(self, rel: str) -> tuple[bytes, float | None]:
        """The bytes of ``rel`` and its modification time on the store's clock (None if not reported)."""
        with self.translate_errors(self.url_of(rel)):
            return self.backend.read_stamped(self.path_of(rel))

    def read_known(self, rel: str, kind: str) -> bytes:
        """The bytes of ``rel``, a file of ``kind`` (``known_files.CAPS``): read only if it is a regular
        file (a link is not followed, a FIFO not waited on) within the kind's cap, else
        ``LinkedFileError``, ``NotARegularFileError`` or ``FileTooLargeError`` naming it. A missing
        file raises FileNotFoundError."""
        return self.read_known_stamped(rel, kind)[0]

    def read_known_stamped(self, rel: str, kind: str) -> tuple[bytes, float | None]:
        """``read_known`` with the file's time on the store's clock (``read_stamped``)."""
        cap, where = cap_of(kind), self.url_of(rel)
        with self.translate_errors(where):
            path = self.path_of(rel)
            try:
                return self.backend.read_capped(path, cap)
            except WrongKind as exc:
                if "link" in str(exc):
                    raise LinkedFileError(f"{where} is a symbolic link: not followed",
                                          "a file of this name must be a regular file in place; remove the link") \
                        from None
                raise self._not_a_file(where, str(exc)) from None
            except TooLarge as exc:
                raise FileTooLargeError(f"{where} is over {cap} bytes ({exc.args[0]} or more): not read",
                                        "the file is damaged or forged: remove or replace it") from None
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                if isinstance(exc, IsADirectoryError) or self.backend.folder_in_place(path):
                    raise self._not_a_file(where, "a folder") from None
                if isinstance(exc, NotADirectoryError):
                    raise FileNotFoundError(where) from exc
                raise

    @staticmethod
    def _not_a_file(where: str, what: str) -> NotARegularFileError:
        return NotARegularFileError(f"{where} is {what}, not a regular file: not read",
                                    "remove it; a file of this name must be a regular file")

    def read_json(self, rel: str, kind: str) -> Any:
        """The JSON value in ``rel`` (``read_known``, then ``known_files.parse_json``: a parse failure
        or a nesting too deep is a ``MalformedFileError`` naming it)."""
        return parse_json(self.read_known(rel, kind), self.url_of(rel))

    def open_read(self, rel: str, block_size: int | None = None) -> Reader:
        """A binary reader; its read errors are translated like every other call's. Its ``version`` is
        the version token of exactly the file it reads, when the store can pin it (local: the inode)."""
        try:  # no context manager: this runs once per file of a savepoint
            handle, version = self.backend.open_read(self.path_of(rel), block_size)
        except Exception as exc:
            self._raise_translated(exc, self.url_of(rel))
        return Reader(handle, self, rel, version)

    # --- writing -----------------------------------------------------------------------------------
    def open_write(self, rel: str) -> IO[bytes]:
        try:
            handle = self.backend.open_write(self.path_of(rel))
        except Exception as exc:
            self._raise_translated(exc, self.url_of(rel))
        # an object store uploads on write and close: their errors are translated too
        return _Translated(handle, self, rel)

    def makedirs(self, rel: str = "") -> None:
        with self.translate_errors(self.url_of(rel)):
            self.backend.makedirs(self.path_of(rel))

    def make_parents(self, paths: Iterable[str]) -> None:
        """Make the folders the files ``paths`` go into (stores without folders: nothing to do)."""
        one_per_folder = {rel.rpartition("/")[0]: rel for rel in paths}.values()  # hundreds of files, a few folders
        with self.translate_errors():
            self.backend.make_parents(self.paths_of(one_per_folder))

    def write_bytes_atomic(self, rel: str, data: bytes) -> None:
        """Write ``data`` so that readers see either nothing or the whole file."""
        with self.translate_errors(self.url_of(rel)):
            self.backend.write_atomic(self.path_of(rel), data)
        self._invalidate(rel)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` holding ``data`` only if it does not exist yet. True if this call created it.

        The file is complete the moment it becomes visible: locally a temp file is written, then
        hard-linked as ``rel`` (``link`` fails if ``rel`` exists); S3 and Azure use a conditional PUT
        (If-None-Match), GCS ``ifGenerationMatch=0``, HDFS a NameNode rename that refuses an existing
        file. Other stores fall back to check-then-write, which two processes can race;
        docs/reliability.md says so.
        """
        with self.translate_errors(self.url_of(rel)):
            return self.backend.create_exclusive(self.path_of(rel), data)

    def touch(self, rel: str) -> None:
        """Create (or empty) ``rel`` with one plain write, no temporary file (a clock probe)."""
        with self.translate_errors(self.url_of(rel)):
            self.backend.touch(self.path_of(rel))

    def _invalidate(self, rel: str = "") -> None:
        self.backend.invalidate(self.path_of(rel))

    # --- copying without moving the bytes -----------------------------------------------------------
    def copy_methods(self, source: Store) -> tuple[str, ...]:
        """How files of ``source`` can be copied here, cheapest first (``storage.backends``: LINK,
        SERVER_COPY, STREAM); STREAM always applies and comes last."""
        return self.backend.copy_methods(source.backend)

    def link_from(self, other: Store, src_rel: str, rel: str, *, parent_ready: bool = False) -> FileStat | None:
        """Hard-link ``other``'s file ``src_rel`` as ``rel`` here and return the linked file's stat.

        None when no link is possible: not both local, different filesystems, or links refused. A
        missing source raises FileNotFoundError; an existing target raises FileExistsError."""
        if LINK not in self.backend.copy_methods(other.backend):
            return None
        source, target = other.path_of(src_rel), self.path_of(rel)
        try:  # no context manager: this runs once per file of a savepoint
            return self.backend.link(source, target, parent_ready=parent_ready)
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            self._raise_translated(exc, self.url_of(rel))

    def link_checked_from(self, other: Store, pairs: list[tuple[str, str]],
                          listed: list[FileStat | None]) -> list[tuple[int, bool] | None]:
        """``link_from`` for many ``(src_rel, rel)`` whose folders exist here (``make_parents``): the size of each
        linked file (a stat of the linked inode) and whether it is the version ``listed`` for it, None where no
        link was made (no link possible, or the source missing). An existing target raises FileExistsError."""
        if LINK not in self.backend.copy_methods(other.backend):
            return [None] * len(pairs)
        try:
            sources, targets = other.paths_of([src for src, _ in pairs]), self.paths_of([rel for _, rel in pairs])
            return self.backend.link_checked(list(zip(sources, targets, strict=True)), listed)
        except FileExistsError:
            raise
        except OSError as exc:
            self._raise_translated(exc, exc.filename2 or self.url)

    def link_and_read_from(self, other: Store, rels: list[str], extend: Callable[[int, bytes], int],
                           chunk: int) -> list[tuple[int, int, str] | None]:
        """Link each of ``rels`` of ``other`` as the same path here (the folders exist) and read each linked
        inode once into ``extend`` (``LocalBackend.link_and_read``): (size, checksum, version token) each,
        None where no link was made. Only between local disks reached without fsspec's wrappers; elsewhere
        every entry is None. A missing source raises FileNotFoundError, an existing target FileExistsError."""
        link_and_read = getattr(self.backend, "link_and_read", None)
        if link_and_read is None or not (self.is_local_disk and other.is_local_disk) or \
                LINK not in self.backend.copy_methods(other.backend):
            return [None] * len(rels)
        try:
            pairs = list(zip(other.paths_of(rels), self.paths_of(rels), strict=True))
            return link_and_read(pairs, extend, chunk)
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            self._raise_translated(exc, exc.filename2 or exc.filename or self.url)

    def server_copy_from(self, other: Store, src_rel: str, rel: str, *, listed: FileStat | None = None,
                         size: int | None = None) -> ServerCopy | None:
        """Copy ``other``'s ``src_rel`` to ``rel`` inside the object store (S3 ``CopyObject``), with the
        CRC32C (or Azure's CRC64) the store computed if it gives one; with ``listed`` (its listing entry), only if the source
        is still that version (its ETag, or generation). ``size`` defaults to the listed one.

        None when not possible here (not one store and endpoint, over its size limit, refused): stream
        instead. Raises FileNotFoundError if the source is gone and SourceChangedError if its ETag changed."""
        if SERVER_COPY not in self.backend.copy_methods(other.backend):
            return None
        try:
            with self.translate_errors(self.url_of(rel)):
                return self.backend.server_copy(other.backend, other.path_of(src_rel), self.path_of(rel),
                                                listed=listed, size=size if size is not None or not listed
                                                else listed.size)
        except SourceChangedError as exc:
            raise SourceChangedError(f"{other.url_of(src_rel)} changed since it was listed") from exc
        except FileNotFoundError as exc:
            raise FileNotFoundError(other.url_of(src_rel)) from exc

    # --- deleting ----------------------------------------------------------------------------------
    def remove_file(self, rel: str) -> None:
        if not self._clean(rel):
            raise OutsideRootError("refusing to delete the store's root as a file", "this is a bug; please report it")
        with self.translate_errors(self.url_of(rel)):
            self.backend.remove_file(self.path_of(rel))
        self._invalidate(posixpath.dirname(rel))

    def remove_tree(self, rel: str) -> None:
        """Delete the folder ``rel`` below the root and everything in it; a missing folder is fine."""
        if not self._clean(rel):
            raise OutsideRootError("refusing to delete a store's whole root", "name a folder below the root")
        with self.translate_errors(self.url_of(rel)):
            self.backend.remove_tree(self.path_of(rel))
        self._invalidate(rel)

    def remove_empty_folders(self, rels: Iterable[str]) -> None:
        """Remove each of the folders ``rels`` that is empty, deepest first (never the root; stores
        without folders: nothing to do)."""
        self.backend.remove_empty_folders(self.path_of(r) for r in rels if self._clean(r))


class _Translated:
    """A file object (the store's file ``rel``) whose I/O errors become :class:`StorageError` naming it.
    No context manager per call: these run once per chunk."""

    def __init__(self, handle: IO[bytes], store: Store, rel: str):
        self._handle, self._store, self._rel = handle, store, rel

    def _failed(self, exc: Exception) -> NoReturn:
        self._store._raise_translated(exc, self._store.url_of(self._rel))

    def read(self, *args):
        try:
            return self._handle.read(*args)
        except Exception as exc:
            self._failed(exc)

    def readinto(self, buffer):
        try:
            return self._handle.readinto(buffer)
        except Exception as exc:
            self._failed(exc)

    def write(self, data):
        try:
            return self._handle.write(data)
        except Exception as exc:
            self._failed(exc)

    def flush(self) -> None:
        try:
            self._handle.flush()
        except Exception as exc:
            self._failed(exc)

    def close(self) -> None:
        try:
            self._handle.close()
        except Exception as exc:
            self._failed(exc)

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


class Reader(_Translated):
    """A translated reader that knows the version of the file it reads (None if the store cannot pin it)."""

    def __init__(self, handle: IO[bytes], store: Store, rel: str, version: str | None):
        super().__init__(handle, store, rel)
        self.version = version
