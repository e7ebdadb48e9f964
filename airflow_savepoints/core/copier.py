"""Copy files between stores by the cheapest correct means, with a checksum of every file (memory stays flat).

The destination store says how files of the source can reach it, cheapest first
(``Store.copy_methods``); per file, the first method that applies is used:

* ``link``: source and target are local and on one filesystem: a hard link. Spark never edits a
  checkpoint file in place (every write is a new file renamed into place, tests/test_fast_copy.py
  proves it), and this tool never edits a savepoint file, so a link is an independent copy of the
  bytes: Spark replacing or purging the original only removes *its* name for the inode. The
  CRC32C is then computed by reading the linked inode once (hardware CRC32C, nothing written).
* ``server_copy``: source and target are on S3 (one endpoint): ``CopyObject`` with
  ``ChecksumAlgorithm=CRC32C`` and ``CopySourceIfMatch`` = the listed ETag. No payload passes
  through the worker; the store computes the CRC32C of the object it wrote.
* ``stream``: read 1 MiB at a time, CRC32C, write. Never a whole-file read. Always applies.

The checksum is CRC32C, except where a savepoint is written on Azure: there a synchronous copy returns
Azure's CRC64 of the bytes it copied, and the file records that (``core/checksums.py``) rather than
being read back. Restores and checks compute whichever kind the manifest names for each file.

A ``KnownChecksum`` (from the previous savepoint of the job, for a file proven to be the same)
puts one more method first, ``reuse``: the file is linked or server-copied from that savepoint (by
the methods the destination offers for it) and its recorded CRC32C is reused
(``checksum_source="previous"``). Every result says how it was copied and where its checksum came
from; ``docs/savepoint-format.md`` states what each promises.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, NamedTuple, TypeVar

from pydantic import AfterValidator

from airflow_savepoints.core import checksums
from airflow_savepoints.core.checksums import CRC32C, CRC64
from airflow_savepoints.errors import InvalidInputError, SourceChangedError
from airflow_savepoints.storage import LINK, SERVER_COPY, STREAM, FileStat, Store

T, R = TypeVar("T"), TypeVar("R")
CHUNK = 1024 * 1024  # one chunk at a time per thread: 1 MiB stays in cache and keeps memory flat
MODES = ("auto", "stream")


def known_copy_mode(value: str) -> str:
    if value not in MODES:
        raise InvalidInputError(f"unknown copy mode {value!r}", "use one of: " + ", ".join(MODES))
    return value


CopyMode = Annotated[str, AfterValidator(known_copy_mode)]  # auto | stream: a request's field (savepoint, restore)

__all__ = ["CHUNK", "LINK", "MODES", "CopyMode", "PREVIOUS", "READ", "SERVER_COPY", "STORE", "STREAM", "CopiedFile",
           "KnownChecksum", "bounded_map", "checksum_of", "copy_file", "copy_many", "default_parallelism",
           "workers_for"]

# where a file's checksum came from
READ, STORE, PREVIOUS = "read", "store", "previous"


class KnownChecksum(NamedTuple):  # immutable; a tuple is made in a fraction of a frozen dataclass's time
    """A checksum already established for a file: copy from ``store``/``path`` and reuse ``crc``."""

    store: Store
    path: str
    size: int
    crc: int
    savepoint_id: str
    algorithm: str = CRC32C


class CopiedFile(NamedTuple):  # one per file of a savepoint: a tuple, not a frozen dataclass (7x cheaper to make)
    """One file copied: its size and checksum, how it was copied and where the checksum came from."""

    path: str
    size: int
    crc: int
    method: str = STREAM
    checksum_source: str = READ
    source_version: str | None = None  # identity of the source file actually copied, when known exactly
    reused_from: str | None = None  # the savepoint a reused checksum (and file) came from
    algorithm: str = CRC32C  # the kind of ``crc``: crc32c, or Azure's crc64

    @property
    def checksum(self) -> str:
        return checksums.as_hex(self.algorithm, self.crc)


def _read_crc(handle, algorithm: str = CRC32C) -> tuple[int, int]:
    # google-crc32c takes bytes only (not a bytearray view): one CHUNK at a time keeps memory flat
    crc, size = 0, 0
    while chunk := handle.read(CHUNK):
        crc = checksums.extend(algorithm, crc, chunk)
        size += len(chunk)
    return size, crc


def _hash(store: Store, rel: str, algorithm: str = CRC32C) -> tuple[int, int, str | None]:
    """(size, checksum, version token of the file read, when the store pins it) of one file."""
    with store.open_read(rel, block_size=8 * CHUNK) as reader:
        size, crc = _read_crc(reader, algorithm)
    return size, crc, reader.version


def checksum_of(store: Store, rel: str, algorithm: str = CRC32C) -> tuple[int, int]:
    """(size, checksum by ``algorithm``) of one file, read 1 MiB at a time."""
    size, crc, _ = _hash(store, rel, algorithm)
    return size, crc


def _stream(src: Store, src_rel: str, dst: Store, dst_rel: str, algorithm: str = CRC32C) -> CopiedFile:
    crc, size = 0, 0
    with src.open_read(src_rel, block_size=8 * CHUNK) as reader, dst.open_write(dst_rel) as writer:
        while chunk := reader.read(CHUNK):
            crc = checksums.extend(algorithm, crc, chunk)
            size += len(chunk)
            writer.write(chunk)
    return CopiedFile(src_rel, size, crc, STREAM, READ, reader.version, algorithm=algorithm)


@dataclass(frozen=True)
class _File:
    """One file to copy: from ``src``/``src_rel`` to ``dst``/``dst_rel``, as ``stat`` listed it."""

    src: Store
    src_rel: str
    dst: Store
    dst_rel: str
    stat: FileStat | None = None
    parent_ready: bool = False  # the target's folder exists
    algorithm: str = CRC32C  # the checksum to compute where the file is read
    any_store_checksum: bool = False  # a store's CRC64 will do instead (a savepoint; a restore checks one kind)


def _by_link(f: _File) -> CopiedFile | None:
    if f.dst.link_from(f.src, f.src_rel, f.dst_rel, parent_ready=f.parent_ready) is None:
        return None
    size, crc, version = _hash(f.dst, f.dst_rel, f.algorithm)  # the linked inode itself
    return CopiedFile(f.src_rel, size, crc, LINK, READ, version, algorithm=f.algorithm)


def _by_server_copy(f: _File) -> CopiedFile | None:
    stat = f.stat
    copied = f.dst.server_copy_from(f.src, f.src_rel, f.dst_rel, listed=stat)
    if copied is None:
        return None
    version = stat.version if stat and copied.guarded else None  # the copy was of exactly this version
    algorithm, crc = f.algorithm, copied.checksum(f.algorithm)
    if crc is None and f.any_store_checksum and copied.crc64 is not None and checksums.crc64_available():
        algorithm, crc = CRC64, copied.crc64  # Azure's: restores and checks can compute it here too
    if crc is None:  # the store did not compute one: read the copy (no upload)
        size, crc = checksum_of(f.dst, f.dst_rel, f.algorithm)
        return CopiedFile(f.src_rel, size, crc, SERVER_COPY, READ, version, algorithm=f.algorithm)
    size = stat.size if stat else f.dst.stat(f.dst_rel).size
    return CopiedFile(f.src_rel, size, crc, SERVER_COPY, STORE, version, algorithm=algorithm)


def _by_stream(f: _File) -> CopiedFile:
    return _stream(f.src, f.src_rel, f.dst, f.dst_rel, f.algorithm)


COPY_METHODS: dict[str, Callable[[_File], CopiedFile | None]] = {
    LINK: _by_link, SERVER_COPY: _by_server_copy, STREAM: _by_stream}


class _NotReusable(Exception):
    """The previous savepoint's copy of a file cannot be trusted: copy it from the checkpoint."""


