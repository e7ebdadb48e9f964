"""The savepoint engine: usable from plain Python and the CLI; never imports Airflow."""

from airflow_savepoints.core.dispose import dispose_savepoint
from airflow_savepoints.core.models import SavepointInfo, SavepointManifest, SavepointSummary, SavepointType
from airflow_savepoints.core.pointer import list_savepoints, resolve_pointer
from airflow_savepoints.core.restore import RestoreRequest, restore_savepoint, verify_savepoint
from airflow_savepoints.core.savepoint import SavepointRequest, run_savepoint, take_savepoint

__all__ = [
    "RestoreRequest",
    "SavepointInfo",
    "SavepointManifest",
    "SavepointRequest",
    "SavepointSummary",
    "SavepointType",
    "dispose_savepoint",
    "list_savepoints",
    "resolve_pointer",
    "restore_savepoint",
    "run_savepoint",
    "take_savepoint",
    "verify_savepoint",
]
