"""Savepoint locations: listing a job's savepoints (pointer resolution, like Flink's, is core/manifest.py's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_savepoints.core.catalog import Catalog, SavepointRecord, SavepointState
from airflow_savepoints.core.manifest import (  # noqa: F401 - re-exported: where callers have found them
    SAVEPOINT_NAME,
    new_savepoint_id,
    parse_manifest,
    read_manifest,
    refuse_symlinks,
    resolve_pointer,
    resolve_savepoint,
    savepoint_info,
)
from airflow_savepoints.core.models import JOB_NAME, SavepointInfo, SavepointManifest, validate_job_name
from airflow_savepoints.core.names import MANIFEST_FILE
from airflow_savepoints.errors import (
    IncompleteSavepointError,
    NoSavepointError,
    SavepointNotFoundError,
    SavepointRootMissingError,
)
from airflow_savepoints.storage import Store


def list_savepoints(root: Store, job: str, states: set[SavepointState] | None = None) -> list[SavepointRecord]:
    """The job's savepoints from its catalog, oldest first (one read, however many there are)."""
    return Catalog(root.child(validate_job_name(job)), job).records(states)


def latest_savepoint(root: Store, job: str,
                     accept: Callable[[SavepointManifest], bool] | None = None) -> SavepointInfo | None:
    """The restore default of ``job``: its newest completed savepoint whose ``_metadata`` reads, never one
    taken of a checkpoint the job had left, and one ``accept`` takes if given; None if it has none."""
    return Catalog(root.child(validate_job_name(job)), job).latest(accept)


def latest_pointer(root: Store, job: str, purpose: str, hint: str) -> str:
    """The pointer of ``job``'s newest completed savepoint (:func:`latest_savepoint`); without one,
    ``NoSavepointError`` saying it has none ``purpose`` (e.g. "to inspect"), with ``hint``."""
    info = latest_savepoint(root, job)
    if info is None:
        raise NoSavepointError(f"job '{job}' has no completed savepoint {purpose}", hint)
    return info.pointer


def list_jobs(root: Store) -> list[str]:
    """Names of the job folders under the savepoint root (one listing; also jobs that have ended): folders
    with a valid job name, so a stray ``README.md`` is not a job. Raises when the root does not exist."""
    names = [name for name in root.listdir(folders_only=True) if JOB_NAME.match(name) and ".." not in name]
    if not names and not root.exists():
        raise SavepointRootMissingError(
            f"the savepoint root {root.url} does not exist",
            "no savepoint has been taken there yet, or the savepoints_default connection (its host) or "
            "[savepoints] savepoint_dir names the wrong place",
        )
    return names


def incomplete_locations(root: Store, job: str) -> list[str]:
    """Savepoint folders of ``job`` that have no ``_metadata`` (failed, crashed or in progress)."""
    job_store = root.child(validate_job_name(job))
    folders: dict[str, bool] = {}
    for path in job_store.list_files():
        parts = path.split("/")
        if len(parts) >= 2 and SAVEPOINT_NAME.match(parts[0]):
            folders[parts[0]] = folders.get(parts[0], False) or (len(parts) == 2 and parts[1] == MANIFEST_FILE)
    return sorted(name for name, complete in folders.items() if not complete)


def completed_savepoint(pointer: str, storage_options: dict[str, Any] | None = None) -> SavepointInfo | None:
    """The savepoint at ``pointer`` if it is complete; None while it is missing or has no _metadata."""
    try:
        location, manifest = resolve_pointer(pointer, storage_options)
    except (SavepointNotFoundError, IncompleteSavepointError):
        return None
    return savepoint_info(location, manifest)