def _linked_size_matches(dst: Store, rel: str, size: int, known: KnownChecksum) -> bool:
    """Whether the inode linked from the previous savepoint has the recorded size; if not, the link goes."""
    if size == known.size:
        return True
    dst.remove_file(rel)
    return False


def _reuse_by_link(known: KnownChecksum, f: _File) -> str | None:
    linked = f.dst.link_from(known.store, known.path, f.dst_rel, parent_ready=f.parent_ready)
    if linked is None:
        return None
    if not _linked_size_matches(f.dst, f.dst_rel, linked.size, known):
        raise _NotReusable(known.path)
    return PREVIOUS


def _reuse_all_by_link(dst: Store, paths: list[str], known: Mapping[str, KnownChecksum],
                       stats: Mapping[str, FileStat]) -> dict[str, CopiedFile]:
    """The files of ``paths`` with a ``known`` checksum, hard-linked from the savepoint holding each in tight
    loops (their folders exist; ``Store.link_checked_from``), each linked inode stat'ed: reused where it has the recorded size and
    the listing's entry of the file is true. A measured entry (a stat of the live file) is; an entry the
    listing only expects (``LazyLocalListing.expect``: the previous manifest's, for a name still holding that
    inode, not stat'ed) is proven by this stat: the linked inode is the listed one, with the listed
    modification time; else the live file is stat'ed now (``confirm``) and must match it.
    The rest (no link possible, the file gone, of another size or another version) are copied from the checkpoint."""
    hinted = [(path, hint) for path in paths if (hint := known.get(path)) is not None]
    by_store: dict[Store, list[tuple[str, KnownChecksum]]] = {}  # by identity: a Store has no __eq__
    for path, hint in hinted:
        by_store.setdefault(hint.store, []).append((path, hint))
    reused: dict[str, CopiedFile] = {}
    get_stat = stats.get
    is_expected = getattr(stats, "is_expected", None)
    for store, hints in by_store.items():
        listed = [get_stat(path) for path, _ in hints]
        linked = dst.link_checked_from(store, [(hint.path, path) for path, hint in hints], listed)
        for (path, hint), stat, got in zip(hints, listed, linked, strict=True):
            if got is None:
                continue
            if got[0] == hint.size and (stat is None or got[1] or is_expected is None
                                        or not is_expected(path) or _confirmed(stats, path, stat)):
                reused[path] = CopiedFile(path, hint.size, hint.crc, LINK, PREVIOUS, stat.version if stat else None,
                                          hint.savepoint_id, hint.algorithm)
            else:  # another size, or an expected entry the live file does not match: copied from the checkpoint
                dst.remove_file(path)
    return reused


