"""The savepoint engine: usable from plain Python and the CLI; never imports Airflow.

The names below are imported on first use (PEP 562), so a caller pays only for the modules it uses
(a CLI command that lists savepoints does not import the restore or the copy code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_savepoints._lazy import lazy_names

if TYPE_CHECKING:
    from airflow_savepoints.core.dispose import dispose_savepoint
    from airflow_savepoints.core.manifest import resolve_pointer
    from airflow_savepoints.core.models import SavepointInfo, SavepointManifest, SavepointSummary, SavepointType
    from airflow_savepoints.core.pointer import list_savepoints
    from airflow_savepoints.core.restore import RestoreRequest, restore_savepoint
    from airflow_savepoints.core.savepoint import SavepointRequest, run_savepoint, take_savepoint
    from airflow_savepoints.core.verify import verify_savepoint

_MODULE_OF = {
    "dispose_savepoint": "dispose",
    "SavepointInfo": "models", "SavepointManifest": "models", "SavepointSummary": "models", "SavepointType": "models",
    "list_savepoints": "pointer", "resolve_pointer": "manifest",
    "RestoreRequest": "restore", "restore_savepoint": "restore", "verify_savepoint": "verify",
    "SavepointRequest": "savepoint", "run_savepoint": "savepoint", "take_savepoint": "savepoint",
}
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)

__all__ = [  # the names of _MODULE_OF
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
