"""Savepoint locations: naming, pointer resolution (like Flink's), manifests and listing."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from pydantic import ValidationError

from airflow_savepoints.core.catalog import Catalog, SavepointRecord, SavepointState
from airflow_savepoints.core.models import (
    JOB_NAME,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    SavepointInfo,
    SavepointManifest,
    validate_job_name,
)
from airflow_savepoints.errors import (
    CredentialsError,
    IncompleteSavepointError,
    ManifestCorruptError,
    ManifestUnreadableError,
    ManifestVersionError,
    MissingBackendError,
    SavepointNotFoundError,
    StorageError,
    SymlinkError,
    UnknownSchemeError,
)
from airflow_savepoints.storage import Store

SAVEPOINT_NAME = re.compile(r"^savepoint-[0-9A-Za-z-]{1,6}-[0-9a-f]{12}\Z")  # \Z: not "$", which allows a final newline


def new_savepoint_id(query_id: str) -> str:
    """``savepoint-<query id[0:6]>-<random>``, after Flink's ``savepoint-<jobid[0:6]>-<random>``."""
    prefix = re.sub(r"[^0-9A-Za-z-]", "", query_id)[:6] or "query"
    return f"savepoint-{prefix[:6]}-{secrets.token_hex(6)}"


def parse_manifest(data: bytes, where: str) -> SavepointManifest:
    """Validate a ``_metadata`` file's bytes; each way it can be wrong has its own error."""
    try:
        raw: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestCorruptError(
            f"{where} is not valid JSON: {exc}", "the savepoint is damaged; use another savepoint"
        ) from exc
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise ManifestCorruptError(
            f"{where} is not an airflow-savepoints manifest (format marker {raw.get('format') if isinstance(raw, dict) else None!r})",
            "point at a savepoint directory written by airflow-savepoints, or its _metadata file",
        )
    version = raw.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise ManifestCorruptError(f"{where} has no valid format_version", "the savepoint is damaged")
    if version > MANIFEST_VERSION:
        raise ManifestVersionError(
            f"{where} has format version {version}, newer than this release understands ({MANIFEST_VERSION})",
            "upgrade airflow-savepoints to a release that reads this format",
        )
    try:
        return SavepointManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first.get("loc", ()))
        raise ManifestCorruptError(
            f"{where} is not a valid manifest: {field}: {first.get('msg')}", "the savepoint is damaged"
        ) from exc


def read_manifest(location: Store) -> SavepointManifest:
    where = location.url_of(MANIFEST_FILE)
    try:
        data = location.read_bytes(MANIFEST_FILE)
    except FileNotFoundError as exc:
        raise IncompleteSavepointError(
            f"{location.url} has no {MANIFEST_FILE}: it is an incomplete savepoint (a trigger failed or is "
            "still running) or not a savepoint at all",
            "list the job's savepoints and pick a completed one",
        ) from exc
    except (CredentialsError, MissingBackendError, UnknownSchemeError):
        raise
    except Exception as exc:  # noqa: BLE001 - any other read failure is reported as unreadable
        detail = exc.message if isinstance(exc, StorageError) else str(exc)
        raise ManifestUnreadableError(f"cannot read {where}: {detail}", "check access to the store and retry") from exc
    return parse_manifest(data, where)


def resolve_pointer(pointer: str, storage_options: dict[str, Any] | None = None) -> tuple[Store, SavepointManifest]:
    """A savepoint directory or its ``_metadata`` file -> (the directory's store, its manifest)."""
    store = Store(pointer, storage_options)
    if store.name == MANIFEST_FILE:
        store = store.parent()
    if not store.exists():
        raise SavepointNotFoundError(
            f"no savepoint at {store.url}: nothing exists there", "check the pointer (list the job's savepoints)"
        )
    if store.isfile():
        raise SavepointNotFoundError(
            f"{store.url} is a file, not a savepoint directory or its {MANIFEST_FILE}",
            "point at the savepoint-<id>-<random> directory or its _metadata file",
        )
    return store, read_manifest(store)


def refuse_symlinks(store: Store, what: str) -> None:
    """A savepoint is self-contained: no symbolic link goes into one, none comes out of one."""
    links = store.symlinks()
    if links:
        named = ", ".join(store.url_of(link) for link in links[:5])
        raise SymlinkError(
            f"the {what} {store.url} contains symbolic links, which are refused: {named}",
            "savepoints hold only regular files; replace each link by the file itself (or remove it) and retry",
        )


def savepoint_info(location: Store, manifest: SavepointManifest) -> SavepointInfo:
    return SavepointInfo(pointer=location.url, manifest=manifest)


def list_savepoints(root: Store, job: str, states: set[SavepointState] | None = None) -> list[SavepointRecord]:
    """The job's savepoints from its catalog, oldest first (one read, however many there are)."""
    return Catalog(root.child(validate_job_name(job)), job).records(states)


def latest_savepoint(root: Store, job: str) -> SavepointInfo | None:
    """The newest completed savepoint of ``job`` whose ``_metadata`` reads; None if it has none."""
    return Catalog(root.child(validate_job_name(job)), job).latest()


def list_jobs(root: Store) -> list[str]:
    """Names of the job folders under the savepoint root (one listing; also jobs that have ended)."""
    return sorted(name for name in root.listdir() if JOB_NAME.match(name) and ".." not in name)


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
