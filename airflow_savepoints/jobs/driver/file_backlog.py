"""The backlog of a query's file sources: the files in each source's folder that the query has not read yet.

Spark's progress gives a file source no backlog (its ``latestOffset`` is null and its ``metrics`` empty, Spark
4.2), so the in-job helper counts it, off the run's path: in a daemon thread (:class:`FileBacklog`), at most one
count at a time, so a slow listing never delays a heartbeat, and any error is logged and gives no count (None).

A file source reads the files of its folder oldest first (by modification time; not with ``latestFirst``) and
logs each batch's files, with their modification times, in ``<checkpoint>/sources/<index>/<log offset>`` (every
tenth batch a ``.compact`` file of all of them, of which only the last :data:`TAIL_BYTES` are read). So, per
source, with ``N`` the log offset its progress's ``endOffset`` gives:

- ``newest`` = the newest modification time among the files logged up to ``N`` (the last batches' files, at most
  :data:`BATCHES_BACK` source-log files read per count; earlier ones were read by an earlier count);
- files not yet read = the files of one listing of the source's folder (hidden ones, ``_*`` and ``.*``, left out,
  as Spark does) modified after ``newest``, plus those modified within :data:`TIE_MS` of it that no logged batch
  names (files written in the same millisecond are split across batches by ``maxFilesPerTrigger``).

What it does not see: a file moved in with a modification time older than ``newest`` (Spark reads it, if within
``maxFileAge``; it is counted as read), a source with ``latestFirst``, a glob path (no count: None), a folder a
file sink writes (Spark reads its ``_spark_metadata`` log instead; the listing counts the data files).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

SOURCE = re.compile(r"^FileStreamSource\[(.+)\]$")
GLOB = re.compile(r"[*?\[\]{}]")
TAIL_BYTES = 256 * 1024  # of a .compact source-log file: its last batch's entries are at its end
BATCHES_BACK = 20  # source-log files read per count at most: after a longer gap, the newest ones only
TIE_MS = 1  # modification times this close to the newest read one are told apart by name (and Java's rounding)
COST_SHARE = 0.1  # counting may take at most this share of the run's time: after a count of d seconds, none for d/0.1


def _log_offset(offset: Any) -> int:
    """A file source's ``{"logOffset": N}`` (or its JSON text) as N; -1 for none (nothing logged yet)."""
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return -1
    value = offset.get("logOffset") if isinstance(offset, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _hidden(rel: str) -> bool:
    """A path Spark's file index leaves out: a part named ``_*`` or ``.*`` (not a ``k=v`` partition), a copy in flight."""
    return rel.endswith("._COPYING_") or any(part[:1] in ("_", ".") and "=" not in part for part in rel.split("/"))


def _path_of(url: str) -> str:
    """The path part of a URL (Spark's URL-encoded paths decoded), without a trailing slash."""
    return unquote(urlsplit(url).path).rstrip("/") if "://" in url or url.startswith("file:") else url.rstrip("/")


@dataclass
class _Source:
    """What one file source's log said up to ``log_offset``: the newest modification time, and the files logged
    within ``2 x TIE_MS`` of it (relative to the source's folder)."""

    url: str
    log_offset: int = -1
    newest: int | None = None
    recent: dict[str, int] = field(default_factory=dict)

    def add(self, path: str, stamp: int) -> None:
        root = _path_of(self.url)
        full = _path_of(path)
        rel = full[len(root) + 1:] if full.startswith(root + "/") else full
        if self.newest is None or stamp > self.newest:
            self.newest = stamp
            self.recent = {k: v for k, v in self.recent.items() if v >= stamp - 2 * TIE_MS}
        if stamp >= self.newest - 2 * TIE_MS:
            self.recent[rel] = stamp

    def unread(self, listing: dict[str, Any]) -> int | None:
        count = 0
        for rel, stat in listing.items():
            if _hidden(rel):
                continue
            if stat.modified is None:
                return None  # a store that gives no times: no count
            stamp = int(stat.modified * 1000)
            if self.newest is None or stamp > self.newest + TIE_MS or (stamp >= self.newest - TIE_MS and rel not in self.recent):
                count += 1
        return count


def _entries(folder: Store, offset: int) -> tuple[list[dict[str, Any]], bool] | None:
    """The entries of source-log batch ``offset`` (its own file, or the tail of its ``.compact`` file); None if neither."""
    for name, compact in ((str(offset), False), (f"{offset}.compact", True)):
        try:
            size = folder.stat(name).size
        except FileNotFoundError:
            continue
        if size > TAIL_BYTES:
            with folder.fs.open(folder.path_of(name), "rb") as handle:
                handle.seek(size - TAIL_BYTES)
                data = handle.read().split(b"\n", 1)[-1]  # the first line is cut
        else:
            data = folder.read_bytes(name)
        found = []
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the version line, a cut line
            if isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("timestamp"), int):
                found.append(entry)
        return found, compact
    return None


