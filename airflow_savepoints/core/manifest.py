"""Savepoint manifests (``_metadata``): folder names, parsing and reading, each fault its own error, and
pointer resolution (a savepoint directory or its ``_metadata``, like Flink's).

The catalog and the pointer functions both read manifests through this module. It imports no catalog, lease
or copy code: what ``show``, ``verify`` and ``offsets`` need, and no more (tests/unit/cli/test_import_budget.py).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from pydantic import ValidationError

from airflow_savepoints.core.models import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    SavepointInfo,
    SavepointManifest,
)
from airflow_savepoints.core.names import MANIFEST_FILE
from airflow_savepoints.errors import (
    CredentialsError,
    IncompleteSavepointError,
    MalformedFileError,
    ManifestCorruptError,
    ManifestUnreadableError,
    ManifestVersionError,
    MissingBackendError,
    SavepointNotFoundError,
    StorageError,
    SymlinkError,
    UnknownSchemeError,
    UnsafeFileError,
)
from airflow_savepoints.storage import Store
from airflow_savepoints.storage.known_files import parse_json

SAVEPOINT_NAME = re.compile(r"^savepoint-[0-9A-Za-z-]{1,6}-[0-9a-f]{12}\Z")  # \Z: not "$", which allows a final newline


# What a folder with a bad ``_metadata`` raises: a command over many folders (retention, the catalog's
# rebuild) skips that folder with a warning instead of failing for the whole job.
BAD_MANIFEST = (ManifestCorruptError, ManifestVersionError, UnsafeFileError)


def new_savepoint_id(query_id: str) -> str:
    """``savepoint-<query id[0:6]>-<random>``, after Flink's ``savepoint-<jobid[0:6]>-<random>``."""
    prefix = re.sub(r"[^0-9A-Za-z-]", "", query_id)[:6] or "query"
    return f"savepoint-{prefix[:6]}-{secrets.token_hex(6)}"


def parse_manifest(data: bytes, where: str) -> SavepointManifest:
    """Validate a ``_metadata`` file's bytes; each way it can be wrong has its own error."""
    try:  # as a rule, a valid manifest in one pass of pydantic's JSON parser; anything wrong is told apart below
        manifest = SavepointManifest.model_validate_json(data, strict=True)  # strict: what the checks below would refuse
    except Exception:  # noqa: BLE001 - whatever it is, the checks below name it as before
        pass
    else:  # its format marker and version written, not defaulted: the checks below refuse a file without them
        if {"format", "format_version"} <= manifest.model_fields_set and 1 <= manifest.format_version <= MANIFEST_VERSION:
            return manifest
    try:
        raw: Any = parse_json(data, where)  # "[" * 200000 included
    except MalformedFileError as exc:
        raise ManifestCorruptError(exc.message, "the savepoint is damaged; use another savepoint") from exc
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
        data = location.read_known(MANIFEST_FILE, "manifest")
    except FileNotFoundError as exc:
        raise IncompleteSavepointError(
            f"{location.url} has no {MANIFEST_FILE}: it is an incomplete savepoint (a trigger failed or is "
            "still running) or not a savepoint at all",
            "list the job's savepoints and pick a completed one",
        ) from exc
    except (CredentialsError, MissingBackendError, UnknownSchemeError, UnsafeFileError):
        raise  # UnsafeFileError: a link, a FIFO, a folder or an oversize file in its place, named
    except Exception as exc:  # noqa: BLE001 - any other read failure is reported as unreadable
        detail = exc.message if isinstance(exc, StorageError) else str(exc)
        raise ManifestUnreadableError(f"cannot read {where}: {detail}", "check access to the store and retry") from exc
    return parse_manifest(data, where)


def savepoint_info(location: Store, manifest: SavepointManifest) -> SavepointInfo:
    return SavepointInfo(pointer=location.url, manifest=manifest)


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
