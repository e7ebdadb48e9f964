"""The operator that reads a savepoint's state and records its summary beside it (thin: the work is in
airflow_savepoints.core.state_reader)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_savepoints.core.pointer import latest_pointer
from airflow_savepoints.core.state_reader import inspect_savepoint
from airflow_savepoints.core.state_summary import record_beside
from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.operators.base import SavepointsBaseOperator, savepoints_template_fields
from airflow_savepoints.operators.links import SavepointsPageLink

if TYPE_CHECKING:
    from airflow.sdk import Context


class InspectSavepointOperator(SavepointsBaseOperator):
    """Read a savepoint's state with Spark's state sources (in-process local Spark: the worker needs the
    ``[spark]`` extra) and record its summary beside it, ``<dir>/<job>/_state_summaries/<id>.json``, for
    the console (rows and skew per operator, without Spark). The savepoint is not changed; disposing
    it removes the summary. Returns the summary (with ``sample`` rows per store; the record has none).

    :param pointer: the savepoint directory or its ``_metadata`` (templated); default: the newest
        completed savepoint of ``job``
    :param job: the job whose newest savepoint is inspected when no pointer is given (templated)
    :param operator_id: only this stateful operator
    :param sample: rows of each store in the returned summary (0-1000; never recorded)
    :param savepoint_dir: the savepoint directory (templated; default: connection, then configuration)
    :param savepoints_conn_id: a ``savepoints`` connection (templated)
    """

    template_fields: Sequence[str] = savepoints_template_fields("pointer", "job")
    operator_extra_links = (SavepointsPageLink(),)
    ui_color = "#e3ecf7"

    def __init__(self, *, pointer: str | None = None, job: str | None = None, operator_id: int | None = None,
                 sample: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pointer = pointer
        self.job = job
        self.operator_id = operator_id
        self.sample = sample

    def execute(self, context: Context) -> dict[str, Any]:
        pointer = self.pointer or self._latest()
        summary = inspect_savepoint(pointer, operator=self.operator_id, sample=self.sample,
                                    storage_options=self.hook.storage_options())
        recorded = record_beside(summary, self.hook.storage_options())
        for op in summary.operators:
            self.log.info("operator %s (%s): %s rows in %s partitions, skew %s", op.operator_id, op.name or "unknown",
                          op.rows, op.partitions, op.skew)
        for limit in summary.limits:
            self.log.warning("cannot show: %s", limit)
        self.log.info("state summary of %s recorded at %s", summary.pointer, recorded)
        return {**summary.as_json(), "recorded": recorded}

    def _latest(self) -> str:
        if not self.job:
            raise InvalidInputError("InspectSavepointOperator needs pointer= or job=", "name the savepoint or its job")
        return latest_pointer(self.savepoint_store(), self.job, "to inspect",
                              "take a savepoint first (TriggerSavepointOperator)")
