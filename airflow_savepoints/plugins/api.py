"""The savepoint API served inside the Airflow API server (mounted at ``/savepoints``).

Read-only and thin: the savepoint root comes from the ``savepoints_default`` connection (its host)
or ``[savepoints] savepoint_dir``; savepoints come from the core (``list_savepoints``,
``read_manifest``), job states from the job lifecycle's ``status``, and the console's summaries
from :mod:`airflow_savepoints.plugins.console`. No request parameter names a location: a job name
and a savepoint id are validated and only ever taken as one folder name below the root. Storage
calls run in the plugin's own threads and wait at most ``[savepoints] api_timeout`` seconds.

Every route requires an authenticated Airflow user allowed to read DAGs and their XComs (the
savepoint DAGs publish the same pointers as XComs): Airflow's own dependency
(``requires_access_dag``) reads the JWT from the ``Authorization: Bearer`` header or the UI's
``_token`` cookie. Errors are JSON: ``{"error": {"code", "message", "hint"}}``; a browser opening
the page without a login is sent to Airflow's login page instead."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.configuration import conf
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_savepoints.core.catalog import SavepointRecord, SavepointState
from airflow_savepoints.core.dispose import check_no_link
from airflow_savepoints.core.models import validate_job_name
from airflow_savepoints.core.pointer import SAVEPOINT_NAME, list_jobs, list_savepoints, read_manifest
from airflow_savepoints.core.redaction import redact_conf
from airflow_savepoints.core.settings import DEFAULTS
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
from airflow_savepoints.jobs.description.metrics import DECISIONS_KEPT, DEFAULT_KEEP
from airflow_savepoints.plugins.actions import available_actions
from airflow_savepoints.plugins.console import (
    declared_job_without_folder,
    job_history,
    job_metrics,
    overview,
    page_of,
    periodic_interval_s,
    savepoint_detail,
)
from airflow_savepoints.plugins.page import page_refusal, render_page, script, wants_page
from airflow_savepoints.plugins.routes import URL_PREFIX
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

CHART_POINTS = 120  # the metrics route's default: about one point per 3 pixels of the console's charts
USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def http_status(exc: SavepointError) -> int:
    """The HTTP status of a :class:`SavepointError` (most specific class first)."""
    table: list[tuple[type[SavepointError] | tuple[type[SavepointError], ...], int]] = [
        ((NoSavepointDirError, ConfigurationError), 503),  # the deployment is not (well) configured
        ((InvalidInputError, OutsideRootError), 400),
        ((SavepointNotFoundError, IncompleteSavepointError), 404),
        (SavepointInFlightError, 409),  # the job's catalog stayed locked
        (StoreTimeoutError, 504),  # the store did not answer in time
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
    """Removes credentials from what is sent: secret storage options, ``user:pass@`` in URLs, and the
    secret-looking Spark conf of a job version (``job_version`` of manifests an older release wrote)."""

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
            if {"application", "hash"} <= value.keys() and isinstance(value.get("spark_conf"), dict):  # a job version
                value = {**value, "spark_conf": redact_conf(value["spark_conf"])}
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


class StoreTimeoutError(StorageError):
    code = "store_timeout"


_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="savepoints-api")  # a hung store ties up these, not the server's


def store_timeout() -> float:
    """Seconds a request waits for the store (``[savepoints] api_timeout``, default 10)."""
    return conf.getfloat("savepoints", "api_timeout", fallback=float(DEFAULTS["api_timeout"]))


def jobs_file() -> str | None:
    """The jobs file the example DAGs use: ``$SAVEPOINTS_JOBS_FILE``, ``[savepoints] jobs_file``, or ``<dags_folder>/jobs.yaml``."""
    configured = os.environ.get("SAVEPOINTS_JOBS_FILE") or conf.get("savepoints", "jobs_file", fallback="")
    if configured:
        return configured
    dags_folder = conf.get("core", "dags_folder", fallback="")
    return os.path.join(dags_folder, "jobs.yaml") if dags_folder else None


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


async def answer(request: Request, work: Callable[[SavepointRoot], Any]) -> JSONResponse:
    """Resolve the root and run ``work(root)`` in the plugin's threads; a store that does not answer
    within :func:`store_timeout` is a 504 ``store_timeout`` (the thread is left to finish on its own)."""
    seen: dict[str, SavepointRoot] = {}

    def run() -> Any:
        root = seen["root"] = _root_or_error()
        request.state.savepoints_scrub = root.scrub
        return work(root)

    timeout = store_timeout()
    try:
        data = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(_POOL, run), timeout)
    except TimeoutError:
        where = seen["root"].store.url if "root" in seen else "the savepoint root's connection"
        raise StoreTimeoutError(
            f"the savepoint store did not answer within {timeout:g} s ({where})",
            "check that the store is reachable from the API server (endpoint, network, credentials) and retry; "
            "[savepoints] api_timeout sets how long to wait",
        ) from None
    return _json(data, seen["root"].scrub)


def _savepoint_record(root: SavepointRoot, job: str, savepoint_id: str) -> SavepointRecord:
    validate_job_name(job)
    if not SAVEPOINT_NAME.match(savepoint_id):
        raise InvalidSavepointIdError(
            f"invalid savepoint id {savepoint_id!r}",
            "a savepoint id looks like savepoint-<query id[0:6]>-<12 hex digits>",
        )
    root.job(job)
    found = [r for r in list_savepoints(root.store, job) if r.savepoint_id == savepoint_id]
    if not found:
        raise SavepointNotFoundError(
            f"job '{job}' has no savepoint '{savepoint_id}'",
            f"list the job's savepoints (GET .../savepoints/api/jobs/{job}/savepoints)",
        )
    return found[-1]


def savepoint_answer(root: SavepointRoot, job: str, savepoint_id: str, verify: bool) -> dict[str, Any]:
    """One savepoint: its record, its manifest (without the file list) and the detail view's facts."""
    record = _savepoint_record(root, job, savepoint_id)
    manifest, manifest_error = None, None
    if record.state == SavepointState.COMPLETED:
        try:
            manifest = read_manifest(root.store.child(job).child(savepoint_id))
        except SavepointError as exc:
            manifest_error = exc.to_dict()
    return {"job": job, "savepoint": record.summary(),
            "manifest": manifest.model_dump(mode="json", exclude={"files"}) if manifest else None,
            "manifest_error": manifest_error,
            "detail": savepoint_detail(root.store, job, record, manifest, verify, jobs_file())}


