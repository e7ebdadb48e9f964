"""Dispose a savepoint, or discard an incomplete location.

A savepoint is disposed only when it is a real one (valid ``_metadata``) inside its savepoint root.
Order: the catalog record is marked "disposing" (refused while a restore pins it), ``_metadata``
goes (so it is never listed or restored half deleted), then the files, then its state summary
(``_state_summaries/<id>.json``, kept beside it), then the record. Each
storage step is retried; an interrupted disposal leaves an incomplete location that retention
removes as an orphan, and running it again finishes it.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
from typing import Any

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from airflow_savepoints.core.catalog import Catalog
from airflow_savepoints.core.lease import JobLock
from airflow_savepoints.core.manifest import SAVEPOINT_NAME, parse_manifest, savepoint_info
from airflow_savepoints.core.models import SavepointInfo, SavepointManifest
from airflow_savepoints.core.names import MANIFEST_FILE
from airflow_savepoints.core.pointer import refuse_symlinks, resolve_pointer
from airflow_savepoints.core.settings import configured_savepoint_dir
from airflow_savepoints.core.state_summary import remove_summary
from airflow_savepoints.errors import (
    CredentialsError,
    OutsideRootError,
    StorageError,
    StoragePermissionError,
)
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

_storage_retry = retry(
    retry=retry_if_exception(lambda exc: isinstance(exc, StorageError)
                             and not isinstance(exc, CredentialsError | StoragePermissionError | OutsideRootError)),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.5, max=8),
    reraise=True,
)


def check_under_root(location: Store, manifest: SavepointManifest, root: Store | None) -> None:
    """A savepoint this tool wrote: ``<root>/<job>/savepoint-…`` with a matching manifest."""
    job_folder = location.parent()
    if not SAVEPOINT_NAME.match(location.name) or job_folder.name != manifest.job or manifest.savepoint_id != location.name:
        raise OutsideRootError(
            f"{location.url} is not laid out as <dir>/<job>/savepoint-<id>-<random>",
            "dispose only savepoints this tool wrote, by their pointer",
        )
    if root is not None and (not root.contains(location) or root.root == location.root or job_folder.parent().root != root.root):
        raise OutsideRootError(
            f"{location.url} is outside the savepoint directory {root.url}",
            "pass --dir with the savepoint directory that holds it",
        )
    check_no_link(location, root.root if root is not None else job_folder.parent().root)
    refuse_symlinks(location, "savepoint")


def check_no_link(location: Store, root: str) -> None:
    """Locally, ``<root>/<job>/<savepoint>`` must be real folders: deleting through a symbolic link
    (the savepoint folder or its job folder) would remove files outside the savepoint directory.
    The root itself may be a link (``/data/savepoints -> /mnt/disk1/savepoints``)."""
    if not location.is_local:
        return
    rel = location.root[len(root.rstrip("/")) + 1:] if location.root.startswith(root.rstrip("/") + "/") else None
    real = location.real_path(location.root)
    if rel is None or real != posixpath.join(location.real_path(root), rel):
        raise OutsideRootError(
            f"{location.url} goes through a symbolic link (it is really {real}): refusing to delete through it",
            f"remove the link by hand; savepoints are only deleted at their real place below {root}",
        )


def dispose_savepoint(pointer: str, *, savepoint_dir: str | None = None,
                      storage_options: dict[str, Any] | None = None, by: str = "dispose",
                      why: str | None = None) -> SavepointInfo:
    """Delete the savepoint at ``pointer`` (see the module's docstring for the order); the job's
    history records it as disposed ``by`` (who) for ``why``."""
    location, manifest = resolve_pointer(pointer, storage_options)
    root_url = savepoint_dir or configured_savepoint_dir()
    check_under_root(location, manifest, Store(root_url, storage_options) if root_url else None)
    return dispose_location(location, manifest, by=by, why=why)


def _dispose_secondary(manifest: SavepointManifest) -> None:
    """Remove the savepoint's secondary copy too, when it is reachable from here (best effort: it
    may live on another worker's disk)."""
    if not manifest.secondary:
        return
    try:
        secondary = Store(manifest.secondary)
        if secondary.name == manifest.savepoint_id and SAVEPOINT_NAME.match(secondary.name) and \
                secondary.parent().name == manifest.job:
            # only a real folder <dir>/<job>/<id> whose own _metadata is this savepoint's (the manifest is data: trust no path in it)
            check_no_link(secondary, secondary.parent().parent().root)
            copy = parse_manifest(secondary.read_known(MANIFEST_FILE, "manifest"), secondary.url_of(MANIFEST_FILE))
            if (copy.savepoint_id, copy.job, copy.query_id) != (manifest.savepoint_id, manifest.job, manifest.query_id):
                raise OutsideRootError(f"{secondary.url} holds another savepoint", "left in place")
            secondary.remove_file(MANIFEST_FILE)
            secondary.parent().remove_tree(secondary.name)
    except Exception as exc:  # noqa: BLE001 - the primary is gone; a stray secondary is never restored alone
        log.warning("could not remove the secondary copy %s (%s)", manifest.secondary, exc)


def dispose_location(location: Store, manifest: SavepointManifest, *, by: str = "dispose",
                     why: str | None = None) -> SavepointInfo:
    """Dispose a savepoint already checked to be under its root."""
    job_folder = location.parent()
    catalog = Catalog(job_folder, manifest.job)
    catalog.begin_dispose(location.name)
    _storage_retry(location.remove_file)(MANIFEST_FILE)
    _storage_retry(job_folder.remove_tree)(location.name)
    _storage_retry(remove_summary)(job_folder, location.name)
    _dispose_secondary(manifest)
    _storage_retry(catalog.record_disposed)(location.name, by, why)
    return savepoint_info(location, manifest)


def discard_incomplete(location: Store, *, release_lease: bool = False, quiet: bool = False,
                       own_failed_run: bool = False) -> bool:
    """Remove a savepoint location that has no ``_metadata`` (a failed, killed or orphaned attempt)
    and its catalog record; True if removed. A location with ``_metadata`` is complete: left alone,
    except with ``own_failed_run``: the caller is the run that wrote it and is failing (its
    ``_metadata`` write may have landed although it reported an error), so its caller never sees
    a savepoint complete that it was told had failed.

    ``release_lease``: also remove the job's savepoint lease if this process holds it for this
    location (a killed task). ``quiet``: a failure is logged and the record marked failed, for
    retention to finish (a savepoint's failure path, which raises its own error)."""
    job_folder = location.parent()
    catalog = Catalog(job_folder)
    try:
        if not own_failed_run and location.exists(MANIFEST_FILE):
            return False
        job_folder.remove_tree(location.name)
        remove_summary(job_folder, location.name)
        catalog.forget(location.name)
        if release_lease:
            JobLock.abandon(job_folder, location.name)
        return True
    except Exception:
        if not quiet:
            raise
        log.warning("could not remove incomplete savepoint %s; retention will clean it", location.url)
        with contextlib.suppress(Exception):  # reconcile settles the record later
            catalog.mark_failed(location.name)
        return False
