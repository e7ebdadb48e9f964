"""Upgrade a running job to a new version, with a health check and an automatic rollback.

The Flink Kubernetes operator's ``upgradeMode`` and ``deployment.rollback.enabled``, for Spark
Structured Streaming jobs started by :mod:`airflow_savepoints.jobs.workflows.lifecycle`:

* ``savepoint``: stop with a ``stop`` savepoint, start the new version from it (a restored copy);
* ``last-state``: stop cleanly (a ``stop`` savepoint is still recorded, so a rollback has something
  to go to), then start the new version on the same live checkpoint, copying nothing: Spark's own
  recovery. Refused, before anything is stopped, when the run cannot stop cleanly (it does not run
  the in-job helper) or the live checkpoint fails the planner's checks for its newest committed
  batch; ``fallback_to_savepoint`` turns the refusal into a ``savepoint`` upgrade;
* ``stateless``: the new version starts with EMPTY state in a new checkpoint; only with
  ``allow_stateless``.

Before anything stops (by default in ``savepoint`` mode, ``check_first``), the new version runs one
batch on a scratch copy of the running version's state with a ``noop`` sink
(:mod:`airflow_savepoints.jobs.workflows.check`); a version Spark refuses is refused there, the old one untouched.
A rescale (``state_partitions``) the running version's state cannot take (HDFS-backed state, operators
without Spark's metadata) is refused before even that, from the live checkpoint's files (no Spark).

With ``state_partitions``, the new version's rescale application is submitted before the stop and waits, its
Spark started, for the stop savepoint's copy (:class:`~airflow_savepoints.jobs.workflows.rescale.RescaleStandby`):
the job runs on meanwhile, and the downtime holds the rewrite only.

Healthy: the new version commits a batch past the stop batch within ``health_timeout`` and has
not failed. Otherwise (with ``rollback``, the default) the new run is ended and marked failed, its
checkpoint left as it is, and the previous version starts again from the same stop savepoint (or,
for last-state, on the same live checkpoint, where Spark re-runs an uncommitted batch with the same
offsets): the sink gets every batch once. :class:`UpgradeFailedError` then carries the new
version's error.

A change of resources only (:func:`same_code`: the same application and arguments, the Spark conf
apart from :data:`RESOURCE_CONF` alike, ``state_partitions`` or not: the autoscaler's actions) rolls
back on the new run's own progress instead: what it committed to the sink is what the previous
configuration would have written, and a restart from the stop savepoint would be refused
``sink_ahead`` by a file or Delta sink (a rescale writes its repartition batch into the file sink's
log). A ``rollback`` savepoint of the failed run's checkpoint at its last committed batch, rescaled
back to the previous state partitions when they changed, starts the previous configuration
(:func:`_progress_savepoint`). A real version change keeps the restart from the stop savepoint: the
new version's output cannot be trusted; a sink ahead of it leaves the job stopped, saying why. No
Airflow here: operators and the CLI call :func:`upgrade`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from airflow_savepoints.checkpoint.planner import plan_checkpoint
from airflow_savepoints.core import SavepointType, take_savepoint
from airflow_savepoints.core.models import invalid_input
from airflow_savepoints.core.pointer import resolve_pointer
from airflow_savepoints.errors import SavepointError, SinkAheadError, UpgradeRefusedError
from airflow_savepoints.jobs.description.model import JobVersion, StreamingJob
from airflow_savepoints.jobs.workflows import lifecycle
from airflow_savepoints.jobs.workflows.check import check_upgrade, rescale_options
from airflow_savepoints.jobs.workflows.rescale import STANDBY_READY_TIMEOUT, RescaleStandby, refuse_unrescalable
from airflow_savepoints.jobs.workflows.run import MAX_WORK_TIMEOUT, JobContext

SubmitFor = Callable[[StreamingJob], Callable[[str, dict[str, str]], list[str]]]
UPGRADE_MODES = ("savepoint", "last-state", "stateless")
# the Spark conf of a run's executors (what the autoscaler changes: autoscale.spark_conf_for): a version that
# differs from the running one only there, and in its state partitions, runs the same code
RESOURCE_CONF = frozenset({"spark.cores.max", "spark.executor.cores", "spark.executor.instances",
                           "spark.executor.memory", "spark.dynamicAllocation.maxExecutors"})
ROLLBACK_REASON = "rollback"  # the reason of the savepoint a rollback on the new run's progress takes


class UpgradeFailedError(SavepointError):
    """The new version was not healthy; the job was rolled back (or left stopped without rollback)."""

    code = "upgrade_failed"


class UpgradeRolledBackError(UpgradeFailedError):
    """The new version was not healthy; the previous version runs again from the state it was stopped with, or
    (a change of resources only) from the new run's own progress: ``rolled_back_on`` says which."""

    def __init__(self, message: str, hint: str | None = None, cause: str | None = None,
                 rolled_back_on: dict[str, Any] | None = None):
        super().__init__(message, hint, cause)
        self.rolled_back_on = rolled_back_on or {}


