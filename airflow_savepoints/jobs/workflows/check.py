"""Check an upgrade before anything stops: the new version runs one batch on a scratch copy of the
running version's state, with its sink replaced by Spark's ``noop`` sink.

:func:`check_upgrade` (Airflow's side; the CLI's ``job check`` and ``UpgradeJobOperator(check_first=...)``):

1. takes a ``manual`` savepoint (reason ``upgrade check``) of the running version's live checkpoint,
   as any trigger does (retention treats it as any manual savepoint: ``max_manual`` bounds them);
2. restores it (hard links where the store allows) into ``<savepoint dir>/<job>/_check/<check id>/checkpoint``,
   a scratch folder of its own: never inside a savepoint, never the live checkpoint; with ``state_partitions``
   rescaled by a Spark application of the new version (:mod:`airflow_savepoints.jobs.workflows.rescale`);
3. submits the new version on that copy in *check mode*: the Spark conf ``spark.savepoints.check``
   (and, for a driver on this host, the environment variable ``SAVEPOINTS_CHECK``) names the scratch
   folder. The in-job helper (:mod:`airflow_savepoints.jobs.driver.control`) then swaps every streaming
   sink the driver starts for ``noop``, takes no run lease and writes no heartbeat (the check never
   looks like a second run), waits for the first batch past the savepoint's to commit or fail, and
   writes ``result.json`` beside the copy;
4. ends the check's driver and deletes the scratch folder, and only it.

A failure (incompatible state schema, a stateful operator added or removed, a partition count
mismatch, an exception in the batch) raises :class:`UpgradeCheckFailedError` with Spark's own
message. The running version is never touched: same run, no stop request, its lease untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from airflow_savepoints.core import SavepointType, restore_savepoint, take_savepoint
from airflow_savepoints.core.models import RestoreResult, SavepointInfo
from airflow_savepoints.core.names import CHECK_FOLDER
from airflow_savepoints.errors import (
    SavepointInFlightError,
    StorageError,
    UpgradeCheckFailedError,
    UpgradeCheckTimeoutError,
    UpgradeRefusedError,
)
from airflow_savepoints.jobs.description import trust
from airflow_savepoints.jobs.description.channel import (
    CHECK_AFTER_CONF,
    CHECK_CONF,
    CHECK_ENV,
    CHECK_TIMEOUT_CONF,
    CHECKPOINT_CONF,
)
from airflow_savepoints.jobs.description.model import JobVersion, StreamingJob
from airflow_savepoints.jobs.description.record import JobRun
from airflow_savepoints.jobs.launch.launcher import log_tail, start_detached
from airflow_savepoints.jobs.launch.runners import LocalRunner, own_driver_pod
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.jobs.workflows.rescale import read_result, rescale_on_the_job
from airflow_savepoints.jobs.workflows.run import kill, refuse_long_work
from airflow_savepoints.storage import Store

CHECK_REASON = "upgrade check"
DRIVER_START_ALLOWANCE = 60.0  # seconds the check's driver may take to start, on top of its timeout

SubmitCommand = Callable[[str, dict[str, str]], list[str]]


# --- Airflow's side ---------------------------------------------------------------------------------
def check_upgrade(ctx: lifecycle.JobContext, version: JobVersion, *, submit_for: Callable[[StreamingJob], SubmitCommand],
                  log_dir: Path, timeout: float = 300, state_partitions: int | None = None,
                  inflight_wait: float = 300, grace: float = 30) -> dict[str, Any]:
    """Run ``version`` of the running job for one batch on a scratch copy of its state (see the
    module's description). Returns what was checked; raises :class:`UpgradeRefusedError` before
    anything is written, :class:`UpgradeCheckFailedError` (Spark's message) when the version fails.

    ``timeout``: seconds for the new version's driver to commit its batch (it needs input past the
    savepoint's batch); the driver gets :data:`DRIVER_START_ALLOWANCE` seconds more to start.
    ``state_partitions``: the check runs on the copy rescaled to that many state partitions (passed
    to the restore only when given)."""
    refuse_long_work(timeout, "the check")
    state = _checkable(ctx)
    restore_options = rescale_options(state_partitions)
    started = time.monotonic()
    check = UpgradeCheck(ctx, version, state, _take_check_savepoint(ctx, state, inflight_wait),
                         ctx.work_folder(CHECK_FOLDER), timeout)
    ctx.log(f"checking version {version.hash} of job {ctx.job.name} on savepoint {check.saved.pointer} "
            f"(batch {check.saved.manifest.batch_id}) in {check.scratch.url}")
    restored, run, result = check.run_on_copy(submit_for, log_dir, restore_options, grace)
    summary = {"job": ctx.job.name, "outcome": result["outcome"], "run_id": state.run_id,
               "from_version": state.version, "to_version": version.model_dump(), "savepoint": check.saved.pointer,
               "savepoint_batch": check.saved.manifest.batch_id, "restored_batch": restored.batch_id,
               "checked_batch": result.get("batch_id"), "state_partitions": state_partitions,
               "scratch": check.scratch.url, "log_file": run.log_file, "duration_s": round(time.monotonic() - started, 1)}
    check.judge(result, batch_to_pass(restored), run.log_file)
    return summary


def _checkable(ctx: lifecycle.JobContext) -> lifecycle.JobState:
    """The running job's state, if a check can run beside it: live, on a checkpoint, with the in-job helper."""
    state = lifecycle.status(ctx)
    if not state.live or not state.checkpoint:
        raise UpgradeRefusedError(f"job '{ctx.job.name}' is {state.state}, not running: nothing to check",
                                  "start it first; a stopped job is upgraded by starting the new version")
    if not state.helper:
        raise UpgradeRefusedError(
            f"job '{ctx.job.name}' runs without the in-job helper (no heartbeats): its check could not swap the sink",
            "call airflow_savepoints.jobs.driver.control.run_until_stopped in the job, or upgrade without the check")
    return state


@dataclass
class UpgradeCheck:
    """One check: the savepoint it runs from, its scratch folder (``_check/<id>/``), its verdict."""

    ctx: lifecycle.JobContext
    version: JobVersion
    state: lifecycle.JobState
    saved: SavepointInfo
    scratch: Store
    timeout: float

    def run_on_copy(self, submit_for: Callable[[StreamingJob], SubmitCommand], log_dir: Path,
                    restore_options: dict[str, Any], grace: float) -> tuple[RestoreResult, JobRun, dict[str, Any]]:
        """Restore the savepoint into the scratch folder, run the new version on it in check mode until
        its result, then end its driver and delete the scratch folder, and only it."""
        ctx, new_job = self.ctx, self.ctx.job.with_version(self.version)
        checkpoint = self.scratch.child("checkpoint")
        run: JobRun | None = None
        try:
            restore_options = rescale_on_the_job(replace(ctx, job=new_job), submit_for(new_job), log_dir, restore_options)
            restored = restore_savepoint(self.saved.pointer, checkpoint.url, storage_options=ctx.root.storage_options,
                                         target_storage_options=ctx.root.storage_options, **restore_options)
            conf = {**restored.spark_conf_to_set, **own_driver_pod(new_job, "check"), CHECK_CONF: self.scratch.url,
                    CHECK_AFTER_CONF: str(batch_to_pass(restored)), CHECK_TIMEOUT_CONF: str(self.timeout),
                    CHECKPOINT_CONF: checkpoint.url}
            secret = trust.new_secret()  # the result's key: in memory here, in the driver's environment there
            if new_job.deploy_mode == "cluster":  # a driver on another host: a conf Spark redacts (its name says secret)
                conf[trust.CHECK_SECRET_CONF] = secret
            run = start_detached(f"{new_job.name}-check", submit_for(new_job)(checkpoint.url, conf), checkpoint,
                                 self.scratch, log_dir, env={CHECK_ENV: self.scratch.url, trust.CHECK_SECRET_ENV: secret},
                                 master=new_job.master, master_ui=new_job.master_ui, version=self.version.model_dump(),
                                 secrets=[secret])
            result = _wait_for_result(self.scratch, run, self.timeout + DRIVER_START_ALLOWANCE, secret=secret,
                                      log=ctx.log)
        finally:
            if run is not None:
                _end_check_run(run, grace, new_job)
            _remove_scratch(ctx, self.scratch)
        return restored, run, result

    def judge(self, result: dict[str, Any], restored_batch: int, log_file: str | None) -> None:
        """Nothing when the new version committed a batch past the restored one; else the check's error."""
        name, version = self.ctx.job.name, self.version.hash
        if result["outcome"] == "passed":
            self.ctx.log(f"version {version} of job {name} committed batch {result['batch_id']} on the copy: check passed")
            return
        kept = f"the running version (run {self.state.run_id}) was left untouched; the check's log: {log_file}"
        if result["outcome"] == "no_batch":
            raise UpgradeCheckTimeoutError(
                f"version {version} of job '{name}' committed no batch past {restored_batch} within "
                f"{self.timeout:.0f}s on the state of savepoint {self.saved.pointer}: {result['error']}; {kept}",
                "give the check more time (check_timeout, --timeout); it needs input that arrived after the savepoint",
            cause=result.get("error"))
        raise UpgradeCheckFailedError(
            f"version {version} of job '{name}' fails on the state of batch {restored_batch} (savepoint "
            f"{self.saved.pointer}): {result['error']}\n{kept}",
            "fix the new version (Spark's message says what does not match), then check or upgrade again",
            cause=result.get("error"))


def batch_to_pass(restored: RestoreResult) -> int:
    """The batch a run on a restored copy must commit past to have run one of its own: the restored batch, or after
    a rescale Spark's repartition batch (committed by the rescale, not by the version under check)."""
    return restored.batch_id if restored.repartition_batch_id is None else restored.repartition_batch_id


def rescale_options(state_partitions: int | None) -> dict[str, Any]:
    """The restore's keyword for ``state_partitions`` (none when not given)."""
    return {} if state_partitions is None else {"state_partitions": state_partitions}


def _take_check_savepoint(ctx: lifecycle.JobContext, state: lifecycle.JobState, inflight_wait: float):
    """A manual savepoint of the running version's live checkpoint; one in flight is waited for."""
    deadline = time.monotonic() + inflight_wait
    while True:
        try:
            return take_savepoint(ctx.checkpoint(state.checkpoint), ctx.job.name, savepoint_dir=ctx.root,
                                  savepoint_type=SavepointType.MANUAL, reason=CHECK_REASON,
                                  spark_version=state.spark_version,
                                  job_version=state.version or ctx.job.version().model_dump())
        except SavepointInFlightError:
            if time.monotonic() >= deadline:
                raise
            lifecycle.wait_for_savepoint_in_flight(ctx, max(deadline - time.monotonic(), 1))


def _wait_for_result(scratch: Store, run: JobRun, timeout: float, poll: float = 0.5, *, secret: str,
                     log: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """The check driver's ``result.json``, sealed with ``secret`` (a result that is not counts as
    absent, with a warning); a failure when it exits without one or is not done in time."""
    warned: list[str] = []

    def forged(url: str) -> None:
        warned.append(text := f"{url} is not sealed with this check's secret (forged, or written by another driver): ignored")
        log(f"warning: {text}")

    forged_once = trust.once_per_file(forged)  # one file: one warning, kept for the outcome's words

    def authentic() -> dict[str, Any] | None:
        return read_result(scratch, secret, forged_once)

    deadline = time.monotonic() + timeout
    while (result := authentic()) is None:
        if LocalRunner().status(run.target()).state == "ended":
            return authentic() or {
                "outcome": "failed", "error": f"its driver exited before it checked a batch"
                                              f"{' (' + warned[0] + ')' if warned else ''}; last log lines:\n"
                                              f"{log_tail(run.log_file)}"}
        if time.monotonic() >= deadline:
            return {"outcome": "no_batch", "error": f"its driver gave no answer within {timeout:.0f}s"
                                                    + (f" ({warned[0]})" if warned else "")}
        time.sleep(poll)
    return result


def _remove_scratch(ctx: lifecycle.JobContext, scratch: Store, attempts: int = 3) -> None:
    """Delete the check's scratch folder, and only it. Someone writing into it meanwhile can make a removal
    fail (a folder not empty): tried again, then left with a warning; it never hides the check's verdict."""
    for attempt in range(1, attempts + 1):
        try:
            ctx.folder.child(CHECK_FOLDER).remove_tree(scratch.name)
            return
        except StorageError as exc:
            if attempt == attempts:
                ctx.log(f"warning: the check's scratch folder {scratch.url} was not removed ({exc}); "
                        "delete it by hand once nothing writes into it")
                return
            time.sleep(0.2 * attempt)


def _end_check_run(run: JobRun, grace: float, job: StreamingJob) -> None:
    """Let the check's driver exit by itself (it stops its query after the check), else end it through its runner."""
    target = run.target(job.master, job.master_ui)
    target.app_name = job.name
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and LocalRunner().status(target).state == "running":
        time.sleep(0.2)
    kill(target, grace)
