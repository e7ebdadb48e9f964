"""The savepoint API served inside the Airflow API server (mounted at ``/savepoints``).

Read-only and thin: the savepoint root comes from the ``savepoints_default`` connection (its host)
or ``[savepoints] savepoint_dir``; jobs and savepoints come from the core (``list_jobs``,
``list_savepoints``, ``read_manifest``). No request parameter names a location: a job name and a
savepoint id are validated and only ever taken as one folder name below the root.

Every route requires an authenticated Airflow user allowed to read DAGs and their XComs (the
savepoint DAGs publish the same pointers as XComs): Airflow's own dependency
(``requires_access_dag``) reads the JWT from the ``Authorization: Bearer`` header or the UI's
``_token`` cookie. Errors are JSON: ``{"error": {"code", "message", "hint"}}``.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_savepoints.core.dispose import check_no_link
from airflow_savepoints.core.models import validate_job_name
from airflow_savepoints.core.pointer import SAVEPOINT_NAME, list_jobs, list_savepoints, read_manifest
from airflow_savepoints.errors import (
    ConfigurationError,
    CredentialsError,
    IncompleteSavepointError,
    InvalidInputError,
    InvalidSavepointIdError,
    JobNotFoundError,
    MissingBackendError,
    NoSavepointDirError,
    OutsideRootError,
    SavepointError,
    SavepointInFlightError,
    SavepointNotFoundError,
    StorageError,
    StoragePermissionError,
    UnknownSchemeError,
)
from airflow_savepoints.hooks.savepoint import SECRET_OPTION_WORDS, SavepointStorageHook
from airflow_savepoints.plugins.page import render_page
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def http_status(exc: SavepointError) -> int:
    """The HTTP status of a :class:`SavepointError` (most specific class first)."""
    table: list[tuple[type[SavepointError] | tuple[type[SavepointError], ...], int]] = [
        ((NoSavepointDirError, ConfigurationError), 503),  # the deployment is not (well) configured
        ((InvalidInputError, OutsideRootError), 400),
        ((SavepointNotFoundError, IncompleteSavepointError), 404),
        (SavepointInFlightError, 409),  # the job's catalog stayed locked
        ((MissingBackendError, UnknownSchemeError), 503),
        ((CredentialsError, StoragePermissionError, StorageError), 502),  # the store refused or failed
    ]
    for classes, status in table:
        if isinstance(exc, classes):
            return status
    return 500


def error_body(code: str, message: str, hint: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "hint": hint}}


class Scrubber:
    """Removes credentials from what is sent: secret storage options and ``user:pass@`` in URLs."""

    def __init__(self, storage_options: dict[str, Any] | None = None):
        self.secrets = sorted(
            {str(v) for k, v in (storage_options or {}).items()
             if isinstance(v, str) and len(v) >= 4 and any(w in k.lower() for w in SECRET_OPTION_WORDS)},
            key=len, reverse=True,
        )

    def text(self, value: str) -> str:
        for secret in self.secrets:
            value = value.replace(secret, "***")
        return USERINFO.sub(r"\g<scheme>***@", value)

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        return value


class SavepointRoot:
    """The configured savepoint root for one request, and how to scrub what leaves it."""

    def __init__(self) -> None:
        hook = SavepointStorageHook()
        self.scrub = Scrubber(hook.storage_options())
        self.store: Store = hook.get_store()

    def job(self, job: str) -> Store:
        """The folder of an existing job; 400 for an invalid name, 404 if there is no such folder."""
        validate_job_name(job)
        if not self.store.isdir(job):
            raise JobNotFoundError(
                f"no job '{job}' under the savepoint root {self.store.url}",
                "list the jobs (GET .../savepoints/api/jobs); names are case-sensitive",
            )
        job_store = self.store.child(job)
        check_no_link(job_store, self.store.root)  # a job folder linked into another root is not served
        return job_store


def _json(data: Any, scrub: Scrubber, status: int = 200) -> JSONResponse:
    return JSONResponse(scrub(data), status_code=status)


def _root_or_error() -> SavepointRoot:
    try:
        return SavepointRoot()
    except NoSavepointDirError:
        raise
    except InvalidInputError as exc:  # from the connection or configuration, not from the request
        raise ConfigurationError(exc.message, exc.hint) from exc
    except SavepointError:
        raise
    except Exception as exc:  # a broken connection definition, an unreachable secrets backend
        log.exception("savepoints plugin: cannot resolve the savepoint root")
        raise StorageError(f"cannot resolve the savepoint root: {type(exc).__name__}",
                           "check the savepoints_default connection and [savepoints] savepoint_dir") from exc


def create_app() -> FastAPI:
    authorized = Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))
    app = FastAPI(
        title="airflow-savepoints",
        description="Savepoints of Spark Structured Streaming jobs (read-only).",
        dependencies=[authorized],
        docs_url=None, redoc_url=None, openapi_url=None,
    )

    @app.exception_handler(SavepointError)
    async def savepoint_error(request: Request, exc: SavepointError) -> JSONResponse:
        scrub = getattr(request.state, "savepoints_scrub", None) or Scrubber()
        return _json({"error": exc.to_dict()}, scrub, http_status(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {401: "not_authenticated", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
        hints = {
            401: "log in to Airflow, or send 'Authorization: Bearer <JWT from POST /auth/token>'",
            403: "the token is invalid or your Airflow role may not read DAGs and XComs",
            404: "see docs/api.md for the routes; job names and savepoint ids are single path segments",
        }
        return JSONResponse(error_body(codes.get(exc.status_code, "http_error"), str(exc.detail),
                                       hints.get(exc.status_code)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body("invalid_input", "invalid request parameters", None), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("savepoints plugin: unexpected error")
        return JSONResponse(error_body("internal_error", f"unexpected {type(exc).__name__}",
                                       "see the API server log"), status_code=500)

    @app.get("/api/jobs")
    def jobs(request: Request) -> JSONResponse:
        """Job folders under the savepoint root (also of jobs that have ended)."""
        root = _root_or_error()
        request.state.savepoints_scrub = root.scrub
        return _json({"root": root.store.url, "jobs": list_jobs(root.store)}, root.scrub)

    @app.get("/api/jobs/{job}/savepoints")
    def savepoints(request: Request, job: str) -> JSONResponse:
        """The job's savepoints, oldest first (records of the job's catalog)."""
        root = _root_or_error()
        request.state.savepoints_scrub = root.scrub
        root.job(job)
        records = [record.summary() for record in list_savepoints(root.store, job)]
        return _json({"job": job, "savepoints": records}, root.scrub)

    @app.get("/api/jobs/{job}/savepoints/{savepoint_id}")
    def savepoint(request: Request, job: str, savepoint_id: str) -> JSONResponse:
        """One savepoint: its listing record and, when completed, its manifest (without the file list)."""
        root = _root_or_error()
        request.state.savepoints_scrub = root.scrub
        validate_job_name(job)
        if not SAVEPOINT_NAME.match(savepoint_id):
            raise InvalidSavepointIdError(
                f"invalid savepoint id {savepoint_id!r}",
                "a savepoint id looks like savepoint-<query id[0:6]>-<12 hex digits>",
            )
        job_store = root.job(job)
        found = [r for r in list_savepoints(root.store, job) if r.summary()["savepoint_id"] == savepoint_id]
        if not found:
            raise SavepointNotFoundError(
                f"job '{job}' has no savepoint '{savepoint_id}'",
                f"list the job's savepoints (GET .../savepoints/api/jobs/{job}/savepoints)",
            )
        summary = found[-1].summary()
        manifest, manifest_error = None, None
        if summary.get("state", "completed") == "completed":
            try:
                manifest = read_manifest(job_store.child(savepoint_id)).model_dump(mode="json", exclude={"files"})
            except SavepointError as exc:
                manifest_error = exc.to_dict()
        return _json({"job": job, "savepoint": summary, "manifest": manifest, "manifest_error": manifest_error},
                     root.scrub)

    @app.get("/ui", response_class=HTMLResponse)
    def page(request: Request) -> HTMLResponse:
        """The page the Airflow UI shows in an iframe (Browse > Savepoints)."""
        api_base = request.scope.get("root_path", "").rstrip("/") + "/api"
        return HTMLResponse(render_page(json.dumps(api_base)),
                            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    return app
