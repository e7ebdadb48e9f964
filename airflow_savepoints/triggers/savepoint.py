"""Triggers polling storage from the triggerer (blocking fsspec calls run in a worker thread).

A trigger is stored in the metadata database as its ``serialize()`` kwargs, so it carries the
``savepoints`` connection id and plain parameters only, never credentials: the triggerer rebuilds
the hook from the connection id and opens the storage with the connection's options itself.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_savepoints.core.pointer import completed_savepoint
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.hooks.savepoint import SavepointStorageHook
from airflow_savepoints.jobs.description.record import JobRun
from airflow_savepoints.jobs.workflows.lifecycle import committed_past
from airflow_savepoints.storage import Store

RUN_FIELDS_LEFT_OUT = ("command", "termination")  # the launch command may carry secrets in its Spark conf


class _PollingTrigger(BaseTrigger):
    """Polls ``_check`` (in a worker thread) until it returns a result, raises, or ``end_at`` passes.

    The deadline is the trigger's own, so a wait ends even where nothing else times it out.
    ``storage_options`` is accepted only for triggers stored by an earlier release (it put the
    connection's options, credentials included, into the metadata database); it is never serialized.
    """

    def __init__(self, savepoints_conn_id: str | None, poll_interval: float, end_at: float | None,
                 storage_options: dict[str, Any] | None = None):
        super().__init__()
        if storage_options is not None:
            warnings.warn(f"{type(self).__name__}(storage_options=...) is deprecated: options are stored with the "
                          "trigger; pass savepoints_conn_id", AirflowProviderDeprecationWarning, stacklevel=3)
        self.savepoints_conn_id = savepoints_conn_id
        self.poll_interval = poll_interval
        self.end_at = end_at
        self._given_options = storage_options

    @cached_property
    def hook(self) -> SavepointStorageHook:
        """The storage hook, rebuilt from the connection id wherever the trigger runs."""
        return SavepointStorageHook(self.savepoints_conn_id)

    def storage_options(self) -> dict[str, Any]:
        """The connection's storage options (blocking: call it in a worker thread)."""
        return dict(self._given_options) if self._given_options is not None else self.hook.storage_options()

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def _check(self, storage_options: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def _waiting_for(self) -> str:
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {**self._fields(), "savepoints_conn_id": self.savepoints_conn_id, "poll_interval": self.poll_interval,
                 "end_at": self.end_at})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            options = await asyncio.to_thread(self.storage_options)
        except (SavepointError, AirflowNotFoundException) as exc:
            yield TriggerEvent({"status": "error", "message": str(exc)})
            return
        while True:
            try:
                result = await asyncio.to_thread(self._check, options)
            except SavepointError as exc:
                yield TriggerEvent({"status": "error", "message": str(exc)})
                return
            if result is not None:
                yield TriggerEvent({"status": "success", "result": result})
                return
            if self.end_at is not None and time.time() >= self.end_at:
                yield TriggerEvent({"status": "error", "message": f"timed out waiting for {self._waiting_for()}"})
                return
            await asyncio.sleep(self.poll_interval)


class SavepointCompletedTrigger(_PollingTrigger):
    """Fires once the savepoint at ``pointer`` has its ``_metadata``.

    :param pointer: a savepoint directory or its ``_metadata``
    :param storage_options: deprecated (see :class:`_PollingTrigger`); pass ``savepoints_conn_id``
    :param poll_interval: seconds between two looks
    :param end_at: the wall-clock deadline (epoch seconds); None: no deadline
    :param savepoints_conn_id: the ``savepoints`` connection whose options open the storage
    """

    def __init__(self, pointer: str, storage_options: dict[str, Any] | None = None, poll_interval: float = 10,
                 end_at: float | None = None, savepoints_conn_id: str | None = SavepointStorageHook.default_conn_name):
        super().__init__(savepoints_conn_id, poll_interval, end_at, storage_options)
        self.pointer = pointer

    def _fields(self) -> dict[str, Any]:
        return {"pointer": self.pointer}

    def _waiting_for(self) -> str:
        return f"savepoint {self.pointer} to complete"

    def _check(self, storage_options: dict[str, Any]) -> dict[str, Any] | None:
        info = completed_savepoint(self.pointer, storage_options)
        return info.summary() if info is not None else None


class BatchCommittedTrigger(_PollingTrigger):
    """Fires once ``checkpoint`` has a committed batch past ``after_batch``; errors if the job died.

    :param checkpoint: the checkpoint's URL
    :param after_batch: the batch to get past
    :param run: the job's recorded run (``JobRun`` as JSON), to tell a dead job; its launch command
        is left out (it may carry secrets)
    :param storage_options: deprecated (see :class:`_PollingTrigger`); pass ``savepoints_conn_id``
    :param savepoints_conn_id: the ``savepoints`` connection whose options open the checkpoint
    """

    def __init__(self, checkpoint: str, after_batch: int, run: dict[str, Any] | None = None,
                 storage_options: dict[str, Any] | None = None, poll_interval: float = 10, end_at: float | None = None,
                 savepoints_conn_id: str | None = SavepointStorageHook.default_conn_name):
        super().__init__(savepoints_conn_id, poll_interval, end_at, storage_options)
        self.checkpoint = checkpoint
        self.after_batch = after_batch
        self.run_record = {k: v for k, v in run.items() if k not in RUN_FIELDS_LEFT_OUT} if run else None

    def _fields(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "after_batch": self.after_batch, "run": self.run_record}

    def _waiting_for(self) -> str:
        return f"a batch past {self.after_batch} in {self.checkpoint}"

    def _check(self, storage_options: dict[str, Any]) -> dict[str, Any] | None:
        job_run = JobRun.model_validate(self.run_record) if self.run_record else None
        batch = committed_past(Store(self.checkpoint, storage_options), self.after_batch, job_run)
        return {"batch_id": batch} if batch is not None else None
