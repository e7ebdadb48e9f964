"""Savepoint storage connection: an fsspec URL plus storage options, turned into a :class:`Store`."""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseHook, conf
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.sdk.log import mask_secret

from airflow_savepoints.core.redaction import SECRET_KEY_WORDS
from airflow_savepoints.core.settings import DIR_OPTION, SECTION
from airflow_savepoints.errors import InvalidInputError, NoSavepointDirError
from airflow_savepoints.storage import Store

SECRET_OPTION_WORDS = tuple(sorted(SECRET_KEY_WORDS))  # one list for the package (core/redaction.py)


class SavepointStorageHook(BaseHook):
    """Connection type ``savepoints``.

    ``host`` is the savepoint directory (``s3://bucket/savepoints``), ``login``/``password`` are
    S3-style access keys (optional), ``extra`` holds fsspec storage options as JSON. Without the
    connection, the ``[savepoints] savepoint_dir`` option and fsspec's own configuration are used.

    :param savepoints_conn_id: the connection id (default ``savepoints_default``)
    """

    conn_name_attr = "savepoints_conn_id"
    default_conn_name = "savepoints_default"
    conn_type = "savepoints"
    hook_name = "Savepoint Storage"

    def __init__(self, savepoints_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.savepoints_conn_id = savepoints_conn_id

    def connection(self):
        """The connection; None when none is named or the default one does not exist."""
        if not self.savepoints_conn_id:
            return None
        try:
            return self.get_connection(self.savepoints_conn_id)
        except AirflowNotFoundException:
            if self.savepoints_conn_id != self.default_conn_name:
                raise
            return None  # no default connection: configuration and fsspec's own settings apply

    def storage_options(self) -> dict[str, Any]:
        """fsspec storage options from the connection; secret values are masked in task logs."""
        connection = self.connection()
        if connection is None:
            return {}
        options = self._extra_options(connection.extra or "{}")
        if connection.login:
            options.setdefault("key", connection.login)
        if connection.password:
            options.setdefault("secret", connection.password)
        for name, value in options.items():
            if isinstance(value, str) and any(word in name.lower() for word in SECRET_OPTION_WORDS):
                mask_secret(value)  # no name: Airflow masks a named value only if IT deems the name secret
        return options

    def _extra_options(self, extra: str | dict[str, Any]) -> dict[str, Any]:
        """The fsspec options in a connection's extra: the JSON object itself, or its ``storage_options``."""
        try:
            parsed = json.loads(extra) if isinstance(extra, str) else extra
        except ValueError:
            parsed, problem = None, "is not JSON"
        else:
            problem = "is not a JSON object of storage options"
        options = None
        if isinstance(parsed, dict):
            rest = {k: v for k, v in parsed.items() if k != "storage_options"}
            options = parsed.get("storage_options") or rest
        if not isinstance(options, dict):
            raise InvalidInputError(
                f"the extra field of connection '{self.savepoints_conn_id}' {problem}",
                'put fsspec storage options as a JSON object in the connection\'s extra, e.g. '
                '{"client_kwargs": {"endpoint_url": "https://minio:9000"}}',
            )
        return dict(options)

    def savepoint_dir(self, override: str | None = None) -> str:
        """The savepoint directory: ``override``, else the connection's host, else configuration."""
        if override:
            return override
        connection = self.connection()
        if connection is not None and connection.host:
            return connection.host
        configured = conf.get(SECTION, DIR_OPTION, fallback="") or ""
        if configured.strip():
            return configured.strip()
        raise NoSavepointDirError(
            "no savepoint directory: none given, no host in the connection, none configured",
            f"pass savepoint_dir=, set the host of connection '{self.savepoints_conn_id}', or "
            f"[{SECTION}] {DIR_OPTION} (AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR)",
        )

    def get_store(self, savepoint_dir: str | None = None) -> Store:
        return Store(self.savepoint_dir(savepoint_dir), self.storage_options())

    def test_connection(self) -> tuple[bool, str]:
        try:
            store = self.get_store()
            store.listdir()
        except Exception as exc:  # noqa: BLE001 - reported to the UI
            return False, str(exc)
        return True, f"listed {store.url}"
