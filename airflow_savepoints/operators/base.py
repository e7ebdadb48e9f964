"""The base of every savepoints operator and sensor, shaped like the Amazon provider's ``AwsBaseOperator``:
a ``savepoints`` connection id, a templated savepoint directory and a hook built once, at run time.

Subclasses list their own templated fields through :func:`savepoints_template_fields`, which adds the
base's; they call the hook (or a core function with the hook's store) in ``execute``, then return or
defer. Nothing here touches a connection before ``execute``: DAG parsing stays free of I/O.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, BaseSensorOperator, conf
from airflow.sdk.exceptions import AirflowFailException

from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.hooks.savepoint import SavepointStorageHook

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger

    from airflow_savepoints.storage import Store

BASE_TEMPLATE_FIELDS = ("savepoints_conn_id", "savepoint_dir")


def rendered_flag(value: Any) -> bool:
    """A boolean given as such or rendered from a template or a Param ("True", "false", "1")."""
    return str(value).strip().lower() in ("true", "1", "yes")


def rendered_count(value: Any, name: str) -> int | None:
    """A whole number given as such or rendered from a template or a Param; empty or "None": not given."""
    if value is None or str(value).strip() in ("", "None", "null"):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise InvalidInputError(f"invalid {name}: {value!r} is not a whole number", f"pass {name} as a number") from None


def savepoints_template_fields(*fields: str) -> tuple[str, ...]:
    """``fields`` followed by the base's templated fields (``savepoints_conn_id``, ``savepoint_dir``), each once."""
    return tuple(dict.fromkeys((*fields, *BASE_TEMPLATE_FIELDS)))


class SavepointsBaseOperator(BaseOperator):
    """Base of the savepoints operators: the connection, the savepoint directory and a cached hook.

    :param savepoints_conn_id: a ``savepoints`` connection: the savepoint directory (host) and the
        storage credentials (templated; default ``savepoints_default``; a missing default connection
        means configuration and fsspec's own settings)
    :param savepoint_dir: the savepoint directory (templated); default: the connection's host, else
        ``[savepoints] savepoint_dir``
    """

    hook_class: type[SavepointStorageHook] = SavepointStorageHook
    template_fields: Sequence[str] = savepoints_template_fields()

    def __init__(self, *, savepoints_conn_id: str | None = SavepointStorageHook.default_conn_name,
                 savepoint_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.savepoints_conn_id = savepoints_conn_id
        self.savepoint_dir = savepoint_dir

    @cached_property
    def hook(self) -> SavepointStorageHook:
        """The storage hook of ``savepoints_conn_id`` (built on first use, after templates are rendered)."""
        return self.hook_class(self.savepoints_conn_id)

    def savepoint_store(self, default_dir: str | None = None) -> Store:
        """The savepoint directory's store: ``savepoint_dir``, else ``default_dir``, else the connection's
        host, else configuration; opened with the connection's storage options."""
        return self.hook.get_store(self.savepoint_dir or default_dir)


class SavepointsBaseSensor(SavepointsBaseOperator, BaseSensorOperator):
    """Base of the savepoints sensors: poke (or reschedule), or defer the wait to the triggerer.

    Subclasses implement ``poke`` and ``_trigger`` (the same wait, as a trigger that carries the
    connection id, never credentials). The deferred wait ends at the sensor's ``timeout``.

    :param deferrable: wait in the triggerer; default ``[operators] default_deferrable``
        (``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE``), as every provider's sensor
    """

    def __init__(self, *, deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable

    def _trigger(self) -> BaseTrigger:
        raise NotImplementedError

    def _end_at(self) -> float | None:
        """The wall-clock deadline of a deferred wait (the sensor's ``timeout`` from now)."""
        return time.time() + self.timeout if self.timeout else None

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(trigger=self._trigger(), method_name="execute_complete",
                   timeout=timedelta(seconds=self.timeout) if self.timeout else None)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if event.get("status") != "success":
            raise AirflowFailException(event.get("message") or "the wait failed")
        return event["result"]