def _register_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SavepointError)
    async def savepoint_error(request: Request, exc: SavepointError) -> JSONResponse:
        scrub = getattr(request.state, "savepoints_scrub", None) or Scrubber()
        return _json({"error": exc.to_dict()}, scrub, http_status(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code in (401, 403) and wants_page(request):
            return page_refusal(request, exc.status_code)
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
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()))
        return JSONResponse(error_body("invalid_input", f"invalid request parameters: {where}: {first.get('msg', '')}",
                                       "see docs/api.md for the parameters"), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("savepoints plugin: unexpected error")
        return JSONResponse(error_body("internal_error", f"unexpected {type(exc).__name__}",
                                       "see the API server log"), status_code=500)


def _register_api(app: FastAPI) -> None:
    @app.get("/api/jobs")
    async def jobs(request: Request) -> JSONResponse:
        """Job folders under the savepoint root (also of jobs that have ended); files are not jobs."""
        return await answer(request, lambda root: {"root": root.store.url, "jobs": list_jobs(root.store)})

    @app.get("/api/overview")
    async def jobs_overview(request: Request) -> JSONResponse:
        """One summary per job: lifecycle state, newest savepoint and its age, counts, size."""
        interval = periodic_interval_s(conf.get("savepoints", "periodic_interval", fallback="") or None)
        return await answer(request, lambda root: overview(root.store, interval_s=interval, jobs_file=jobs_file()))

    @app.get("/api/jobs/{job}/savepoints")
    async def savepoints(request: Request, job: str, offset: int = Query(0, ge=0),
                         limit: int | None = Query(None, ge=1, le=1000),
                         order: Literal["oldest", "newest"] = "oldest") -> JSONResponse:
        """The job's savepoints (records of its catalog), oldest first unless ``order=newest``; paged with offset/limit."""
        def work(root: SavepointRoot) -> dict[str, Any]:
            validate_job_name(job)
            declared = declared_job_without_folder(root.store, job, jobs_file())
            if not declared:
                root.job(job)
            records = [] if declared else list_savepoints(root.store, job)
            return {"job": job, **(declared or {}), **page_of(records, offset, limit, order == "newest")}
        return await answer(request, work)

    @app.get("/api/jobs/{job}/history")
    async def history(request: Request, job: str) -> JSONResponse:
        """The job's savepoint attempts, newest first (the catalog keeps the last 100), and its newest
        savepoint's state per operator."""
        def work(root: SavepointRoot) -> dict[str, Any]:
            validate_job_name(job)
            declared = declared_job_without_folder(root.store, job, jobs_file())
            if declared:
                return {**declared, "total": 0, "history": [], "operators": None}
            root.job(job)
            return job_history(root.store, job)
        return await answer(request, work)

    @app.get("/api/jobs/{job}/metrics")
    async def metrics(request: Request, job: str, points: int = Query(CHART_POINTS, ge=2, le=DEFAULT_KEEP),
                      decisions: int = Query(20, ge=1, le=DECISIONS_KEPT)) -> JSONResponse:
        """The job's metric series for the console's charts (at most ``points`` points: consecutive batches
        merged) and its newest ``decisions`` autoscale decisions, newest first."""
        def work(root: SavepointRoot) -> dict[str, Any]:
            validate_job_name(job)
            declared = declared_job_without_folder(root.store, job, jobs_file())
            folder = root.store.child(job) if declared else root.job(job)
            return {**job_metrics(folder, job, points, decisions), **(declared or {})}
        return await answer(request, work)

    @app.get("/api/jobs/{job}/savepoints/{savepoint_id}")
    async def savepoint(request: Request, job: str, savepoint_id: str, verify: bool = False) -> JSONResponse:
        """One savepoint; ``verify=true`` reads every file again and compares its checksum."""
        return await answer(request, lambda root: savepoint_answer(root, job, savepoint_id, verify))

    @app.get("/api/actions")
    def actions(user: GetUserDep) -> JSONResponse:
        """The console's actions: the DAG each triggers, whether it is deployed and whether this user may trigger it."""
        return JSONResponse({"actions": available_actions(user)})


def create_app() -> FastAPI:
    authorized = Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))
    app = FastAPI(
        title="airflow-savepoints",
        description="Savepoints of Spark Structured Streaming jobs (read-only).",
        dependencies=[authorized],
        docs_url=None, redoc_url=None, openapi_url=None,
    )
    _register_error_handlers(app)
    _register_api(app)

    @app.get("/ui", response_class=HTMLResponse)
    def page(request: Request) -> HTMLResponse:
        """The savepoints console the Airflow UI shows in an iframe (Browse > Savepoints)."""
        root_path = request.scope.get("root_path", "").rstrip("/")
        airflow_base = root_path[: -len(URL_PREFIX)] if root_path.endswith(URL_PREFIX) else ""
        return HTMLResponse(render_page({"api": root_path + "/api", "airflow": airflow_base}, root_path + "/static/console.js"),
                            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    @app.get("/static/console.js")
    def console_script() -> Response:
        """The console's JavaScript (package data); the page asks for it with its content's hash."""
        body, _ = script()
        return Response(body, media_type="text/javascript; charset=utf-8",
                        headers={"Cache-Control": "private, max-age=86400", "X-Content-Type-Options": "nosniff"})

    return app
