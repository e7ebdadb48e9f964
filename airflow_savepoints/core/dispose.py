"""Dispose a savepoint: only a real savepoint (valid ``_metadata``) inside its savepoint root."""

from __future__ import annotations

from typing import Any

from airflow_savepoints.core.models import MANIFEST_FILE, SavepointInfo
from airflow_savepoints.core.pointer import SAVEPOINT_NAME, resolve_pointer, savepoint_info
from airflow_savepoints.core.settings import configured_savepoint_dir
from airflow_savepoints.errors import OutsideRootError
from airflow_savepoints.storage import Store


def dispose_savepoint(pointer: str, *, savepoint_dir: str | None = None,
                      storage_options: dict[str, Any] | None = None) -> SavepointInfo:
    """Delete the savepoint at ``pointer``: ``_metadata`` first (so it is never half listed), then the rest."""
    location, manifest = resolve_pointer(pointer, storage_options)
    job_folder = location.parent()
    if not SAVEPOINT_NAME.match(location.name) or job_folder.name != manifest.job:
        raise OutsideRootError(
            f"{location.url} is not laid out as <dir>/<job>/savepoint-<id>-<random>",
            "dispose only savepoints this tool wrote, by their pointer",
        )
    root_url = savepoint_dir or configured_savepoint_dir()
    if root_url:
        root = Store(root_url, storage_options)
        if not root.contains(location) or root.root == location.root:
            raise OutsideRootError(
                f"{location.url} is outside the savepoint directory {root.url}",
                "pass --dir with the savepoint directory that holds it",
            )
    info = savepoint_info(location, manifest)
    location.remove_file(MANIFEST_FILE)
    job_folder.remove_tree(location.name)
    return info
