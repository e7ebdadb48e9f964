"""How every CLI command reaches savepoint storage: the way the operators do.

With Airflow importable, the connection ``--conn-id`` (default ``savepoints_default`` when it exists)
gives the directory and the credentials, resolved by :class:`SavepointStorageHook` itself: ``--dir``,
else the connection's host, else ``[savepoints] savepoint_dir``; login/password/extra become fsspec
storage options. Without a connection: ``--dir``, else the configured directory, and fsspec's own
configuration (environment variables, ``~/.config/fsspec``).

Connections are looked up as the ``airflow`` CLI does: environment variables (``AIRFLOW_CONN_*``),
the configured secrets backend, then the metadata database. ``--conn-id ''`` skips connections.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from typing import Any

from airflow_savepoints.core.settings import resolve_savepoint_dir
from airflow_savepoints.errors import InvalidInputError, NoSavepointDirError, SavepointDirNotFoundError
from airflow_savepoints.storage import Store

DEFAULT_CONN_ID = "savepoints_default"


def airflow_importable() -> bool:
    """Whether Airflow is installed; not imported here (importing it reads its configuration and may fail)."""
    return importlib.util.find_spec("airflow") is not None


@contextlib.contextmanager
def _as_airflow_cli():
    """Look connections up with the metadata database too, as ``airflow connections get`` does."""
    saved = os.environ.get("_AIRFLOW_PROCESS_CONTEXT")
    os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "server"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("_AIRFLOW_PROCESS_CONTEXT", None)
        else:
            os.environ["_AIRFLOW_PROCESS_CONTEXT"] = saved


def _logs_to_stderr() -> None:
    """Airflow, once imported, logs through a handler on ``sys.stdout``: move it to stderr, so the
    command's own output (one JSON document with ``--json``) is all that stdout carries."""
    for handler in logging.root.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


def _lookup(conn_id: str):
    """The connection (None: the default one is not defined) and its hook."""
    try:
        return _look_up_connection(conn_id)
    finally:
        _logs_to_stderr()


def _look_up_connection(conn_id: str):
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_savepoints.hooks.savepoint import SavepointStorageHook

    hook = SavepointStorageHook(conn_id)
    with _as_airflow_cli():
        try:
            return hook.connection(), hook
        except AirflowNotFoundException:
            raise InvalidInputError(f"the connection '{conn_id}' is not defined",
                                    f"create it (airflow connections add {conn_id} --conn-type savepoints "
                                    f"--conn-host s3://bucket/savepoints) or omit --conn-id") from None


def storage_hook(conn_id: str | None):
    """The hook of ``conn_id`` (or of ``savepoints_default`` if it exists); None: no connection applies.

    ``conn_id == ""`` (``--conn-id ''``): no connection, and Airflow is not even imported (a faster start).
    """
    if conn_id == "":
        return None
    if not airflow_importable():
        if conn_id:
            raise InvalidInputError(f"--conn-id {conn_id}: Airflow is not installed here, so there are no connections",
                                    "install apache-airflow, or pass --dir and set the storage options in fsspec's configuration")
        return None
    try:
        connection, hook = _lookup(conn_id or DEFAULT_CONN_ID)
    except InvalidInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - Airflow itself could not look connections up here
        if not conn_id:
            return None  # the default connection is optional: configuration and fsspec's settings apply
        raise InvalidInputError(f"--conn-id {conn_id}: Airflow could not look the connection up here: "
                                f"{type(exc).__name__}: {str(exc)[:300]}",
                                "check AIRFLOW_HOME and the metadata database settings, or define the connection "
                                f"as AIRFLOW_CONN_{conn_id.upper()}, or pass --dir instead") from exc
    return None if connection is None else hook


def storage_options(conn_id: str | None) -> dict[str, Any]:
    """fsspec storage options of the connection (for savepoint pointers); empty without one."""
    hook = storage_hook(conn_id)
    if hook is None:
        return {}
    with _as_airflow_cli():
        return hook.storage_options()


def open_root(conn_id: str | None, savepoint_dir: str | None, *, must_exist: bool = False, required: bool = True) -> Store | None:
    """The savepoint directory of a command, as a :class:`Store` with the connection's credentials.

    ``must_exist``: a directory that does not exist is an error (commands that only read it).
    ``required=False``: None instead of an error when no directory is given or configured.
    """
    hook = storage_hook(conn_id)
    try:
        if hook is None:
            root = Store(resolve_savepoint_dir(savepoint_dir))
        else:
            with _as_airflow_cli():
                root = hook.get_store(savepoint_dir)
    except NoSavepointDirError:
        if required:
            raise
        return None
    if must_exist and not root.isdir():
        raise SavepointDirNotFoundError(f"the savepoint directory {root.url} does not exist",
                                  "check --dir / --conn-id (a typo?); it is created by the first savepoint")
    return root