def _confirmed(stats: Mapping[str, FileStat], path: str, expected: FileStat) -> bool:
    """Whether the live file, stat'ed now, is the version its expected entry says (``LazyLocalListing.confirm``)."""
    now = stats.confirm(path)  # type: ignore[attr-defined]
    return now is not None and now.version == expected.version and now.size == expected.size


def _reuse_by_server_copy(known: KnownChecksum, f: _File) -> str | None:
    copied = f.dst.server_copy_from(known.store, known.path, f.dst_rel, size=known.size)
    if copied is None:
        return None
    crc = copied.checksum(known.algorithm)
    if crc is not None and crc != known.crc:  # the store read other bytes: do not trust them
        f.dst.remove_file(f.dst_rel)
        raise _NotReusable(known.path)
    return PREVIOUS if crc is None else STORE


REUSE_METHODS: dict[str, Callable[[KnownChecksum, _File], str | None]] = {
    LINK: _reuse_by_link, SERVER_COPY: _reuse_by_server_copy}


def _reuse(known: KnownChecksum, f: _File) -> CopiedFile | None:
    """The file linked or server-copied from the previous savepoint with its checksum reused, if possible."""
    version = f.stat.version if f.stat else None
    try:
        for method in f.dst.copy_methods(known.store):
            reuse = REUSE_METHODS.get(method)
            checksum_source = reuse(known, f) if reuse is not None else None
            if checksum_source is not None:
                return CopiedFile(f.src_rel, known.size, known.crc, method, checksum_source, version,
                                  known.savepoint_id, known.algorithm)
    except (FileNotFoundError, SourceChangedError, _NotReusable):
        pass  # the previous savepoint lost the file: copy from the checkpoint instead
    return None


def _copy(f: _File, methods: tuple[str, ...], known: KnownChecksum | None) -> CopiedFile:
    """``f`` copied by the first of ``methods`` that applies (reusing ``known`` first, if given)."""
    if known is not None:
        reused = _reuse(known, f)
        if reused is not None:
            return reused
    for method in methods:
        copied = COPY_METHODS[method](f)
        if copied is not None:
            return copied
    return _by_stream(f)


