"""Sensors: deferrable by default (the wait runs in the triggerer), or poke/reschedule."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException

from airflow_savepoints.core.pointer import completed_savepoint
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.hooks.savepoint import SavepointStorageHook
from airflow_savepoints.jobs.launcher import read_run
from airflow_savepoints.jobs.lifecycle import committed_past
from airflow_savepoints.storage import Store
from airflow_savepoints.triggers.savepoint import BatchCommittedTrigger, SavepointCompletedTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class _DeferrableSensor(BaseSensorOperator):
    def __init__(self, *, deferrable: bool = True, savepoints_conn_id: str = "savepoints_default", **kwargs: Any):
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.savepoints_conn_id = savepoints_conn_id

    def _trigger(self):
        raise NotImplementedError

    def _end_at(self) -> float | None:
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


class SavepointCompletedSensor(_DeferrableSensor):
    """Wait until the savepoint at ``pointer`` is complete; return its summary.

    :param pointer: a savepoint directory or its ``_metadata`` (templated)
    """

    template_fields: Sequence[str] = ("pointer",)

    def __init__(self, *, pointer: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pointer = pointer

    def _options(self) -> dict[str, Any]:
        return SavepointStorageHook(self.savepoints_conn_id).storage_options()

    def _trigger(self) -> SavepointCompletedTrigger:
        return SavepointCompletedTrigger(self.pointer, self._options(), poll_interval=self.poke_interval,
                                         end_at=self._end_at())

    def poke(self, context: Context) -> PokeReturnValue:
        try:
            info = completed_savepoint(self.pointer, self._options())
        except SavepointError as exc:
            raise AirflowFailException(str(exc)) from exc
        return PokeReturnValue(is_done=info is not None, xcom_value=info.summary() if info else None)


class BatchCommittedSensor(_DeferrableSensor):
    """Wait until a job commits a batch past ``after_batch``; fail fast if the job has died.

    :param job: the job's name: its recorded run gives the checkpoint and the process to watch (templated)
    :param after_batch: the batch to get past (templated; e.g. a restore's batch id)
    :param checkpoint: the checkpoint to watch instead of the recorded run's (templated)
    :param savepoint_dir: where the job's run is recorded (templated; default: connection/config)
    """

    template_fields: Sequence[str] = ("job", "after_batch", "checkpoint", "savepoint_dir")

    def __init__(self, *, job: str, after_batch: int | str = -1, checkpoint: str | None = None,
                 savepoint_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.after_batch = after_batch
        self.checkpoint = checkpoint
        self.savepoint_dir = savepoint_dir

    def _watch(self) -> tuple[Store, int, Any]:
        hook = SavepointStorageHook(self.savepoints_conn_id)
        root = hook.get_store(self.savepoint_dir)
        run = read_run(root.child(self.job))
        checkpoint = self.checkpoint or (run.checkpoint if run else None)
        if not checkpoint:
            raise AirflowFailException(f"job '{self.job}' has no recorded run and no checkpoint was given")
        return Store(checkpoint, hook.storage_options()), int(self.after_batch), run

    def _trigger(self) -> BatchCommittedTrigger:
        store, after, run = self._watch()
        return BatchCommittedTrigger(store.url, after, run.model_dump(mode="json") if run else None,
                                     store.storage_options, poll_interval=self.poke_interval, end_at=self._end_at())

    def poke(self, context: Context) -> PokeReturnValue:
        store, after, run = self._watch()
        try:
            batch = committed_past(store, after, run)
        except SavepointError as exc:
            raise AirflowFailException(str(exc)) from exc
        return PokeReturnValue(is_done=batch is not None, xcom_value={"batch_id": batch} if batch is not None else None)
