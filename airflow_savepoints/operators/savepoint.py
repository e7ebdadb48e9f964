"""Operators that take and dispose savepoints (thin: the work is in airflow_savepoints.core)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias

from airflow_savepoints.core import SavepointType, dispose_savepoint, take_savepoint
from airflow_savepoints.core.dispose import discard_incomplete
from airflow_savepoints.core.models import validate_job_name
from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.jobs.description.lease import running_spark_version
from airflow_savepoints.jobs.description.record import read_run, refuse_left_checkpoint
from airflow_savepoints.operators.base import SavepointsBaseOperator, savepoints_template_fields
from airflow_savepoints.operators.links import SavepointsPageLink
from airflow_savepoints.storage import Store

if TYPE_CHECKING:
    from airflow.sdk import Context


def savepoint_asset(job: str) -> Asset:
    """The asset whose events announce a job's new savepoints (``extra`` = the savepoint summary)."""
    return Asset(name=f"savepoints/{job}", uri=f"x-savepoints://{job}", group="savepoints")


SAVEPOINTS_ALIAS = AssetAlias(name="savepoints", group="savepoints")  # events for jobs known only at run time (a templated job)


def savepoint_outlets(job: str, *, only_when_taken: bool = False) -> list[Asset | AssetAlias]:
    """The outlets of a task that announces the job's new savepoints: the job's asset, or the alias when
    the job is templated or the task may end without a savepoint (``only_when_taken``): an alias
    emits an event only for a savepoint taken, a declared asset one for every successful run."""
    return [SAVEPOINTS_ALIAS] if only_when_taken or "{{" in job else [savepoint_asset(job)]


def task_request_id(context: Context) -> str | None:
    """The task instance's identity without its try number: a retried task reuses its savepoint.

    None outside a task instance (an operator executed directly)."""
    ti = context.get("ti")
    if ti is None:
        return None
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{getattr(ti, 'map_index', -1)}"


def _task_name(context: Context, operator: str) -> str:
    """The operator and its task (``dag.task``) for the history; the operator alone outside a task instance."""
    ti = context.get("ti")
    return f"{operator} ({ti.dag_id}.{ti.task_id})" if ti is not None else operator


def checkpoint_options(checkpoint: str, store: Store, given: dict[str, Any] | None) -> dict[str, Any] | None:
    """Storage options for the live checkpoint: as given, else the savepoint store's on the same kind of store."""
    if given is not None:
        return given
    return store.options_for(checkpoint)


def recorded_version(store: Store, job: str, checkpoint: str) -> dict[str, Any] | None:
    """The version the job's recorded run runs, if that run writes ``checkpoint`` (compared without
    a trailing slash); else None (a job started by other means, or another checkpoint)."""
    run = read_run(store.child(job))
    if run is None or not run.checkpoint or run.checkpoint.rstrip("/") != checkpoint.rstrip("/"):
        return None
    return run.version


def recorded_checkpoint(store: Store, job: str, fallback: str | None = None) -> str:
    """The checkpoint of the job's run recorded in its savepoint folder, else ``fallback``."""
    run = read_run(store.child(job))
    if run is None and fallback:
        return fallback
    if run is None:
        raise InvalidInputError(
            f"job '{job}' has no recorded run in {store.url}, so its checkpoint is unknown",
            "pass checkpoint= or fallback_checkpoint=, or start the job with RestoreJobOperator",
        )
    return run.checkpoint


class RemovesPartialSavepoint(SavepointsBaseOperator):
    """Base of operators that write a savepoint: ``on_kill`` removes one still being written; the
    savepoint is announced as an asset event and linked to from the Savepoints page."""

    operator_extra_links = (SavepointsPageLink(),)
    _in_flight: Store | None = None

    def announce(self, context: Context, job: str, summary: dict[str, Any] | None) -> None:
        """An asset event for ``x-savepoints://<job>`` with the savepoint's summary as ``extra``."""
        if summary is None or "outlet_events" not in context:
            return
        for outlet in self.outlets or []:
            if isinstance(outlet, Asset) and outlet.uri == savepoint_asset(job).uri:
                context["outlet_events"][outlet].extra = summary
            elif isinstance(outlet, AssetAlias) and outlet.name == SAVEPOINTS_ALIAS.name:
                context["outlet_events"][outlet].add(savepoint_asset(job), extra=summary)

    def savepoint_events(self, root: Store, job: str) -> Callable[[str, dict[str, Any]], None]:
        """The ``on_event`` hook for ``take_savepoint``: logs progress and tracks the location."""
        def track(event: str, data: dict[str, Any]) -> None:
            if event == "planned":
                self._in_flight = root.child(job).child(data["location"].rsplit("/", 1)[-1])
                self.log.info("savepoint of batch %s: %s files, %s bytes -> %s (attempt %s)",
                              data["batch_id"], data["files"], data["bytes"], data["location"], data["attempt"])
            elif event == "completed":
                self._in_flight = None
        return track

    def on_kill(self) -> None:
        """Remove a savepoint location still being written (it has no _metadata yet) and its lease."""
        location, self._in_flight = self._in_flight, None
        if location is not None and discard_incomplete(location, release_lease=True):
            self.log.info("removed the incomplete savepoint %s", location.url)