def _methods(src: Store, dst: Store, mode: str) -> tuple[str, ...]:
    if mode not in MODES:
        raise ValueError(f"unknown copy mode {mode!r}")
    return dst.copy_methods(src) if mode == "auto" else (STREAM,)


def copy_file(src: Store, src_rel: str, dst: Store, dst_rel: str | None = None, *, stat: FileStat | None = None,
              mode: str = "auto", known: KnownChecksum | None = None) -> CopiedFile:
    """Copy ``src_rel`` to ``dst_rel`` by the cheapest means and return its size, CRC32C and provenance.

    ``stat`` is the source's listing entry (its ETag guards a server-side copy); ``mode="stream"``
    forces a streamed copy. With ``known``, the file comes from ``known.store``/``known.path``
    with ``known.crc``; if that is not possible (no link, no server-side copy, file gone), the
    file is copied from ``src`` as if ``known`` were not given.
    """
    methods = _methods(src, dst, mode)
    return _copy(_File(src, src_rel, dst, dst_rel or src_rel, stat), methods, known if mode == "auto" else None)


UPLOAD_PARALLELISM = 8  # default where files stream through the worker into an object store (~9 MiB each)
LINK_INLINE_BYTES = 32 * CHUNK  # files linked and hashed in the calling thread when they hold fewer bytes in all (docs/performance.md)
NETWORK_PARALLELISM = 32  # default elsewhere: server-side copies, reads and downloads hold 1 MiB at most


def default_parallelism(dst: Store | None = None, methods: tuple[str, ...] = ()) -> int:
    """Files copied or checked at once when the caller names no ``parallelism``: an upload through the
    worker holds a part buffer per thread, so fewer; nothing else holds more than a read chunk."""
    uploads = dst is not None and not dst.is_local and (not methods or methods[0] == STREAM)
    return UPLOAD_PARALLELISM if uploads else NETWORK_PARALLELISM


def workers_for(stores: tuple[Store, ...], parallelism: int | None, jobs: int, *,
                dst: Store | None = None, methods: tuple[str, ...] = ()) -> int:
    """Threads for ``jobs`` copies (into ``dst`` by ``methods``, cheapest first) or checks. On local
    disks the work is memory copies and CRC32C, bound by the cores (more threads only contend);
    object stores wait on the network: ``parallelism``, or by default :func:`default_parallelism`."""
    workers = min(parallelism or default_parallelism(dst, methods), jobs)
    if all(store.is_local for store in stores):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(workers, cores)
    return max(1, workers)


def bounded_map(fn: Callable[[T], R], items: list[T], workers: int,
                on_last_wave: Callable[[], object] | None = None) -> list[R]:
    """``fn`` over ``items`` on ``workers`` threads, results in order. At most a few items per worker are
    queued at a time (``Executor.map`` would queue a future for each of 20,000 files), and a slot is
    refilled as soon as any item is done: one slow item (a large file, a slow request) holds up its own
    worker only. On a failure nothing more is started; once the items under way are done, the failure
    of the first item in order is raised. ``on_last_wave`` is called once, when every item left is under
    way (the caller's next step can start its requests then)."""
    slots = threading.BoundedSemaphore(4 * workers)
    done: dict[int, R] = {}
    failed: dict[int, BaseException] = {}
    counting = threading.Lock()
    left, all_handed = len(items), False  # items not done; every item handed to the pool
    last_wave = on_last_wave

    def count(finished: int) -> None:
        nonlocal left, last_wave
        with counting:
            left -= finished
            if not all_handed or left > workers or failed:
                return
            call, last_wave = last_wave, None
        if call is not None:
            call()

    def settle(index: int, future: Future[R]) -> None:  # in the thread that ran the item
        try:
            if future.cancelled():
                return
            if (error := future.exception()) is not None:
                failed[index] = error
            else:
                done[index] = future.result()
        finally:
            slots.release()
            count(1)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for index, item in enumerate(items):
                slots.acquire()
                if failed:
                    break
                pool.submit(fn, item).add_done_callback(functools.partial(settle, index))
            else:
                with counting:
                    all_handed = True
                count(0)
        except BaseException:  # interrupted: the queued items never start
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        if failed:
            pool.shutdown(wait=True, cancel_futures=True)
    if failed:
        raise failed[min(failed)]
    return [done[index] for index in range(len(items))]


