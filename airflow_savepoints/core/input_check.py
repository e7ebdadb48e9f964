"""Before a restore: are the input files the restored query will read still there?

A file source (Spark's FileStreamSource) records in ``sources/<i>/`` which input files each of its
log batches holds, and each ``offsets/<b>`` names the log batch (``logOffset``) a query batch read up
to. Everything up to the ``logOffset`` of the savepoint's committed batch N is consumed. A savepoint
that includes ``offsets/N+1`` also holds the log entries up to that batch's ``logOffset``: the
restored query re-runs N+1 and reads exactly those files, so they must still exist (Spark fails on a
missing one, or silently skips it with ``spark.sql.files.ignoreMissingFiles``). Files that appear in
the input folder later are not in any log and are not checked.
"""

from __future__ import annotations

import json
import posixpath
from collections import defaultdict
from typing import Any
from urllib.parse import unquote

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.models import SavepointManifest
from airflow_savepoints.errors import MissingInputError
from airflow_savepoints.storage import Store

SHOWN = 10


def pending_input_files(location: Store, manifest: SavepointManifest) -> list[str]:
    """URIs of the input files the savepoint's file-source logs list past its committed batch."""
    paths = {e.path for e in manifest.files}
    if not manifest.includes_next_offsets or f"offsets/{manifest.batch_id + 1}" not in paths:
        return []
    committed = formats.parse_offsets(location.read_bytes(f"offsets/{manifest.batch_id}"))
    planned = formats.parse_offsets(location.read_bytes(f"offsets/{manifest.batch_id + 1}"))
    pending: list[str] = []
    for source, offset in sorted(planned.sources.items()):
        last = formats.file_source_log_offset(offset)
        if last is None:
            continue
        done = formats.file_source_log_offset(committed.sources.get(source))
        after = -1 if done is None else done
        pending += logged_input_files(location, paths, f"sources/{source}", after, last)
    return sorted(set(pending))


def logged_input_files(location: Store, paths: set[str], folder: str, after: int, last: int) -> list[str]:
    """The ``path`` of every entry with ``after < batchId <= last`` in the log files the savepoint holds."""
    found: list[str] = []
    for path in sorted(p for p in paths if p.startswith(folder + "/") and p.count("/") == 2):
        name = path.rsplit("/", 1)[-1]
        match = formats.BATCH_FILE.match(name) or formats.COMPACT_FILE.match(name)
        if not match or int(match.group(1)) <= after:
            continue  # a log file up to the committed batch lists only consumed files
        for line in location.read_bytes(path).decode("utf-8", "replace").splitlines()[1:]:
            entry = json.loads(line) if line.strip().startswith("{") else {}
            batch = entry.get("batchId")
            if isinstance(entry.get("path"), str) and isinstance(batch, int) and after < batch <= last:
                found.append(entry["path"])
    return found


def missing_input_files(uris: list[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """The ``uris`` that do not exist now (one listing per folder)."""
    by_folder: dict[str, list[str]] = defaultdict(list)
    for uri in uris:
        by_folder[posixpath.dirname(uri)].append(uri)
    missing: list[str] = []
    for folder, members in sorted(by_folder.items()):
        store = Store(unquote(folder), storage_options)
        present = store.stat_files([unquote(posixpath.basename(u)) for u in members]) if store.isdir() else {}
        missing += [u for u in members if unquote(posixpath.basename(u)) not in present]
    return missing


def check_input(location: Store, manifest: SavepointManifest, storage_options: dict[str, Any] | None) -> None:
    """Refuse a restore whose re-run batch would read input files that are gone, naming them."""
    missing = missing_input_files(pending_input_files(location, manifest), storage_options)
    if missing:
        shown = ", ".join(missing[:SHOWN]) + (f" (+{len(missing) - SHOWN} more)" if len(missing) > SHOWN else "")
        raise MissingInputError(
            f"{len(missing)} input file(s) that batch {manifest.batch_id + 1} of savepoint {location.url} "
            f"will read again are gone: {shown}",
            "put the files back, or restore with skip_missing_input=True (--skip-missing-input) and start "
            "the query with spark.sql.files.ignoreMissingFiles=true (their rows are then lost); nothing was restored",
        )