class TriggerSavepointOperator(RemovesPartialSavepoint):
    """Take a savepoint of a streaming job's live checkpoint; return its summary (pointer, batch, ...).

    :param job: job name, the folder of its savepoints (templated)
    :param checkpoint: the job's live checkpoint location (templated); default: the checkpoint of
        the job's run recorded by RestoreJobOperator, else ``fallback_checkpoint``. A given checkpoint
        that the recorded run no longer writes is refused (``not_live_checkpoint``)
    :param retired_checkpoint: ``checkpoint`` is one the job has left, asked for on purpose: taken, and
        never a restore default
    :param fallback_checkpoint: the checkpoint when none is given or recorded (a job started by
        other means at its configured location; templated)
    :param savepoint_type: ``periodic`` (default) or ``manual`` (templated)
    :param reason: kept in the manifest (templated)
    :param savepoint_dir: overrides the connection's and the configured directory (templated)
    :param savepoints_conn_id: a ``savepoints`` connection (storage URL and options; templated)
    :param request_id: idempotency key; default: the task instance's identity, so a retry returns
        the savepoint its earlier try took
    :param checkpoint_storage_options: fsspec options for the checkpoint's store (default: the
        savepoint connection's options when both are on the same kind of store)
    """

    template_fields: Sequence[str] = savepoints_template_fields(
        "job", "checkpoint", "fallback_checkpoint", "savepoint_type", "reason", "request_id",
    )
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        job: str,
        checkpoint: str | None = None,
        fallback_checkpoint: str | None = None,
        savepoint_type: str = SavepointType.PERIODIC.value,
        reason: str | None = None,
        request_id: str | None = None,
        checkpoint_storage_options: dict[str, Any] | None = None,
        max_attempts: int = 5,
        parallelism: int | None = None,
        retired_checkpoint: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", savepoint_outlets(job))
        super().__init__(**kwargs)
        self.job = job
        self.checkpoint = checkpoint
        self.fallback_checkpoint = fallback_checkpoint
        self.savepoint_type = savepoint_type
        self.reason = reason
        self.request_id = request_id
        self.checkpoint_storage_options = checkpoint_storage_options
        self.max_attempts = max_attempts
        self.parallelism = parallelism
        self.retired_checkpoint = retired_checkpoint

    def execute(self, context: Context) -> dict[str, Any]:
        store = self.savepoint_store()
        ti = context.get("ti")
        if self.checkpoint:
            refuse_left_checkpoint(store.child(validate_job_name(self.job)), self.job, self.checkpoint,
                                   retired=self.retired_checkpoint)
        checkpoint = self.checkpoint or recorded_checkpoint(store, self.job, self.fallback_checkpoint)
        info = take_savepoint(
            checkpoint, self.job, savepoint_dir=store, savepoint_type=self.savepoint_type,
            reason=self.reason or (f"{ti.dag_id}/{ti.run_id}" if ti else None),
            request_id=self.request_id or task_request_id(context),
            checkpoint_storage_options=checkpoint_options(checkpoint, store, self.checkpoint_storage_options),
            max_attempts=self.max_attempts, parallelism=self.parallelism,
            spark_version=running_spark_version(store, self.job, checkpoint),
            job_version=recorded_version(store, self.job, checkpoint), retired_checkpoint=self.retired_checkpoint,
            on_event=self.savepoint_events(store, self.job),
        )
        summary = info.summary()
        self.log.info("savepoint completed: %s (batch %s)", summary["pointer"], summary["batch_id"])
        self.announce(context, self.job, summary)
        return summary


class DisposeSavepointOperator(SavepointsBaseOperator):
    """Delete one savepoint (only a complete savepoint inside the savepoint directory).

    :param pointer: the savepoint directory or its ``_metadata`` (templated)
    :param savepoint_dir: the savepoint directory it must lie in (templated; default: connection/config)
    :param savepoints_conn_id: a ``savepoints`` connection (templated)
    """

    template_fields: Sequence[str] = savepoints_template_fields("pointer")

    def __init__(self, *, pointer: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pointer = pointer

    def execute(self, context: Context) -> dict[str, Any]:
        info = dispose_savepoint(self.pointer, savepoint_dir=self.hook.savepoint_dir(self.savepoint_dir),
                                 storage_options=self.hook.storage_options(),
                                 by=_task_name(context, "DisposeSavepointOperator"))
        self.log.info("disposed %s", info.pointer)
        return {"disposed": info.pointer, "savepoint_id": info.manifest.savepoint_id, "job": info.manifest.job}
