"""The rescale of a job declared in a jobs file runs where the job runs: a Spark application submitted
through the job's own submit path (its master, deploy mode, Spark connection and conf), never in this
process. The caller (an Airflow worker, a terminal) needs no pyspark for it.

* :func:`rescale_on_the_job` gives a restore of ``job start`` / ``job upgrade`` / ``UpgradeJobOperator``
  its ``rescaler``: after the copy (``core/restore.py``), :class:`JobRescaler` submits
  ``airflow_savepoints/jobs/driver/rescale_app.py`` with the job's submit command builder (the job's
  application and its arguments swapped for the rescale application's: in a spark-submit command they
  come last), waits for it, and reads back ``result.json`` from ``<savepoint dir>/<job>/_rescale/<id>/``
  (then deleted). A failure raises the typed error the application reported (Spark's error class mapped
  as in-process: ``core/rescale.py``); the restore then leaves its target empty, as for any failure.
* :func:`refuse_unrescalable` checks, before an upgrade stops anything, that the running version's state
  can be rescaled: the live checkpoint's newest batch as a savepoint would record it (state store
  provider, operators and their metadata), with no Spark.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.models import FileEntry, SavepointManifest, StateStoreSettings
from airflow_savepoints.core.names import CHECK_RESULT_FILE, RESCALE_FOLDER
from airflow_savepoints.core.rescale import RescalePlan, plan_rescale, reported_error
from airflow_savepoints.core.savepoint import plan_listed
from airflow_savepoints.errors import RescaleError, RescaleFailedError
from airflow_savepoints.jobs.description.channel import new_run_id
from airflow_savepoints.jobs.driver import rescale_app
from airflow_savepoints.jobs.launch.launcher import log_tail, spawn_submit
from airflow_savepoints.jobs.launch.runners import kill_own_child
from airflow_savepoints.storage import Store

if TYPE_CHECKING:
    from airflow_savepoints.jobs.workflows.run import JobContext, JobState

RESCALE_TIMEOUT = 3600.0  # seconds the rescale application may take (it reads and writes all the state)
CHECKPOINT_PLACEHOLDER = "{checkpoint}"


def rescale_on_the_job(ctx: JobContext, submit_command: Callable[[str, dict[str, str]], list[str]], log_dir: Path,
                       restore_options: dict[str, Any]) -> dict[str, Any]:
    """``restore_options`` with, when they ask for ``state_partitions``, the rescaler that runs it as the job's
    own Spark application."""
    if restore_options.get("state_partitions") is None:
        return restore_options
    return {**restore_options, "rescaler": JobRescaler(ctx, submit_command, Path(log_dir))}


def application_command(job: Any, submit_command: Callable[[str, dict[str, str]], list[str]], checkpoint: str,
                        conf: dict[str, str], application: str, arguments: list[str]) -> list[str]:
    """The job's submit command with its application and arguments swapped for ``application`` and
    ``arguments``: spark-submit takes everything after the primary resource as its arguments, so the
    options before it (master, deploy mode, name, conf, jars) stay the job's."""
    command = submit_command(checkpoint, conf)
    tail = [job.application, *(a.replace(CHECKPOINT_PLACEHOLDER, checkpoint) for a in job.application_args)]
    if command[-len(tail):] != tail:
        raise RescaleFailedError(
            f"the submit command of job '{job.name}' does not end with its application and arguments "
            f"({' '.join(tail)}), so the rescale application cannot be submitted in their place",
            "build the job's command as spark-submit does (options, then the application and its arguments); "
            "nothing was restored")
    return [*command[: -len(tail)], application, *arguments]


