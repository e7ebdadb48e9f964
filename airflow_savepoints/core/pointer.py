"""Savepoint locations: pointer resolution (like Flink's) and listing a job's savepoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_savepoints.core.catalog import Catalog, SavepointRecord, SavepointState
from airflow_savepoints.core.manifest import (  # noqa: F401 - re-exported: where callers have found them
    SAVEPOINT_NAME,
    new_savepoint_id,
    parse_manifest,
    read_manifest,
    savepoint_info,
)
from airflow_savepoints.core.models import JOB_NAME, SavepointInfo, SavepointManifest, validate_job_name
from airflow_savepoints.core.names import MANIFEST_FILE
from airflow_savepoints.errors import (
    IncompleteSavepointError,
    ManifestUnreadableError,
    SavepointNotFoundError,
    SavepointRootMissingError,
    SymlinkError,
)
from airflow_savepoints.storage import Store


def resolve_pointer(pointer: str, storage_options: dict[str, Any] | None = None) -> tuple[Store, SavepointManifest]:
    """A savepoint directory or its ``_metadata`` file -> (the directory's store, its manifest)."""
    store = Store(pointer, storage_options)
    if store.name == MANIFEST_FILE:
        store = store.parent()
    if not store.is_local:  # on an object store the manifest is read first: each check below costs requests
        try:
            return store, read_manifest(store)
        except (IncompleteSavepointError, ManifestUnreadableError):
            _refuse_no_savepoint(store)
            raise
    _refuse_no_savepoint(store)
    return store, read_manifest(store)


def resolve_savepoint(pointer: str, storage_options: dict[str, Any] | None = None) -> tuple[Store, SavepointManifest]:
    """``resolve_pointer`` for a command that reads inside the savepoint (``show``, ``inspect``,
    ``offsets``): links refused as ``restore`` and ``verify`` refuse them (``symlink_refused``), so
    nothing outside the savepoint is read as its own (a linked ``state/``, ``sources/0/*`` or ``_metadata``)."""
    location, manifest = resolve_pointer(pointer, storage_options)
    refuse_symlinks(location, "savepoint")
    return location, manifest


def _refuse_no_savepoint(store: Store) -> None:
    """Nothing at ``store``, or a file: no savepoint there."""
    if not store.exists():
        raise SavepointNotFoundError(
            f"no savepoint at {store.url}: nothing exists there", "check the pointer (list the job's savepoints)"
        )
    if store.isfile():
        raise SavepointNotFoundError(
            f"{store.url} is a file, not a savepoint directory or its {MANIFEST_FILE}",
            "point at the savepoint-<id>-<random> directory or its _metadata file",
        )


def refuse_symlinks(store: Store, what: str, links: list[str] | None = None) -> None:
    """A savepoint is self-contained: no symbolic link goes into one, none comes out of one. ``links``:
    those a listing of ``store`` met (``Store.list_files_lazily``), else ``store`` is walked for them."""
    links = store.symlinks() if links is None else sorted(links)
    if links:
        named = ", ".join(store.url_of(link) for link in links[:5])
        raise SymlinkError(
            f"the {what} {store.url} contains symbolic links, which are refused: {named}",
            "savepoints hold only regular files; replace each link by the file itself (or remove it) and retry",
        )


def list_savepoints(root: Store, job: str, states: set[SavepointState] | None = None) -> list[SavepointRecord]:
    """The job's savepoints from its catalog, oldest first (one read, however many there are)."""
    return Catalog(root.child(validate_job_name(job)), job).records(states)


def latest_savepoint(root: Store, job: str,
                     accept: Callable[[SavepointManifest], bool] | None = None) -> SavepointInfo | None:
    """The restore default of ``job``: its newest completed savepoint whose ``_metadata`` reads, never one
    taken of a checkpoint the job had left, and one ``accept`` takes if given; None if it has none."""
    return Catalog(root.child(validate_job_name(job)), job).latest(accept)


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
