"""Copy files between stores by the cheapest correct means, with a CRC32C of every file (memory stays flat).

Per file, the first way that applies:

* ``link``: source and target are local and on one filesystem: a hard link. Spark never edits a
  checkpoint file in place (every write is a new file renamed into place, tests/test_fast_copy.py
  proves it), and this tool never edits a savepoint file, so a link is an independent copy of the
  bytes: Spark replacing or purging the original only removes *its* name for the inode. The
  CRC32C is then computed by reading the linked inode once (hardware CRC32C, nothing written).
* ``server_copy``: source and target are on S3 (one endpoint): ``CopyObject`` with
  ``ChecksumAlgorithm=CRC32C`` and ``CopySourceIfMatch`` = the listed ETag. No payload passes
  through the worker; the store computes the CRC32C of the object it wrote.
* ``stream``: read 1 MiB at a time, CRC32C, write. Never a whole-file read.

A ``KnownChecksum`` (from the previous savepoint of the job, for a file proven to be the same)
spares the read: the file is linked or server-copied from that savepoint and its recorded CRC32C is
reused (``checksum_source="previous"``). Every result says how it was copied and where its
checksum came from; ``docs/savepoint-format.md`` states what each promises.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import google_crc32c

from airflow_savepoints.storage import FileStat, Store
from airflow_savepoints.storage.store import SERVER_COPY_MAX, SourceChangedError, local_version

CHUNK = 1024 * 1024  # one chunk at a time per thread: 1 MiB stays in cache and keeps memory flat
MODES = ("auto", "stream")

# how a file was copied
LINK, SERVER_COPY, STREAM = "link", "server_copy", "stream"
# where its checksum came from
READ, STORE, PREVIOUS = "read", "store", "previous"



@dataclass(frozen=True)
class KnownChecksum:
    """A checksum already established for a file: copy from ``store``/``path`` and reuse ``crc``."""

    store: Store
    path: str
    size: int
    crc: int
    savepoint_id: str


@dataclass(frozen=True)
class CopiedFile:
    path: str
    size: int
    crc: int
    method: str = STREAM
    checksum_source: str = READ
    source_version: str | None = None  # identity of the source file actually copied, when known exactly
    reused_from: str | None = None  # the savepoint a reused checksum (and file) came from

    @property
    def checksum(self) -> str:
        return format(self.crc, "08x")


def _read_crc(handle) -> tuple[int, int]:
    # google-crc32c takes bytes only (not a bytearray view): one CHUNK at a time keeps memory flat
    crc, size = 0, 0
    while chunk := handle.read(CHUNK):
        crc = google_crc32c.extend(crc, chunk)
        size += len(chunk)
    return size, crc


def _hash_local(path: str) -> tuple[int, int, str]:
    """(size, CRC32C, version token) of a local file, read 1 MiB at a time."""
    with open(path, "rb", buffering=0) as handle:
        version = local_version(os.fstat(handle.fileno()))
        size, crc = _read_crc(handle)
    return size, crc, version


def checksum_of(store: Store, rel: str) -> tuple[int, int]:
    """(size, CRC32C) of one file, read 1 MiB at a time."""
    if store.protocol == "file":
        with store.translate_errors(store.url_of(rel)):
            size, crc, _ = _hash_local(store.path_of(rel))
        return size, crc
    with store.open_read(rel, block_size=8 * CHUNK) as src:
        return _read_crc(src)


def _stream(src: Store, src_rel: str, dst: Store, dst_rel: str) -> CopiedFile:
    crc, size, version = 0, 0, None
    if src.protocol == "file":
        with src.translate_errors(src.url_of(src_rel)):
            reader = open(src.path_of(src_rel), "rb", buffering=0)  # noqa: SIM115 - closed below
        version = local_version(os.fstat(reader.fileno()))
    else:
        reader = src.open_read(src_rel, block_size=8 * CHUNK)
    with reader, dst.open_write(dst_rel) as writer:
        while chunk := reader.read(CHUNK):
            crc = google_crc32c.extend(crc, chunk)
            size += len(chunk)
            writer.write(chunk)
    return CopiedFile(src_rel, size, crc, STREAM, READ, version)


def copy_file(src: Store, src_rel: str, dst: Store, dst_rel: str | None = None, *, stat: FileStat | None = None,
              mode: str = "auto", known: KnownChecksum | None = None) -> CopiedFile:
    """Copy ``src_rel`` to ``dst_rel`` by the cheapest means and return its size, CRC32C and provenance.

    ``stat`` is the source's listing entry (its ETag guards a server-side copy); ``mode="stream"``
    forces a streamed copy. With ``known``, the file comes from ``known.store``/``known.path``
    with ``known.crc``; if that is not possible (no link, no server-side copy, file gone), the
    file is copied from ``src`` as if ``known`` were not given.
    """
    if mode not in MODES:
        raise ValueError(f"unknown copy mode {mode!r}")
    dst_rel = dst_rel or src_rel
    if known is not None and mode == "auto":
        reused = _reuse(known, dst, dst_rel, src_rel, stat)
        if reused is not None:
            return reused
    if mode == "auto":
        linked = dst.link_from(src, src_rel, dst_rel)
        if linked is not None:
            size, crc, version = _hash_local(dst.path_of(dst_rel))  # the linked inode itself
            return CopiedFile(src_rel, size, crc, LINK, READ, version)
        too_big = stat is not None and stat.size > SERVER_COPY_MAX
        copied = None if too_big else dst.server_copy_from(src, src_rel, dst_rel, etag=stat.etag if stat else None)
        if copied is not None:
            if copied.crc is None:  # the store did not compute one: read the copy (no upload)
                size, crc = checksum_of(dst, dst_rel)
                return CopiedFile(src_rel, size, crc, SERVER_COPY, READ,
                                  stat.version if stat and stat.etag else None)
            size = stat.size if stat else dst.stat(dst_rel).size
            return CopiedFile(src_rel, size, copied.crc, SERVER_COPY, STORE, stat.version if stat and stat.etag else None)
    return _stream(src, src_rel, dst, dst_rel)


def _reuse(known: KnownChecksum, dst: Store, dst_rel: str, src_rel: str, stat: FileStat | None,
           parent_ready: bool = False) -> CopiedFile | None:
    """Link or server-copy the file from the previous savepoint and reuse its checksum, if possible."""
    version = stat.version if stat else None
    if known.size > SERVER_COPY_MAX and known.store.protocol != "file":
        return None
    try:
        linked = dst.link_from(known.store, known.path, dst_rel, parent_ready=parent_ready)
        if linked is not None:
            if linked.size != known.size:
                dst.remove_file(dst_rel)
                return None
            return CopiedFile(src_rel, known.size, known.crc, LINK, PREVIOUS, version, known.savepoint_id)
        copied = dst.server_copy_from(known.store, known.path, dst_rel, etag=None)
    except (FileNotFoundError, SourceChangedError):
        return None  # the previous savepoint lost the file: copy from the checkpoint instead
    if copied is None:
        return None
    if copied.crc is not None and copied.crc != known.crc:  # the store read other bytes: do not trust them
        dst.remove_file(dst_rel)
        return None
    return CopiedFile(src_rel, known.size, known.crc, SERVER_COPY, PREVIOUS if copied.crc is None else STORE,
                      version, known.savepoint_id)


def workers_for(stores: tuple[Store, ...], parallelism: int, jobs: int) -> int:
    """Threads for ``jobs`` copies or checks. On local disks the work is memory copies and CRC32C,
    bound by the cores (more threads only contend); object stores wait on the network: ``parallelism``."""
    workers = min(parallelism, jobs)
    if all(store.protocol == "file" for store in stores):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(workers, cores)
    return max(1, workers)


def copy_many(src: Store, dst: Store, paths: list[str], parallelism: int, *, stats: Mapping[str, FileStat] | None = None,
              mode: str = "auto", known: dict[str, KnownChecksum] | None = None,
              on_file: Callable[[CopiedFile], None] | None = None) -> dict[str, CopiedFile]:
    """Copy ``paths`` (same relative path on both sides) in parallel; the first failure is raised.
    ``on_file`` is called (from the copying thread) with each file copied, for progress reports.

    Between local stores, the folders are made first, and files whose checksum is known are linked
    from the previous savepoint in this thread (a link is one system call; a thread pool would cost
    more than the work); each worker then links (or, across filesystems, streams) and hashes the rest."""
    if not paths:
        return {}
    stats, known = stats or {}, known or {}
    done: dict[str, CopiedFile] = {}
    rest = list(paths)
    local = mode == "auto" and dst.protocol == "file" and src.protocol == "file"
    if local:
        rest = []
        with dst.translate_errors():
            for folder in sorted({posixpath.dirname(dst.path_of(p)) for p in paths}):
                os.makedirs(folder, exist_ok=True)
        for path in paths:
            hint = known.get(path)
            reused = _reuse(hint, dst, path, path, stats.get(path), parent_ready=True) if hint is not None else None
            if reused is not None:
                done[path] = reused
                if on_file is not None:
                    on_file(reused)
            else:
                rest.append(path)

    def one(path: str) -> CopiedFile:
        copied = copy_one(path)
        if on_file is not None:
            on_file(copied)
        return copied

    def copy_one(path: str) -> CopiedFile:
        if not local:
            return copy_file(src, path, dst, stat=stats.get(path), mode=mode, known=known.get(path))
        if dst.link_from(src, path, path, parent_ready=True) is None:  # another filesystem
            return _stream(src, path, dst, path)
        size, crc, version = _hash_local(dst.path_of(path))  # the linked inode itself
        return CopiedFile(path, size, crc, LINK, READ, version)

    if len(rest) == 1:
        results = [one(rest[0])]
    elif rest:
        with ThreadPoolExecutor(max_workers=workers_for((src, dst), parallelism, len(rest))) as pool:
            results = list(pool.map(one, rest))
    else:
        results = []
    done.update({r.path: r for r in results})
    return {p: done[p] for p in paths}
