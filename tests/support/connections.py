"""Airflow connections stored in the test's SQLite metadata database (the ``airflow_db`` fixture).

Task code resolves a connection through the Task SDK's secrets backends; outside a worker it reaches
the metadata database only in a server context (``_AIRFLOW_PROCESS_CONTEXT=server``: how the API
server, the scheduler and the triggerer's supervisor run, and what ``airflow connections test`` sets).
"""

from __future__ import annotations

import json
import uuid
from typing import Any


def stored_connection(monkeypatch, *, host: str | None = None, login: str | None = None,
                      password: str | None = None, extra: dict[str, Any] | str | None = None) -> str:
    """A fresh ``savepoints`` connection written to the metadata database; returns its id.

    Sets the server context for the rest of the test, so hooks read connections from the database."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    conn_id = f"savepoints_{uuid.uuid4().hex[:12]}"  # never a cached one
    with create_session() as session:
        session.add(Connection(conn_id=conn_id, conn_type="savepoints", host=host, login=login, password=password,
                               extra=extra if isinstance(extra, str) or extra is None else json.dumps(extra)))
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")
    return conn_id


def bucket_reached_only_with(monkeypatch, endpoint: str, key: str, secret: str) -> str:
    """A fresh bucket on the moto server that only explicit options reach: no keys in the environment or
    a credentials file, no endpoint in fsspec's configuration. Returns the bucket's name."""
    import fsspec

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "FSSPEC_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fsspec.get_filesystem_class("s3").clear_instance_cache()
    bucket = f"unit-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3", key=key, secret=secret, endpoint_url=endpoint, skip_instance_cache=True).mkdir(bucket)
    return bucket
