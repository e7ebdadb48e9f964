"""The savepoint engine: usable from plain Python and the CLI; never imports Airflow."""

from airflow_savepoints.core.dispose import dispose_savepoint
from airflow_savepoints.core.models import SavepointInfo, SavepointManifest, SavepointType
from airflow_savepoints.core.pointer import list_savepoints, resolve_pointer
from airflow_savepoints.core.restore import restore_savepoint, verify_savepoint
from airflow_savepoints.core.savepoint import take_savepoint

__all__ = [
    "SavepointInfo",
    "SavepointManifest",
    "SavepointType",
    "dispose_savepoint",
    "list_savepoints",
    "resolve_pointer",
    "restore_savepoint",
    "take_savepoint",
    "verify_savepoint",
]
