"""The retention operator (thin: the policy and its safety checks are in airflow_savepoints.core.retention)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_savepoints.core.retention import RetentionPolicy, retain
from airflow_savepoints.errors import RetentionFailedError
from airflow_savepoints.operators.base import SavepointsBaseOperator, rendered_flag, savepoints_template_fields

if TYPE_CHECKING:
    from airflow.sdk import Context


class ApplyRetentionOperator(SavepointsBaseOperator):
    """Apply the retention policy to one job's savepoints; returns the report (what was kept and why).

    Manual, stop and retained-checkpoint savepoints, the newest completed savepoint, pinned and
    in-progress ones are never removed. Unset bounds come from the ``[savepoints]`` configuration.

    :param job: the job's name (templated)
    :param max_periodic: periodic savepoints to keep (templated)
    :param max_age: dispose periodic savepoints older than this, e.g. ``7d``; ``none``: no limit (templated)
    :param orphan_timeout: remove locations without ``_metadata`` older than this (templated)
    :param dry_run: only plan; change nothing (templated: ``{{ params.dry_run }}``)
    :param savepoint_dir: the savepoint directory (templated; default: connection, then configuration)
    :param savepoints_conn_id: a ``savepoints`` connection (templated)
    """

    template_fields: Sequence[str] = savepoints_template_fields("job", "max_periodic", "max_age", "orphan_timeout",
                                                                "dry_run")
    ui_color = "#f3e5d8"

    def __init__(self, *, job: str, max_periodic: int | str | None = None, max_age: str | None = None,
                 orphan_timeout: str | None = None, dry_run: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.max_periodic = max_periodic
        self.max_age = max_age
        self.orphan_timeout = orphan_timeout
        self.dry_run = dry_run

    def execute(self, context: Context) -> dict[str, Any]:
        policy = RetentionPolicy.resolve(self.max_periodic, self.max_age, self.orphan_timeout)
        root = self.savepoint_store()
        dry_run = rendered_flag(self.dry_run)
        report = retain(root, self.job, policy, dry_run=dry_run)
        for decision in report.plan.decisions:
            self.log.info("%-8s %s (%s, batch %s): %s", decision.action.value, decision.savepoint_id,
                          decision.type or "incomplete", decision.batch_id, decision.reason)
        summary = report.summary()
        self.log.info("%s: disposed %d, removed %d orphans, kept %d", "dry run" if dry_run else "retention",
                      len(report.plan.of("dispose")), len(report.plan.of("remove_orphan")), len(summary["kept"]))
        if report.failed:
            raise RetentionFailedError(
                f"retention of job '{self.job}' could not remove {len(report.failed)} location(s): "
                + "; ".join(f"{f['savepoint_id']}: {f['message']}" for f in report.failed[:5]),
                "check access to the savepoint store; the next run retries (disposal is idempotent)",
            )
        return summary
