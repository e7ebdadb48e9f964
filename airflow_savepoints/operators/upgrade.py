"""Upgrade a running streaming job to a new version; roll back automatically when it is not healthy.

Thin: the work is :func:`airflow_savepoints.jobs.workflows.upgrade.upgrade` (stop, start the new version,
wait for health, roll back). See docs/how-to.md for the modes and the Flink operator's terms.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.hooks.streaming_job import SparkStreamingJobHook
from airflow_savepoints.jobs.workflows.upgrade import UpgradeRequest, new_version, upgrade
from airflow_savepoints.operators.base import rendered_count, rendered_flag, savepoints_template_fields
from airflow_savepoints.operators.job import _JobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["UpgradeJobOperator"]


def _parsed(value: Any, kind: type, what: str) -> Any:
    """A list or dict given as such or as JSON text (a templated Param); None when empty."""
    if value in (None, "", "None"):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidInputError(f"{what} is not JSON: {exc}", f"give a JSON {kind.__name__}") from exc
    if not isinstance(value, kind):
        raise InvalidInputError(f"{what} must be a {kind.__name__}, not {type(value).__name__}",
                                f"give a JSON {kind.__name__}")
    return value or None


def _automatic_or_flag(value: Any) -> bool | None:
    """None for "automatic" (None, empty, "auto", a rendered None), else the flag's value."""
    return None if str(value).strip().lower() in ("", "none", "auto") else rendered_flag(value)


class UpgradeJobOperator(_JobOperator):
    """Stop the job, start its new version, wait until it is healthy, else roll back and fail.

    :param application: the new version's application (path or artifact); empty: the job's (templated)
    :param application_args: its arguments (a list, or JSON text); empty: the job's (templated)
    :param spark_conf: Spark conf to set on top of the job's (a dict, or JSON text) (templated)
    :param mode: ``savepoint``, ``last-state`` or ``stateless``; empty: the job's ``upgrade_mode`` (templated)
    :param fallback_to_savepoint: when last-state is refused, upgrade with the stop savepoint instead
    :param allow_stateless: needed for ``stateless`` (the new version starts with EMPTY state)
    :param health_timeout: seconds for the new version to commit a batch past the stop batch
    :param rollback: start the previous version again when the new one is not healthy (default)
    :param grace: seconds for a run to stop between batches before it is forced
    :param check_first: before anything stops, run the new version for one batch on a scratch copy of the
        state with a noop sink and refuse the upgrade if it fails (``jobs/workflows/check.py``); None (or "auto"):
        only in savepoint mode (templated)
    :param check_timeout: seconds for the check's batch
    :param state_partitions: mode ``savepoint``: rescale the state into this many partitions for the new
        version and the check's copy (templated; RocksDB state; a Spark application of the job, Spark 4.2 where the job
        runs, no pyspark on the worker; a rollback keeps the old count)
    """

    template_fields: Sequence[str] = savepoints_template_fields(
        "job", "application", "application_args", "spark_conf", "mode", "fallback_to_savepoint", "allow_stateless",
        "health_timeout", "check_first", "state_partitions")

    def __init__(self, *, application: str | None = None, application_args: list[str] | str | None = None,
                 spark_conf: dict[str, str] | str | None = None, mode: str | None = None,
                 fallback_to_savepoint: bool | str = False, allow_stateless: bool | str = False,
                 health_timeout: float | str = 300, rollback: bool = True, grace: float = 60,
                 check_first: bool | str | None = None, check_timeout: float = 300,
                 state_partitions: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state_partitions = state_partitions
        self.application = application
        self.application_args = application_args
        self.spark_conf = spark_conf
        self.mode = mode
        self.fallback_to_savepoint = fallback_to_savepoint
        self.allow_stateless = allow_stateless
        self.health_timeout = health_timeout
        self.rollback = rollback
        self.grace = grace
        self.check_first = check_first
        self.check_timeout = check_timeout
        self.state_partitions = state_partitions

    def execute(self, context: Context) -> dict[str, Any]:
        ctx = self.job_context()
        version = new_version(ctx.job, self.application or None,
                              _parsed(self.application_args, list, "application_args"),
                              _parsed(self.spark_conf, dict, "spark_conf"))
        request = UpgradeRequest(version=version, mode=self.mode or None, health_timeout=float(self.health_timeout),
                                 fallback_to_savepoint=rendered_flag(self.fallback_to_savepoint),
                                 allow_stateless=rendered_flag(self.allow_stateless), rollback=self.rollback, grace=self.grace,
                                 check_first=_automatic_or_flag(self.check_first), check_timeout=self.check_timeout,
                                 state_partitions=rendered_count(self.state_partitions, "state_partitions"))
        return upgrade(ctx, request, submit_for=lambda job: SparkStreamingJobHook(job).submit_command,
                       log_dir=self.log_dir())
