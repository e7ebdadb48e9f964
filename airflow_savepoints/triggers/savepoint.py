"""Triggers polling storage from the triggerer (blocking fsspec calls run in a worker thread)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_savepoints.core.pointer import completed_savepoint
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs.launcher import JobRun, committed_past
from airflow_savepoints.storage import Store


class SavepointCompletedTrigger(BaseTrigger):
    """Fires once the savepoint at ``pointer`` has its ``_metadata``."""

    def __init__(self, pointer: str, storage_options: dict[str, Any] | None = None, poll_interval: float = 10):
        super().__init__()
        self.pointer = pointer
        self.storage_options = storage_options or {}
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"pointer": self.pointer, "storage_options": self.storage_options, "poll_interval": self.poll_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                info = await asyncio.to_thread(completed_savepoint, self.pointer, self.storage_options)
            except SavepointError as exc:
                yield TriggerEvent({"status": "error", "message": str(exc)})
                return
            if info is not None:
                yield TriggerEvent({"status": "success", "result": info.summary()})
                return
            await asyncio.sleep(self.poll_interval)


class BatchCommittedTrigger(BaseTrigger):
    """Fires once ``checkpoint`` has a committed batch past ``after_batch``; errors if the job died."""

    def __init__(self, checkpoint: str, after_batch: int, run: dict[str, Any] | None = None,
                 storage_options: dict[str, Any] | None = None, poll_interval: float = 10):
        super().__init__()
        self.checkpoint = checkpoint
        self.after_batch = after_batch
        self.run_record = run
        self.storage_options = storage_options or {}
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"checkpoint": self.checkpoint, "after_batch": self.after_batch, "run": self.run_record,
                 "storage_options": self.storage_options, "poll_interval": self.poll_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = Store(self.checkpoint, self.storage_options)
        job_run = JobRun.model_validate(self.run_record) if self.run_record else None
        while True:
            try:
                batch = await asyncio.to_thread(committed_past, store, self.after_batch, job_run)
            except SavepointError as exc:
                yield TriggerEvent({"status": "error", "message": str(exc)})
                return
            if batch is not None:
                yield TriggerEvent({"status": "success", "result": {"batch_id": batch}})
                return
            await asyncio.sleep(self.poll_interval)