@dataclass
class JobRescaler:
    """Rescales a restored copy through the job's own submit path (see the module's description)."""

    ctx: JobContext
    submit_command: Callable[[str, dict[str, str]], list[str]]
    log_dir: Path
    timeout: float = RESCALE_TIMEOUT

    def __call__(self, destination: Store, plan: RescalePlan, manifest: SavepointManifest, conf: dict[str, str],
                 file_sink: Store | None = None) -> tuple[int, dict[str, int]]:
        job, batch = self.ctx.job, manifest.batch_id + 1
        results = self.ctx.folder.child(RESCALE_FOLDER)
        scratch = results.child(new_run_id())
        arguments = [destination.url, str(plan.partitions), str(batch), scratch.url, file_sink.url if file_sink else ""]
        command = application_command(job, self.submit_command, destination.url, conf, rescale_app.__file__, arguments)
        self.ctx.log(f"rescaling {destination.url} into {plan.partitions} state partitions as a Spark application of "
                     f"job {job.name} (master {job.master})")
        try:
            log_file = self._run(command)
            result = read_result(scratch)
        finally:
            results.remove_tree(scratch.name)
        if result is None:
            raise RescaleFailedError(f"the rescale application of job '{job.name}' ended without a result; last log "
                                     f"lines:\n{log_tail(log_file)}",
                                     f"see {log_file}; nothing was restored; retry into a new, empty checkpoint location")
        if result.get("outcome") != "rescaled":
            raise reported_error(result.get("error") or {})
        self.ctx.log(f"rescaled by application {result.get('application_id')} (Spark {result.get('spark_version')})")
        return batch, {str(op): int(count) for op, count in (result.get("partitions") or {}).items()}

    def _run(self, command: list[str]) -> str:
        return run_to_end(command, self.log_dir, f"{self.ctx.job.name}-rescale", self.timeout, lambda log_file: RescaleFailedError(
            f"the rescale application of job '{self.ctx.job.name}' did not end within {self.timeout:.0f}s: ended",
            f"see {log_file}; nothing was restored"))


def run_to_end(command: list[str], log_dir: Path, name: str, timeout: float,
               timed_out: Callable[[Path], Exception]) -> str:
    """Run a job application's submit command to its end (its own process group; ended, and
    ``timed_out(log file)`` raised, after ``timeout`` s or when interrupted); its log file."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}.log"
    process = spawn_submit(command, log_file)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        kill_own_child(process)
        raise timed_out(log_file) from exc
    except BaseException:
        kill_own_child(process)  # interrupted: nothing may go on writing
        raise
    return str(log_file)


def read_result(scratch: Store) -> dict[str, Any] | None:
    """The ``result.json`` a rescale or check application wrote into ``scratch``; None while there is none."""
    try:
        value = json.loads(scratch.read_bytes(CHECK_RESULT_FILE))
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def live_manifest(checkpoint: Store, job: str, spark_version: str | None = None) -> SavepointManifest:
    """What a savepoint of the live checkpoint's newest batch would record of its state (no file copied,
    no checksum: for checks before anything stops)."""
    plan, _ = plan_listed(checkpoint)
    return SavepointManifest.model_construct(
        job=job, batch_id=plan.batch_id, includes_next_offsets=plan.includes_next_offsets, spark_version=spark_version,
        spark_conf=plan.spark_conf, source_offsets=plan.source_offsets,
        state_store=StateStoreSettings(provider=plan.state_store_provider, checkpoint_format_version=plan.checkpoint_format_version,
                                       changelog_checkpointing=plan.changelog_checkpointing, operators=plan.operators,
                                       partitions=formats.state_partitions({f.path: f.version for f in plan.files})),
        files=[FileEntry.model_construct(path=f.path, size=f.size) for f in plan.files])


def refuse_unrescalable(ctx: JobContext, state: JobState, partitions: int) -> None:
    """Raise the rescale's refusal now, before anything stops, when the running version's state could not be
    rescaled into ``partitions`` (HDFS-backed state, operators without Spark's metadata); the job goes on."""
    if not state.checkpoint:
        return
    checkpoint = ctx.checkpoint(state.checkpoint)
    try:
        plan_rescale(live_manifest(checkpoint, ctx.job.name, state.spark_version), partitions,
                     f"of the running version's live checkpoint {checkpoint.url}", local=False)
    except RescaleError as exc:
        raise type(exc)(f"{exc.message}; the upgrade of job '{ctx.job.name}' was refused before anything stopped: "
                        f"run {state.run_id} goes on", (exc.hint or "").replace("; nothing was restored", "")
                        + "; nothing was stopped or restored") from exc