class FileBacklog:
    """Counts the files not yet read of a query's file sources, one count at a time in a daemon thread.

    :meth:`submit` a batch's progress (started only when no count runs, and the last one's listing and reads were
    at most :data:`COST_SHARE` of the time since it began: a folder of many files on an object store is listed
    every few batches, not after each); :meth:`take` the counts done since, by batch id: ``(files not yet read,
    files the batch read)``, each None when unknown. Never raises."""

    def __init__(self, checkpoint: Store | None) -> None:
        self.checkpoint = checkpoint
        self.sources: dict[int, _Source] = {}
        self.done: dict[int, tuple[int | None, int | None]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.last_count_s: float | None = None  # how long the last count took
        self._next_at = 0.0  # (monotonic) no count starts before: the last one's cost over COST_SHARE

    @staticmethod
    def file_sources(progress: dict[str, Any]) -> list[tuple[int, str, int]]:
        """(index in the query, folder URL, log offset) of each file source of a batch's progress."""
        found = []
        for index, source in enumerate(progress.get("sources") or []):
            if isinstance(source, dict) and (match := SOURCE.match(str(source.get("description") or ""))):
                found.append((index, match.group(1), _log_offset(source.get("endOffset"))))
        return found

    def submit(self, progress: dict[str, Any]) -> bool:
        """Start counting after ``progress`` (a batch's) unless a count runs or the query has no file source."""
        if self.checkpoint is None or not isinstance(progress, dict) or not isinstance(progress.get("batchId"), int):
            return False
        sources = self.file_sources(progress)
        if not sources or (self._thread is not None and self._thread.is_alive()) or time.monotonic() < self._next_at:
            return False
        self._thread = threading.Thread(target=self._count, args=(progress["batchId"], sources),
                                        name="savepoints-file-backlog", daemon=True)
        self._thread.start()
        return True

    def take(self) -> dict[int, tuple[int | None, int | None]]:
        with self._lock:
            done, self.done = self.done, {}
        return done

    def wait(self, timeout: float | None = None) -> None:
        """Until the running count (if any) is done (tests; a stopping run)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _count(self, batch_id: int, sources: list[tuple[int, str, int]]) -> None:
        unread: int | None = 0
        read: int | None = 0
        began = time.monotonic()
        try:
            for index, url, offset in sources:
                files, batch_files = self.count(index, url, offset)
                unread = None if files is None or unread is None else unread + files
                read = None if batch_files is None or read is None else read + batch_files
        except Exception as exc:  # noqa: BLE001 - the backlog never fails a run: no count this time
            log.warning("could not count the file sources' backlog: %s: %s", type(exc).__name__, exc)
            unread = read = None
        self.last_count_s = time.monotonic() - began
        self._next_at = began + self.last_count_s / COST_SHARE
        with self._lock:
            self.done[batch_id] = (unread, read)

    def count(self, index: int, url: str, offset: int) -> tuple[int | None, int | None]:
        """(files not yet read, files of log batch ``offset``) of the file source ``index`` reading ``url``."""
        if GLOB.search(url):
            return None, None
        source = self.sources.get(index)
        if source is None or source.url != url:
            source = self.sources[index] = _Source(url)
        batch_files: int | None = None
        if offset > source.log_offset:
            start = max(source.log_offset + 1, offset - BATCHES_BACK + 1)
            if start > source.log_offset + 1 and source.log_offset >= 0:
                source.recent = {}  # a gap: the older batches' names are not read again
            folder = self.checkpoint.child(f"sources/{index}")
            for batch in range(start, offset + 1):
                found = _entries(folder, batch)
                if found is None:
                    continue
                entries, compact = found
                for entry in entries:
                    source.add(entry["path"], entry["timestamp"])
                if batch == offset:
                    batch_files = sum(1 for e in entries if not compact or e.get("batchId") == batch)
            source.log_offset = offset
        else:
            batch_files = 0
        return source.unread(Store(url).list_files()), batch_files
