"""A job's savepoint read where the job runs: its state counted by a Spark application of the job (its master,
deploy mode, Spark connection and conf), not by a local Spark in this process. For a state too large for the
caller's machine, or a store only the job's cluster has the connector and credentials for. The caller needs no
pyspark.

:func:`inspect_on_the_job` submits ``airflow_savepoints/jobs/driver/inspect_app.py`` in place of the job's
application (as the rescale does: :func:`~airflow_savepoints.jobs.workflows.rescale.application_command`),
waits for it, and reads back the summary from ``<savepoint dir>/<job>/_inspect/<id>/result.json`` (then
deleted). The savepoint is pinned by the application while it reads, and never changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_savepoints.core.names import INSPECT_FOLDER
from airflow_savepoints.core.pointer import latest_pointer
from airflow_savepoints.core.state_summary import StateSummary
from airflow_savepoints.errors import StateUnreadableError, reported
from airflow_savepoints.jobs.driver import inspect_app
from airflow_savepoints.jobs.launch.launcher import log_tail
from airflow_savepoints.jobs.workflows.rescale import app_secret_for, application_command, read_result, run_to_end
from airflow_savepoints.jobs.workflows.run import refuse_long_work

if TYPE_CHECKING:
    from airflow_savepoints.jobs.workflows.run import JobContext

INSPECT_TIMEOUT = 3600.0  # seconds the application may take (it reads all the state)


def inspect_on_the_job(ctx: JobContext, submit_command: Callable[[str, dict[str, str]], list[str]], log_dir: Path, *,
                       pointer: str | None = None, operator: int | None = None, sample: int = 0,
                       progress: Callable[[str], None] = lambda line: None,
                       timeout: float = INSPECT_TIMEOUT) -> tuple[StateSummary, dict[str, Any]]:
    """The state summary of ``pointer`` (default: the job's newest completed savepoint), read by a Spark
    application of the job; and the application's facts (id, Spark version, seconds it read)."""
    job = ctx.job
    refuse_long_work(timeout, "the inspection")
    pointer = pointer or latest_pointer(ctx.root, job.name, "to inspect",
                                        "take one first (airflow-savepoints job savepoint), or give a savepoint")
    scratch, (secret, secret_conf, secret_env) = ctx.work_folder(INSPECT_FOLDER), app_secret_for(job, "inspect")
    arguments = [pointer, scratch.url, "-" if operator is None else str(operator), str(sample)]
    command = application_command(job, submit_command, pointer, secret_conf, inspect_app.__file__, arguments)
    progress(f"submitting the inspection of {pointer} as a Spark application of job {job.name} (master {job.master})")
    started = time.monotonic()
    try:
        log_file = run_to_end(command, Path(log_dir), f"{job.name}-inspect", timeout, lambda log: StateUnreadableError(
            f"the inspection application of job '{job.name}' did not end within {timeout:.0f}s: ended", f"see {log}"),
            env=secret_env)
        result = read_result(scratch, secret)
    finally:
        scratch.parent().remove_tree(scratch.name)
    if result is None:
        raise StateUnreadableError(f"the inspection application of job '{job.name}' ended without a result sealed "
                                   f"with the secret it was given; last log "
                                   f"lines:\n{log_tail(log_file)}", f"see {log_file}")
    if result.get("outcome") != "inspected":
        raise reported(result.get("error") or {}, StateUnreadableError)
    facts = {"application_id": result.get("application_id"), "spark_version": result.get("spark_version"),
             "read_s": result.get("read_s"), "took_s": round(time.monotonic() - started, 1), "log_file": log_file}
    progress(f"read by application {facts['application_id']} (Spark {facts['spark_version']}) in {facts['read_s']} s")
    return StateSummary.model_validate(result["summary"]), facts