class UpgradeRequest(BaseModel):
    """What to upgrade to, and how."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # an endless timeout would never end a wait

    version: JobVersion
    mode: str | None = None  # savepoint, last-state or stateless; default: the job's upgrade_mode (checked by upgrade())
    fallback_to_savepoint: bool = False  # last-state refused: upgrade with the stop savepoint instead
    allow_stateless: bool = False  # needed for mode 'stateless' (the new version starts with EMPTY state)
    health_timeout: float = Field(default=300, gt=0)  # seconds for the new version to commit past the stop batch
    rollback: bool = True
    grace: float = Field(default=60, gt=0)  # seconds for a run to stop between batches before it is forced
    inflight_wait: float = Field(default=300, ge=0)
    check_first: bool | None = None  # run the new version on a scratch copy first (jobs/workflows/check.py); None: in savepoint mode
    check_timeout: float = Field(default=300, gt=0, le=MAX_WORK_TIMEOUT)  # seconds for the check's batch
    state_partitions: int | None = Field(default=None, ge=1)  # savepoint mode: the check's copy and the new version rescaled

    @model_validator(mode="wrap")
    @classmethod
    def _named(cls, data: Any, handler: Any) -> UpgradeRequest:
        """A bad value (a CLI option, an operator's argument) is an :class:`InvalidInputError` naming the field."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise invalid_input(exc) from None


def new_version(job: StreamingJob, application: str | None = None, application_args: list[str] | None = None,
                spark_conf: dict[str, str] | None = None) -> JobVersion:
    """The job's version with the given fields replaced (None or empty: keep the job's)."""
    return job.variant(application, application_args, spark_conf).version()


def same_code(previous: JobVersion, new: JobVersion) -> bool:
    """Whether ``new`` runs the code of ``previous``: the same application and arguments, and the same Spark
    conf apart from the executors' (:data:`RESOURCE_CONF`). Its output is then the output ``previous`` would
    have written, so a rollback may start ``previous`` on the new run's progress."""
    def code_conf(version: JobVersion) -> dict[str, str]:
        return {k: v for k, v in version.spark_conf.items() if k not in RESOURCE_CONF}

    return (previous.application, previous.application_args, code_conf(previous)) == \
        (new.application, new.application_args, code_conf(new))


def running_version(ctx: JobContext, state: lifecycle.JobState) -> JobVersion:
    """The version the job's run was started with (its run record), else the jobs file's."""
    return JobVersion.model_validate(state.version) if state.version else ctx.job.version()


def checkpoint_problem(ctx: JobContext, checkpoint: str | None) -> str | None:
    """Why the live checkpoint cannot be resumed as it is (the planner's checks for its newest
    committed batch fail), or None."""
    if not checkpoint:
        return "the run's checkpoint is not known"
    store = ctx.checkpoint(checkpoint)
    try:
        plan = plan_checkpoint(store.list_files_lazily(), store.read_bytes, where=store.url)
    except (SavepointError, OSError, ValueError) as exc:
        return f"its live checkpoint {checkpoint} fails the checks: {exc}"
    ctx.log(f"live checkpoint {checkpoint} passes the checks at batch {plan.batch_id}")
    return None


def _mode(ctx: JobContext, request: UpgradeRequest, state: lifecycle.JobState) -> str:
    """The mode to upgrade with, refusing (before anything changes) what cannot be done."""
    mode = request.mode or ctx.job.upgrade_mode
    if mode not in UPGRADE_MODES:
        raise UpgradeRefusedError(f"unknown upgrade mode {mode!r}", f"use one of {', '.join(UPGRADE_MODES)}")
    if mode == "stateless" and not request.allow_stateless:
        raise UpgradeRefusedError(f"a stateless upgrade of job '{ctx.job.name}' starts it with EMPTY state",
                                  "pass allow_stateless (--allow-stateless) if that is meant, or use mode savepoint")
    if request.state_partitions is not None and mode != "savepoint":
        raise UpgradeRefusedError(f"state_partitions rescales the state through the stop savepoint; mode {mode} has none",
                                  "use mode savepoint (--mode savepoint) to rescale; nothing was stopped")
    if not state.live:
        raise UpgradeRefusedError(f"job '{ctx.job.name}' is {state.state}, not running: nothing to upgrade",
                                  "start it (restore_from_savepoint, `airflow-savepoints job start`) instead")
    if mode == "last-state":
        problem = None if state.helper else "the run does not call run_until_stopped, so it cannot stop cleanly"
        problem = problem or checkpoint_problem(ctx, state.checkpoint)
        if problem is not None:
            if not request.fallback_to_savepoint:
                raise UpgradeRefusedError(f"last-state upgrade of job '{ctx.job.name}' refused: {problem}",
                                          "fix that, or allow the fallback to a savepoint upgrade "
                                          "(fallback_to_savepoint, --fallback-to-savepoint); nothing was stopped")
            ctx.log(f"last-state refused ({problem}): upgrading with a savepoint instead")
            mode = "savepoint"
    return mode


def _check_first(ctx: JobContext, request: UpgradeRequest, mode: str, submit_for: SubmitFor,
                 log_dir: Path) -> dict[str, Any] | None:
    """The check of the new version before anything stops (by default in savepoint mode); raises
    :class:`UpgradeCheckFailedError` (the running version untouched) when it fails."""
    if not (request.check_first if request.check_first is not None else mode == "savepoint"):
        return None
    if mode == "stateless":
        raise UpgradeRefusedError(f"a stateless upgrade of job '{ctx.job.name}' carries no state: nothing to check",
                                  "drop check_first (--no-check-first) for a stateless upgrade")
    return check_upgrade(ctx, request.version, submit_for=submit_for, log_dir=log_dir, timeout=request.check_timeout,
                         state_partitions=request.state_partitions, inflight_wait=request.inflight_wait)


def _start_kwargs(ctx: JobContext, mode: str, stopped: dict[str, Any]) -> dict[str, Any]:
    """How a version starts after the stop: on the live checkpoint, from the stop savepoint, or empty."""
    if mode == "last-state":
        return {"resume": stopped["checkpoint"]}
    if mode == "stateless":
        return {"fresh": True, "target_checkpoint": f"{ctx.job.checkpoint.rstrip('/')}-{datetime.now(UTC):%Y%m%dT%H%M%S}"}
    return {"pointer": stopped["pointer"]}


def _start_healthy(ctx: JobContext, kwargs: dict[str, Any], request: UpgradeRequest, submit_for: SubmitFor,
                   log_dir: Path, past_batch: int | None) -> dict[str, Any]:
    """Start ``ctx.job`` and wait until it is healthy: a committed batch past ``past_batch`` (any,
    when None) within the health timeout, and no failure. Raises why not."""
    if "resume" in kwargs:
        started = lifecycle.resume(ctx, kwargs["resume"], submit_command=submit_for(ctx.job), log_dir=log_dir,
                                   wait_timeout=request.health_timeout)
    else:
        started = lifecycle.start(ctx, submit_command=submit_for(ctx.job), log_dir=log_dir,
                                  wait_timeout=request.health_timeout, **kwargs)
    rescaled = (started.get("restored") or {}).get("repartition_batch_id")
    if past_batch is not None and rescaled is not None:  # Spark's repartition batch is not one the version ran
        past_batch = max(past_batch, rescaled)
    if past_batch is not None and started["first_batch"] <= past_batch:  # live by its heartbeat: health is a new batch
        started = {**started, "first_batch": lifecycle.wait_for_new_batch(ctx, request.health_timeout)}
    if past_batch is not None and started["first_batch"] <= past_batch:
        raise lifecycle.JobFailedError(f"run {started['run_id']} committed batch {started['first_batch']}, not past "
                                       f"the stop batch {past_batch}", "see its log in " + str(started["log_file"]))
    state = lifecycle.status(ctx)
    if state.state in ("failed", "lost", "stopped"):
        raise lifecycle.JobFailedError(f"run {started['run_id']} is {state.state} after its first batch: "
                                       f"{state.error or state.detail}", f"see its log in {started['log_file']}")
    return started


def upgrade(ctx: JobContext, request: UpgradeRequest, *, submit_for: SubmitFor, log_dir: Path) -> dict[str, Any]:
    """Upgrade the running job of ``ctx`` to ``request.version``; roll back if it is not healthy.

    ``submit_for(job)`` gives the submit command builder of a job version (the Spark provider's in
    operators, plain spark-submit in the CLI). Returns what was done; raises
    :class:`UpgradeRefusedError` before anything changes, or :class:`UpgradeFailedError` (with the
    new version's error) after a rollback."""
    state = lifecycle.status(ctx)
    mode = _mode(ctx, request, state)
    if request.state_partitions is not None:  # what the rescale would refuse, refused before the check and the stop
        refuse_unrescalable(ctx, state, request.state_partitions)
    previous = running_version(ctx, state)
    old_ctx = replace(ctx, job=ctx.job.with_version(previous))
    new_ctx = replace(ctx, job=ctx.job.with_version(request.version))
    checked = _check_first(ctx, request, mode, submit_for, log_dir)
    standby = _rescale_standby(new_ctx, request, mode, submit_for, log_dir)
    try:
        ctx.log(f"upgrading job {ctx.job.name} from version {previous.hash} to {request.version.hash} ({mode})")
        stopped = lifecycle.stop(old_ctx, grace=request.grace, inflight_wait=request.inflight_wait)
        if mode == "last-state" and (stopped["consistency"] != "clean" or stopped["stop_method"] != "cooperative"):
            ctx.log(f"the stop was not clean ({stopped['stop_method']}, {stopped['consistency']}): using its savepoint")
            mode = "savepoint"
        kwargs = _start_kwargs(ctx, mode, stopped)
        if "pointer" in kwargs:  # the new version restored (rescaled if asked) as the check's copy was; a rollback keeps them
            kwargs.update(rescale_options(request.state_partitions), rescale_standby=standby)
        summary = {"job": ctx.job.name, "mode": mode, "from_version": previous.model_dump(),
                   "to_version": request.version.model_dump(), "stop_savepoint": stopped["pointer"],
                   "stop_batch": stopped["batch_id"], "stopped_run": stopped["run_id"], "check": checked,
                   "rescale_standby": None}
        error: SavepointError | None = None
        try:
            started = _start_healthy(new_ctx, kwargs, request, submit_for, log_dir,
                                     None if mode == "stateless" else stopped["batch_id"])
        except SavepointError as exc:
            error = exc
        if standby is not None:  # what it did, reported whether the new version runs or is rolled back
            summary["rescale_standby"] = standby.summary()
        if error is None:
            ctx.log(f"job {ctx.job.name} runs version {request.version.hash}: batch {started['first_batch']} committed")
            return {**summary, "started": started, "copied_bytes": 0 if mode == "last-state" else None}
    finally:
        if standby is not None:
            standby.close()
    return _roll_back(old_ctx, new_ctx, request, error, summary, submit_for, log_dir)


def _rescale_standby(ctx: JobContext, request: UpgradeRequest, mode: str, submit_for: SubmitFor,
                     log_dir: Path) -> RescaleStandby | None:
    """The new version's rescale application, its Spark started while the job still runs (the stop waits for it):
    None without a rescale, or when it was not ready in time (the rescale then runs as its own application after
    the stop, as a ``job start`` does)."""
    if request.state_partitions is None or mode != "savepoint":
        return None
    standby = RescaleStandby.start(ctx, submit_for(ctx.job), log_dir)
    try:
        ready = standby.wait_ready()
    except BaseException:
        standby.close()
        raise
    if ready:
        ctx.log(f"the rescale application of job {ctx.job.name} stands by: its Spark started and warmed up in "
                f"{standby.ready_after_s:.1f}s while the job runs")
        return standby
    ctx.log(f"warning: the rescale application of job {ctx.job.name} was not ready within {STANDBY_READY_TIMEOUT:.0f}s "
            f"(its log: {standby.log_file}); the rescale runs as its own application after the stop")
    standby.close()
    return None


def _roll_back(old_ctx: JobContext, new_ctx: JobContext, request: UpgradeRequest, error: SavepointError,
               summary: dict[str, Any], submit_for: SubmitFor, log_dir: Path) -> dict[str, Any]:
    """End the new version's run and start the previous version from the state it was stopped with, or (a
    change of resources only) from the new run's progress (:func:`_progress_savepoint`)."""
    name, new_hash = new_ctx.job.name, new_ctx.job.version().hash
    reason = f"version {new_hash} was not healthy: {error}"
    failed = lifecycle.status(new_ctx)  # before the end: the run, its Spark version
    ended = lifecycle.abandon(new_ctx, reason, grace=request.grace)
    if not request.rollback:
        raise UpgradeFailedError(f"upgrade of job '{name}' to version {new_hash} failed ({ended['method']}); the job "
                                 f"is down, not rolled back: {error}",
                                 f"start the previous version from {summary['stop_savepoint']}")
    mode = "last-state" if summary["mode"] == "last-state" else "savepoint"
    progress, why_not = None, None
    if mode == "savepoint" and same_code(old_ctx.job.version(), new_ctx.job.version()):
        try:
            progress = _progress_savepoint(old_ctx, summary, failed, ended.get("checkpoint"))
        except SavepointError as exc:
            why_not = f"no savepoint of the new run's checkpoint {ended.get('checkpoint')} ({exc.code}: {exc.message})"
            old_ctx.log(f"{why_not}: rolling back from the stop savepoint")
    if progress is not None:
        kwargs = {"pointer": progress["pointer"], **rescale_options(progress.get("state_partitions"))}
        how = (f"on the new run's progress: savepoint {progress['savepoint_id']} of batch {progress['batch_id']}"
               + (f", rescaled back to {progress['state_partitions']} state partitions"
                  if progress.get("state_partitions") else ""))
    else:
        kwargs = _start_kwargs(old_ctx, mode, {"checkpoint": ended["checkpoint"], "pointer": summary["stop_savepoint"]})
        how = f"from the stop savepoint {summary['stop_savepoint']}" if mode == "savepoint" else \
            f"on the live checkpoint {ended['checkpoint']}"
    old_ctx.log(f"rolling job {name} back to version {old_ctx.job.version().hash} ({mode}, {how})")
    try:
        back = _start_healthy(old_ctx, kwargs, request, submit_for, log_dir, None)
    except SavepointError as exc:
        raise _rollback_failed(name, new_hash, error, exc, summary, progress, why_not) from exc
    if progress is not None:
        on: dict[str, Any] = {"from": "progress", **progress}
    elif mode == "savepoint":
        on = {"from": "stop_savepoint", "pointer": summary["stop_savepoint"], "batch_id": summary["stop_batch"]}
    else:
        on = {"from": "checkpoint", "checkpoint": ended["checkpoint"]}
    raise UpgradeRolledBackError(
        f"upgrade of job '{name}' to version {new_hash} failed: {error}\nrolled back: version "
        f"{old_ctx.job.version().hash} runs again as run {back['run_id']} ({mode}, {how})",
        "fix the new version, then upgrade again",
        rolled_back_on={**on, "run_id": back["run_id"], "first_batch": back["first_batch"]})


def _progress_savepoint(ctx: JobContext, summary: dict[str, Any], failed: lifecycle.JobState,
                        checkpoint: str | None) -> dict[str, Any] | None:
    """A ``rollback`` savepoint of the failed new run's checkpoint at its last committed batch, for the previous
    configuration of the same code to start from: its pointer, id and batch, and the state partitions to rescale
    back to when the new run's differ from the stop savepoint's; None (the stop savepoint then) when the new run
    never started. Raises what the savepoint raises (its checkpoint cannot be savepointed)."""
    if not checkpoint or failed.run_id is None or failed.run_id == summary.get("stopped_run"):
        return None  # the new run never started (its restore failed): nothing of it reached the sink
    info = take_savepoint(ctx.checkpoint(checkpoint), ctx.job.name, savepoint_dir=ctx.root,
                          savepoint_type=SavepointType.MANUAL, reason=ROLLBACK_REASON, spark_version=failed.spark_version,
                          job_version=failed.version)
    _, stop_manifest = resolve_pointer(summary["stop_savepoint"], ctx.root.storage_options)
    before, now = set(stop_manifest.state_partitions().values()), set(info.manifest.state_partitions().values())
    partitions = next(iter(before)) if len(before) == 1 and now != before else None
    ctx.log(f"rollback savepoint {info.pointer} of the failed run {failed.run_id}'s batch {info.manifest.batch_id}")
    return {"pointer": info.pointer, "savepoint_id": info.manifest.savepoint_id, "batch_id": info.manifest.batch_id,
            "failed_run_id": failed.run_id, "checkpoint": checkpoint, "state_partitions": partitions}


def _rollback_failed(name: str, new_hash: str, error: SavepointError, exc: SavepointError, summary: dict[str, Any],
                     progress: dict[str, Any] | None, why_not: str | None) -> UpgradeFailedError:
    """The job is left stopped: the new version failed and so did the rollback; why, and what to do."""
    text = f"upgrade of job '{name}' to version {new_hash} failed: {error}\nand the rollback failed too: {exc}"
    if progress is not None:
        back = progress.get("state_partitions")
        return UpgradeFailedError(
            text + f" (from the new run's progress: savepoint {progress['pointer']} of batch {progress['batch_id']}"
            + (f", rescaled back to {back} state partitions" if back else "") + "); the job is stopped",
            f"start it from {progress['pointer']}" + (" (without --state-partitions if the rescale back is what "
                                                      "failed: it then keeps the new run's partitions)" if back else ""))
    if why_not:
        text += f"\n(not rolled back on the new run's progress: {why_not})"
    if isinstance(exc, SinkAheadError) and summary["mode"] == "savepoint":
        return UpgradeFailedError(
            text + f"; the new version wrote to the sink past the stop batch {summary['stop_batch']}"
            + ("" if why_not else ", and a change of code is not rolled back on its progress (its output is not the "
               "previous version's)") + "; the job is stopped",
            f"remove the sink's output after batch {summary['stop_batch']} and start the previous version from "
            f"{summary['stop_savepoint']}, or fix the new version and start it (`airflow-savepoints job start`)")
    return UpgradeFailedError(text, f"restart it from {summary['stop_savepoint']}")
