"""Sensors: poke, reschedule, or defer to the triggerer (default ``[operators] default_deferrable``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException

from airflow_savepoints.core.pointer import completed_savepoint
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs.description.record import JobRun, read_run
from airflow_savepoints.jobs.workflows.lifecycle import committed_past
from airflow_savepoints.operators.base import SavepointsBaseSensor, savepoints_template_fields
from airflow_savepoints.storage import Store
from airflow_savepoints.triggers.savepoint import BatchCommittedTrigger, SavepointCompletedTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class SavepointCompletedSensor(SavepointsBaseSensor):
    """Wait until the savepoint at ``pointer`` is complete; return its summary.

    :param pointer: a savepoint directory or its ``_metadata`` (templated)
    """

    template_fields: Sequence[str] = savepoints_template_fields("pointer")

    def __init__(self, *, pointer: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pointer = pointer

    def _trigger(self) -> SavepointCompletedTrigger:
        return SavepointCompletedTrigger(self.pointer, savepoints_conn_id=self.savepoints_conn_id,
                                         poll_interval=self.poke_interval, end_at=self._end_at())

    def poke(self, context: Context) -> PokeReturnValue:
        try:
            info = completed_savepoint(self.pointer, self.hook.storage_options())
        except SavepointError as exc:
            raise AirflowFailException(str(exc)) from exc
        return PokeReturnValue(is_done=info is not None, xcom_value=info.summary() if info else None)


class BatchCommittedSensor(SavepointsBaseSensor):
    """Wait until a job commits a batch past ``after_batch``; fail fast if the job has died.

    :param job: the job's name: its recorded run gives the checkpoint and the process to watch (templated)
    :param after_batch: the batch to get past (templated; e.g. a restore's batch id)
    :param checkpoint: the checkpoint to watch instead of the recorded run's (templated)
    :param savepoint_dir: where the job's run is recorded (templated; default: connection/config)
    """

    template_fields: Sequence[str] = savepoints_template_fields("job", "after_batch", "checkpoint")

    def __init__(self, *, job: str, after_batch: int | str = -1, checkpoint: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.after_batch = after_batch
        self.checkpoint = checkpoint

    def _watch(self) -> tuple[Store, int, JobRun | None]:
        run = read_run(self.savepoint_store().child(self.job))
        checkpoint = self.checkpoint or (run.checkpoint if run else None)
        if not checkpoint:
            raise AirflowFailException(f"job '{self.job}' has no recorded run and no checkpoint was given")
        return Store(checkpoint, self.hook.storage_options()), int(self.after_batch), run

    def _trigger(self) -> BatchCommittedTrigger:
        store, after, run = self._watch()
        return BatchCommittedTrigger(store.url, after, run.model_dump(mode="json") if run else None,
                                     savepoints_conn_id=self.savepoints_conn_id, poll_interval=self.poke_interval,
                                     end_at=self._end_at())

    def poke(self, context: Context) -> PokeReturnValue:
        store, after, run = self._watch()
        try:
            batch = committed_past(store, after, run)
        except SavepointError as exc:
            raise AirflowFailException(str(exc)) from exc
        return PokeReturnValue(is_done=batch is not None, xcom_value={"batch_id": batch} if batch is not None else None)
