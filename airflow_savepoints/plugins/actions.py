"""The console's actions: each one is a run of an example DAG, triggered by the browser through
Airflow's own REST API (``POST /api/v2/dags/{dag_id}/dagRuns``), so that Airflow's permissions,
logs, retries and run history apply. The plugin never runs the work itself; it only says which DAG
an action triggers, with which ``conf``, whether that DAG is deployed, and whether the user may
trigger it (the auth manager's own answer for ``POST`` on the DAG's runs).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.configuration import conf

from airflow_savepoints.core.settings import DEFAULTS

log = logging.getLogger(__name__)

# action -> (configuration option naming its DAG, conf keys, stops the job, what it does, optional Params the confirm
# dialog asks for: blank leaves them out of the conf); default DAG ids in core.settings
ACTIONS: dict[str, dict[str, Any]] = {
    "savepoint": {"option": "console_savepoint_dag", "params": [],
                  "stops": False, "label": "Savepoint now",
                  "says": "takes a periodic savepoint of every job in the DAG's jobs.yaml, then applies retention"},
    "stop": {"option": "console_stop_dag", "params": ["job"],
             "stops": True, "label": "Stop with savepoint",
             "says": "stops the job and takes a final stop savepoint"},
    "restore": {"option": "console_restore_dag", "params": ["job", "pointer"],
                "stops": False, "label": "Restore",
                "says": "starts the job from this savepoint in a fresh checkpoint location",
                "options": [{"param": "state_partitions", "label": "State partitions", "type": "integer", "minimum": 1,
                             "hint": "rescale the state into this many partitions (Spark 4.2, RocksDB state); "
                                     "blank: unchanged"},
                            {"param": "allow_repeats", "label": "Accept repeated batches", "type": "boolean",
                             "hint": "start though the job's at-least-once sink gets the batches after the savepoint "
                                     "again (the sink note above says how many)"}]},
}


def _dag_states(dag_ids: list[str]) -> dict[str, bool]:
    """``{dag_id: is_paused}`` of the DAGs Airflow knows (a missing one is not deployed)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(DagModel.dag_id, DagModel.is_paused).where(DagModel.dag_id.in_(dag_ids)))
        return {dag_id: bool(paused) for dag_id, paused in rows}


def _may_trigger(user: Any, dag_id: str) -> bool:
    from airflow.api_fastapi.app import get_auth_manager

    try:
        return bool(get_auth_manager().is_authorized_dag(
            method="POST", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user))
    except Exception:  # noqa: BLE001 - an auth manager that cannot tell refuses
        log.exception("savepoints console: cannot ask the auth manager about DAG %s", dag_id)
        return False


def available_actions(user: Any) -> list[dict[str, Any]]:
    """Each action with its DAG, whether that DAG is deployed (and paused) and whether ``user`` may trigger it."""
    chosen = {name: conf.get("savepoints", spec["option"], fallback="") or DEFAULTS[spec["option"]] for name, spec in ACTIONS.items()}
    deployed = _dag_states(sorted(set(chosen.values())))
    return [{"action": name, "dag_id": chosen[name], "params": spec["params"], "stops_job": spec["stops"],
             "label": spec["label"], "description": spec["says"], "options": spec.get("options", []),
             "deployed": chosen[name] in deployed, "paused": deployed.get(chosen[name]), "allowed": _may_trigger(user, chosen[name])}
            for name, spec in ACTIONS.items()]
