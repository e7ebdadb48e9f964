"""Verify a savepoint: every file against the size and checksum its manifest records.

Apart from the restore (core/restore.py, which checks each copied file the same way): ``verify`` reads a
savepoint and needs no catalog, lease, sink or rescale code, so it imports none (the manifest, the store and
the checksums; tests/unit/cli/test_import_budget.py holds the CLI's ``verify`` to it).
"""

from __future__ import annotations

from typing import Any

from airflow_savepoints.core import checksums
from airflow_savepoints.core.copier import bounded_map, checksum_of, workers_for
from airflow_savepoints.core.manifest import refuse_symlinks, resolve_pointer
from airflow_savepoints.core.models import FileEntry, Notify, SavepointManifest
from airflow_savepoints.errors import VerificationError
from airflow_savepoints.storage import Store


def mismatch(entry: FileEntry, size: int, crc: int) -> str | None:
    """What is wrong with a file of ``size`` bytes whose checksum (by the entry's algorithm) is ``crc``."""
    if size != entry.size:
        return f"{entry.path}: {size} bytes, the manifest says {entry.size} (truncated or extended)"
    got = checksums.as_hex(entry.algorithm, crc)
    if got != entry.checksum:
        return f"{entry.path}: {entry.algorithm} checksum {got}, the manifest says {entry.checksum} (content changed)"
    return None


def bytes_mismatch(entry: FileEntry, data: bytes) -> str | None:
    return mismatch(entry, len(data), checksums.of_bytes(entry.algorithm, data))


def verify_savepoint(pointer: str, storage_options: dict[str, Any] | None = None,
                     parallelism: int | None = None, on_event: Notify | None = None
                     ) -> tuple[Store, SavepointManifest]:
    """Check every file of the savepoint against its manifest; raise naming the bad files.

    ``on_event("planned", {files, bytes})`` then ``on_event("file_done", {path, bytes})`` per file report progress.
    Nothing is written."""
    location, manifest = resolve_pointer(pointer, storage_options)
    refuse_symlinks(location, "savepoint")
    listing = location.list_files()
    problems = [f"{e.path}: missing" for e in manifest.files if e.path not in listing]
    present = [e for e in manifest.files if e.path in listing]
    notify = on_event or (lambda event, data: None)
    notify("planned", {"files": len(present), "bytes": sum(e.size for e in present)})

    def check(entry: FileEntry) -> str | None:
        try:
            size, crc = checksum_of(location, entry.path, entry.algorithm)
        except FileNotFoundError:
            return f"{entry.path}: missing (removed while it was verified)"
        notify("file_done", {"path": entry.path, "bytes": size})
        return mismatch(entry, size, crc)

    problems += [p for p in bounded_map(check, present, workers_for((location,), parallelism, len(present))) if p]
    if problems:
        raise VerificationError(
            f"savepoint {location.url} is damaged: " + "; ".join(problems[:10])
            + (f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""),
            "do not restore it; use another savepoint of the job",
        )
    return location, manifest
