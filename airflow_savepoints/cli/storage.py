"""How every CLI command reaches savepoint storage: the way the operators do.

A connection is used only when one is named: ``--conn-id``, else ``[savepoints] conn_id``
(``AIRFLOW__SAVEPOINTS__CONN_ID`` or airflow.cfg, read without importing Airflow), else
``savepoints_default`` when ``AIRFLOW_CONN_SAVEPOINTS_DEFAULT`` defines it. Only then is Airflow
imported: :class:`SavepointStorageHook` gives the directory (``--dir``, else the connection's host,
else ``[savepoints] savepoint_dir``) and the credentials (login/password/extra as fsspec storage
options). Without a connection: ``--dir``, else the configured directory, and fsspec's own
configuration (environment variables, ``~/.config/fsspec``). ``--conn-id ''`` names none.

A named connection is looked up as the ``airflow`` CLI does: environment variables (``AIRFLOW_CONN_*``),
the configured secrets backend, then the metadata database, but only a database that exists: a
lookup never creates one.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_savepoints.core.settings import CONN_OPTION, SECTION, configured_option, resolve_savepoint_dir
from airflow_savepoints.errors import InvalidInputError, NoSavepointDirError, SavepointDirNotFoundError

if TYPE_CHECKING:
    from airflow_savepoints.storage import Store

DEFAULT_CONN_ID = "savepoints_default"


def airflow_importable() -> bool:
    """Whether Airflow is installed; not imported here (importing it reads its configuration and may fail)."""
    return importlib.util.find_spec("airflow") is not None


def named_connection(conn_id: str | None) -> str | None:
    """The connection a command uses: ``--conn-id``, else ``[savepoints] conn_id``, else ``savepoints_default``
    when the environment defines it; None (also for ``--conn-id ''``): no connection, Airflow is not imported."""
    if conn_id is not None:
        return conn_id.strip() or None
    configured = configured_option(CONN_OPTION)
    if configured:
        return configured
    return DEFAULT_CONN_ID if os.environ.get(f"AIRFLOW_CONN_{DEFAULT_CONN_ID.upper()}") else None


def _metadata_db_exists() -> bool:
    """Whether Airflow's metadata database is there to ask: a SQLite file that does not exist is not (asking creates it)."""
    from airflow.configuration import conf

    url = (conf.get("database", "sql_alchemy_conn", fallback="") or "").strip()
    if not url.startswith("sqlite"):
        return bool(url)
    path = url.partition(":///")[2].partition("?")[0]
    return bool(path) and path != ":memory:" and Path(path).is_file()


@contextlib.contextmanager
def _as_airflow_cli():
    """Look connections up in the metadata database too, as ``airflow connections get`` does, if it exists."""
    saved = os.environ.get("_AIRFLOW_PROCESS_CONTEXT")
    if _metadata_db_exists():
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
    """The hook of the connection ``conn_id``, which must be defined."""
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
            hook.get_connection(conn_id)
        except AirflowNotFoundException:
            raise InvalidInputError(f"the connection '{conn_id}' is not defined",
                                    f"create it (airflow connections add {conn_id} --conn-type savepoints "
                                    f"--conn-host s3://bucket/savepoints), or name another with --conn-id "
                                    f"(or [{SECTION}] {CONN_OPTION}), or --conn-id '' for none") from None
    return hook


def storage_hook(conn_id: str | None):
    """The hook of the connection the command uses (see :func:`named_connection`); None: no connection."""
    named = named_connection(conn_id)
    if named is None:
        return None
    if not airflow_importable():
        raise InvalidInputError(f"connection {named}: Airflow is not installed here, so there are no connections",
                                "install apache-airflow, or pass --conn-id '' and --dir, with the storage options "
                                "in fsspec's configuration")
    try:
        return _lookup(named)
    except InvalidInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - Airflow itself could not look connections up here
        if conn_id is None and not configured_option(CONN_OPTION):  # only the environment's default: not asked for
            logging.getLogger(__name__).warning(
                "connection %s (AIRFLOW_CONN_%s) not used: Airflow could not look it up here (%s: %s); storage "
                "options come from fsspec's configuration and the environment", named, named.upper(),
                type(exc).__name__, str(exc)[:200])
            return None
        raise InvalidInputError(f"connection {named}: Airflow could not look it up here: "
                                f"{type(exc).__name__}: {str(exc)[:300]}",
                                "check AIRFLOW_HOME and the metadata database settings, or define the connection "
                                f"as AIRFLOW_CONN_{named.upper()}, or pass --conn-id '' and --dir instead") from exc


def storage_options(conn_id: str | None) -> dict[str, Any]:
    """fsspec storage options of the connection (for savepoint pointers); empty without one."""
    hook = storage_hook(conn_id)
    if hook is None:
        return {}
    with _as_airflow_cli():
        return hook.storage_options()


freeze_after_open = False  # set by the console script's entry point, a process that exits after one command


def open_root(conn_id: str | None, savepoint_dir: str | None, *, must_exist: bool = False, required: bool = True) -> Store | None:
    """The savepoint directory of a command, as a :class:`Store` with the connection's credentials.

    ``must_exist``: a directory that does not exist is an error (commands that only read it).
    ``required=False``: None instead of an error when no directory is given or configured.
    """
    if freeze_after_open:  # the console script: no collection while the store's client library (and Airflow for a
        gc.disable()  # named connection) is imported, its objects then frozen out of every later collection's way
    try:  # (gc's documented disable-freeze-enable; never in a long-lived process that calls in)
        from airflow_savepoints.storage import Store

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
    finally:
        if freeze_after_open:
            gc.freeze()
            gc.enable()
    if must_exist and not root.isdir():
        raise SavepointDirNotFoundError(f"the savepoint directory {root.url} does not exist",
                                  "check --dir / --conn-id (a typo?); it is created by the first savepoint")
    return root
