"""Triggers polling storage from the triggerer (blocking fsspec calls run in a worker thread)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_savepoints.core.pointer import completed_savepoint
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs.launcher import JobRun
from airflow_savepoints.jobs.lifecycle import committed_past
from airflow_savepoints.storage import Store


class _PollingTrigger(BaseTrigger):
    """Polls ``_check`` (in a worker thread) until it returns a result, raises, or ``end_at`` passes.

    The deadline is the trigger's own, so a wait ends even where nothing else times it out."""

    def __init__(self, storage_options: dict[str, Any] | None, poll_interval: float, end_at: float | None):
        super().__init__()
        self.storage_options = storage_options or {}
        self.poll_interval = poll_interval
        self.end_at = end_at

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def _check(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def _waiting_for(self) -> str:
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {**self._fields(), "storage_options": self.storage_options, "poll_interval": self.poll_interval,
                 "end_at": self.end_at})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                result = await asyncio.to_thread(self._check)
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
    """Fires once the savepoint at ``pointer`` has its ``_metadata``."""

    def __init__(self, pointer: str, storage_options: dict[str, Any] | None = None, poll_interval: float = 10,
                 end_at: float | None = None):
        super().__init__(storage_options, poll_interval, end_at)
        self.pointer = pointer

    def _fields(self) -> dict[str, Any]:
        return {"pointer": self.pointer}

    def _waiting_for(self) -> str:
        return f"savepoint {self.pointer} to complete"

    def _check(self) -> dict[str, Any] | None:
        info = completed_savepoint(self.pointer, self.storage_options)
        return info.summary() if info is not None else None


class BatchCommittedTrigger(_PollingTrigger):
    """Fires once ``checkpoint`` has a committed batch past ``after_batch``; errors if the job died."""

    def __init__(self, checkpoint: str, after_batch: int, run: dict[str, Any] | None = None,
                 storage_options: dict[str, Any] | None = None, poll_interval: float = 10, end_at: float | None = None):
        super().__init__(storage_options, poll_interval, end_at)
        self.checkpoint = checkpoint
        self.after_batch = after_batch
        self.run_record = run

    def _fields(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "after_batch": self.after_batch, "run": self.run_record}

    def _waiting_for(self) -> str:
        return f"a batch past {self.after_batch} in {self.checkpoint}"

    def _check(self) -> dict[str, Any] | None:
        job_run = JobRun.model_validate(self.run_record) if self.run_record else None
        batch = committed_past(Store(self.checkpoint, self.storage_options), self.after_batch, job_run)
        return {"batch_id": batch} if batch is not None else None
