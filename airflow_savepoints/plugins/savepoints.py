"""``SavepointsPlugin``: mounts the savepoint API in the Airflow API server and adds a UI page.

Airflow loads plugins in every component (scheduler, workers, triggerer, ...), so this module
imports nothing heavy: the FastAPI application (:mod:`airflow_savepoints.plugins.api`) is built on
the first request the API server routes to it.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

from airflow_savepoints.plugins.routes import UI_ROUTE, URL_PREFIX


class LazySavepointsApp:
    """An ASGI application that builds the real FastAPI app on its first call."""

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def app(self) -> Any:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    from airflow_savepoints.plugins.api import create_app

                    self._app = create_app()
        return self._app

    async def __call__(self, scope, receive, send) -> None:
        await self.app()(scope, receive, send)


def _base_path() -> str:
    """The path part of ``[api] base_url`` (empty when Airflow is served at the root)."""
    base_url = conf.get("api", "base_url", fallback="") or ""
    return urlsplit(base_url).path.rstrip("/")


class SavepointsPlugin(AirflowPlugin):
    name = "savepoints"
    fastapi_apps = [
        {"app": LazySavepointsApp(), "url_prefix": URL_PREFIX, "name": "Savepoints API"},
    ]
    external_views = [
        {
            "name": "Savepoints",
            "href": f"{_base_path()}{URL_PREFIX}/ui",  # served by the app above; shown in an iframe
            "url_route": UI_ROUTE,
            "destination": "nav",
            "category": "browse",
        },
    ]