@dataclass(frozen=True)
class CopyOptions:
    """How a copy runs: ``parallelism`` files at once (None: :func:`workers_for` picks), by ``mode``
    (``auto``: link, server-side copy or stream, whatever the stores offer; ``stream``), with
    ``any_store_checksum`` (a savepoint) each file's checksum whichever kind the store computed for
    its copy, ``on_file`` called (from the copying thread) with each file copied, and ``on_last_wave``
    once when every file left is under way (see :func:`bounded_map`; not called when one thread copies)."""

    parallelism: int | None = None
    mode: str = "auto"
    any_store_checksum: bool = False
    on_file: Callable[[CopiedFile], None] | None = None
    on_last_wave: Callable[[], object] | None = None


def copy_many(src: Store, dst: Store, paths: list[str], options: CopyOptions = CopyOptions(), *,
              stats: Mapping[str, FileStat] | None = None, known: dict[str, KnownChecksum] | None = None,
              algorithms: Mapping[str, str] | None = None) -> dict[str, CopiedFile]:
    """Copy ``paths`` (same relative path on both sides) in parallel, as ``options`` say; the first
    failure is raised. What is known of each file: its listed ``stats``, its ``known`` checksum in the
    previous savepoint (reused from there where it can be), and the checksum kind to compute,
    ``algorithms[path]`` (CRC32C when not named).

    Where files are linked, the folders are made first, and files whose checksum is known are linked
    from the previous savepoint in tight loops (a link is one system call: no task per file; by the hundred,
    the loop is split over a few threads, ``storage.backends.local.in_slices``); each worker then links (or,
    across filesystems, streams) and hashes the rest, or this thread does when they hold under
    ``LINK_INLINE_BYTES`` in all (in one loop when no ``on_file`` is told of each file as it is done)."""
    if not paths:
        return {}
    stats, known = stats or {}, known or {}
    parallelism, mode, any_store_checksum, on_file = options.parallelism, options.mode, options.any_store_checksum, options.on_file
    methods = _methods(src, dst, mode)
    linking = methods[0] == LINK
    if linking:
        dst.make_parents(paths)
    known = known if mode == "auto" else {}
    algorithms = algorithms or {}
    done: dict[str, CopiedFile] = {}

    def file(path: str) -> _File:
        return _File(src, path, dst, path, stats.get(path), linking, algorithms.get(path, CRC32C), any_store_checksum)

    def one(path: str) -> CopiedFile:
        copied = _copy(file(path), methods, None if linking else known.get(path))
        if on_file is not None:
            on_file(copied)
        return copied

    rest = list(paths)
    if linking and known:  # reuse by link, no task per file
        done = _reuse_all_by_link(dst, paths, known, stats)
        rest = [path for path in paths if path not in done]
        if on_file is not None:
            for reused in done.values():
                on_file(reused)
    workers = workers_for((src, dst), parallelism, len(rest), dst=dst, methods=methods) if rest else 1
    if linking and sum(stat.size if (stat := stats.get(p)) else LINK_INLINE_BYTES for p in rest) < LINK_INLINE_BYTES:
        workers = 1  # a few small files to link and hash: less work than starting threads
        if on_file is None:  # no one to tell of each file as it is done: one loop for all
            done.update(linked := _link_and_hash_all(src, dst, rest, algorithms))
            rest = [path for path in rest if path not in linked]  # links refused: copied one by one below
    results = bounded_map(one, rest, workers, options.on_last_wave) if workers > 1 else [one(path) for path in rest]
    done.update({r.path: r for r in results})
    return {p: done[p] for p in paths}


def _link_and_hash_all(src: Store, dst: Store, paths: list[str], algorithms: Mapping[str, str]) -> dict[str, CopiedFile]:
    """The CRC32C files of ``paths`` linked and hashed in this thread, in one tight loop (``Store.link_and_read_from``:
    a link, then the linked inode opened, ``fstat``'ed and read once; the version token is the inode read)."""
    crc32c = [path for path in paths if algorithms.get(path, CRC32C) == CRC32C]
    found = dst.link_and_read_from(src, crc32c, checksums.EXTEND[CRC32C], CHUNK)
    return {path: CopiedFile(path, got[0], got[1], LINK, READ, got[2])
            for path, got in zip(crc32c, found, strict=True) if got is not None}
