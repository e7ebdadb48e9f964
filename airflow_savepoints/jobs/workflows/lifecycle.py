"""The lifecycle of a streaming job across machines: start, stop with a savepoint, cancel, status.

Everything goes through shared storage, so any Airflow worker (or a terminal) may call any of
these, wherever the driver runs:

* ``<savepoint dir>/<job>/_lease.json``: the run lease, one live run per job
  (:mod:`airflow_savepoints.jobs.description.lease`);
* ``<savepoint dir>/<job>/_control/<run id>/``: the run's control folder (heartbeats, stop
  requests and answers; :mod:`airflow_savepoints.jobs.driver.control`);
* ``<savepoint dir>/<job>/_run.json``: the run a start launched (pid, host, log, command);
* the runner back ends (:mod:`airflow_savepoints.jobs.launch.runners`) for what storage cannot say.

The verbs here are short scripts over one run object, :class:`~airflow_savepoints.jobs.workflows.run.Run`,
which reads these files once (through :mod:`airflow_savepoints.jobs.description.files`, which checks them)
and is the only code that signals a process, keeps or deletes a checkpoint or writes a stop request.
These files only describe a run:
the checkpoint deleted, kept or copied is always one the job owns (its configured checkpoint or
``<checkpoint>-<UTC time>``), the control folder written is ``_control/<run id>`` of the job's
folder, and a process is signalled only when host, pid, start time and its run token match
(:mod:`airflow_savepoints.jobs.description.trust`). A damaged file
counts as absent, with a warning in the answer (``warnings``).

States: ``not_started`` (no run recorded), ``starting`` (lease taken, no heartbeat yet),
``running``, ``stopping`` (a stop was asked for), ``stopped``, ``failed`` (with the error),
``lost`` (heartbeats lapsed: the driver died, hangs or is cut off; a new start may take over),
``unknown`` (a job without the helper whose runner cannot tell from here). A heartbeat's age is
measured on the store's clock, never this machine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.core import SavepointType, restore_savepoint, take_savepoint
from airflow_savepoints.core.lease import JobLock
from airflow_savepoints.core.names import RUN_FILE
from airflow_savepoints.core.pointer import resolve_pointer
from airflow_savepoints.core.savepoint import check_apart
from airflow_savepoints.core.spark_cause import spark_message
from airflow_savepoints.core.termination import parse_policy
from airflow_savepoints.errors import (  # noqa: F401 - JobNotStoppedError, NoSavepointError: imported from here
    ForeignSavepointError,
    InvalidInputError,
    JobNotRunningError,
    JobNotStoppedError,
    JobRunningError,
    NoSavepointError,
    SavepointInFlightError,
    UntrustedRunFileError,
)
from airflow_savepoints.jobs.description.channel import CONTROL_FOLDER, SKIP_MISSING_INPUT_CONF, JobControl, new_run_id, run_conf
from airflow_savepoints.jobs.description.files import control_folder
from airflow_savepoints.jobs.description.lease import DEFAULT_LEASE_TIMEOUT
from airflow_savepoints.jobs.description.model import StreamingJob
from airflow_savepoints.jobs.description.record import JobRun, read_run, restore_default, write_run
from airflow_savepoints.jobs.launch.launcher import JobFailedError, application_id_from_log, log_tail, start_detached
from airflow_savepoints.jobs.launch.runners import (
    LocalRunner,
    YarnRunner,
    check_yarn_queue,
    check_yarn_start,
    runner_for,
)
from airflow_savepoints.jobs.workflows.rescale import RescaleStandby, rescale_on_the_job
from airflow_savepoints.jobs.workflows.run import (  # noqa: F401 - imported from here
    LIVE_STATES,
    JobContext,
    JobState,
    JobStatus,
    Run,
    State,
    job_status,
)
from airflow_savepoints.storage import Store


def status(ctx: JobContext) -> JobState:
    """The job's state from its lease, the run's heartbeat (aged on the store's clock) and runner."""
    return Run.read(ctx).state()


def _running_error(ctx: JobContext, state: JobState) -> JobRunningError:
    pid = f" as pid {state.pid}" if state.pid else ""
    return JobRunningError(
        f"job '{ctx.job.name}' is already running{pid} on {state.host or 'an unknown host'} (run {state.run_id}, "
        f"application {state.application_id or 'unknown'}, state {state.state}"
        + (f": {state.detail}" if state.detail else "") + f"); checkpoint {state.checkpoint}; "
        "a second run would write the same sink twice",
        f"stop it first (stop_job_with_savepoint, or `airflow-savepoints job stop {ctx.job.name}`), then start again",
    )


def handle_failure(ctx: JobContext, state: JobState, policy: str | None = None, *,
                   run: Run | None = None) -> dict[str, Any] | None:
    """Apply the checkpoint retention policy for a failure to a failed or lost run, once: keep (and
    register as a ``retained_checkpoint`` savepoint) or delete its checkpoint; mark the run ended.
    ``run``: the run ``state`` was read from (read again if not given)."""
    current = run or Run.read(ctx)
    if state.state not in ("failed", "lost") or state.ended is not None or not current.checkpoint:
        return None
    reason = state.error or state.detail or state.state
    outcome = current.apply_retention(policy or ctx.job.checkpoint_retention, "failed", state)
    outcome = {**outcome, "reason": f"{'lost: ' if state.state == 'lost' else ''}{reason}", "pid": state.pid,
               "run_id": state.run_id}
    current.record_end("failed", outcome)
    return outcome


SubmitCommand = Callable[[str, dict[str, str]], list[str]]


def start(ctx: JobContext, *, submit_command: SubmitCommand, log_dir: Path, pointer: str | None = None,
          fresh: bool = False, target_checkpoint: str | None = None, wait_timeout: float = 300,
          allow_foreign_savepoint: bool = False, rescale_standby: RescaleStandby | None = None,
          **restore_checks: Any) -> dict[str, Any]:
    """Start the job: from ``pointer``, else its newest completed savepoint, or with empty state
    (``fresh``). Refuses while another run lives; takes over the lease of a lost run (after applying
    its checkpoint retention policy, which keeps and savepoints its last committed batch). Returns
    once the run is live: its heartbeat says its query is active, at the restored batch (a source
    with no new input is healthy; a fresh start waits for its first batch); a job without the
    helper once it commits a batch past the one it started from. ``first_batch`` is the newest
    committed batch then, ``live`` how it was seen (``heartbeat`` or ``commit``). The run goes on
    detached. ``restore_checks``
    (``max_age``, ``skip_missing_input``, ``state_partitions``) go to the restore: see :func:`restore_savepoint`;
    a rescale runs in ``rescale_standby`` when an upgrade started one before its stop.

    A ``pointer`` to a savepoint of another job, or outside this job's folder of the savepoint
    root, is refused (:class:`ForeignSavepointError`) unless ``allow_foreign_savepoint``; the new
    checkpoint must be one the job owns (its own, or ``<checkpoint>-<suffix>``) and apart from the root."""
    return _launch(ctx, submit_command, log_dir, wait_timeout,
                   lambda: _prepare_checkpoint(ctx, pointer, fresh, target_checkpoint,
                                               rescale_on_the_job(ctx, submit_command, log_dir, restore_checks, rescale_standby),
                                               allow_foreign_savepoint),
                   run_settings={SKIP_MISSING_INPUT_CONF: "true"} if restore_checks.get("skip_missing_input") else None)


def resume(ctx: JobContext, checkpoint: str, *, submit_command: SubmitCommand, log_dir: Path,
           wait_timeout: float = 300) -> dict[str, Any]:
    """Start the job on the live checkpoint ``checkpoint`` as it is (Spark's own recovery, nothing
    copied: a last-state start); otherwise as :func:`start`."""
    return _launch(ctx, submit_command, log_dir, wait_timeout, lambda: _resume_checkpoint(ctx, checkpoint))


def _launch(ctx: JobContext, submit_command: SubmitCommand, log_dir: Path, wait_timeout: float,
            prepare: Callable[[], tuple[str, dict[str, str], dict[str, Any] | None]], *,
            run_settings: dict[str, str] | None = None) -> dict[str, Any]:
    """Take the lease, ``prepare()`` the checkpoint, launch the run and wait until it is live.
    ``run_settings``: Spark conf the start passes to the in-job helper (``spark.savepoints.*``)."""
    job = ctx.job
    if isinstance(runner_for(ctx.master), YarnRunner):  # refused before anything is taken, restored or started
        check_yarn_start(job.master_ui)
        check_yarn_queue(submit_command(job.checkpoint, {}), job.master_ui)
    previous_run = Run.read(ctx)
    previous = previous_run.state()
    if previous.live:
        raise _running_error(ctx, previous)
    handled = handle_failure(ctx, previous, run=previous_run)
    if handled is not None:
        ctx.log(f"previous run {previous.run_id} was {previous.state}: checkpoint {handled['action']} "
                f"({handled['policy']})")
    if previous.run_id and previous.state in ("stopped", "failed"):
        ctx.lease.release(previous.run_id)  # its lease, left by a driver that could not release it
    run_id = new_run_id()
    control = ctx.folder.child(CONTROL_FOLDER).child(run_id)
    timeout = ctx.lease_timeout or DEFAULT_LEASE_TIMEOUT
    version = job.version()
    # on a local disk the lease makes the job's folder (and the root): a start that fails removes them if left empty
    made_root, made_folder = (ctx.root.is_local and not ctx.root.exists(),
                              ctx.folder.is_local and not ctx.folder.exists())
    holder = ctx.lease.acquire(run_id, {"host": _hostname(), "control": control.url, "master": ctx.master,
                                        "timeout_s": timeout, "version": version.hash},
                               may_take_over=lambda h: h.run_id == previous.run_id and previous.state == "lost")
    if holder is not None:
        raise _running_error(ctx, status(ctx))
    try:
        with ctx.lease.kept(run_id):  # a restore may take long; a start that dies meanwhile leaves a lease that lapses
            checkpoint, extra_conf, restored = prepare()
        conf = {**extra_conf, **(run_settings or {}),
                **run_conf(ctx.folder.url, run_id=run_id, checkpoint=checkpoint, heartbeat_interval=ctx.heartbeat_interval,
                           lease_timeout=ctx.lease_timeout, cluster=job.deploy_mode == "cluster")}
        run = start_detached(job.name, submit_command(checkpoint, conf), ctx.checkpoint(checkpoint), ctx.folder,
                             log_dir, control=control, master=ctx.master, master_ui=job.master_ui,
                             version=version.model_dump(), secrets=job.secrets())
        ctx.lease.renew(run_id, {"pid": run.pid, "pid_started": run.pid_started, "checkpoint": checkpoint})
    except BaseException:
        ctx.lease.release(run_id)
        if made_folder:  # a start refused (no savepoint, a sink's refusal...) leaves no empty folder behind
            ctx.root.remove_empty_folders([job.name])
        if made_root:
            ctx.root.parent().remove_empty_folders([ctx.root.name])
        raise
    batch, live = _wait_until_live(ctx, run, wait_timeout)
    ctx.log(f"job {job.name} runs as run {run_id} (pid {run.pid}): " + (
        f"live (heartbeat), at batch {batch}" if live == "heartbeat" else f"committed batch {batch}"))
    application_id = read_run(ctx.folder).application_id or (JobControl(control).heartbeat() or {}).get("application_id")
    return {"job": job.name, "run_id": run_id, "pid": run.pid, "host": run.host, "checkpoint": checkpoint,
            "first_batch": batch, "live": live, "log_file": run.log_file, "savepoint_dir": ctx.root.url,
            "restored": restored, "sink": (restored or {}).get("sink"), "application_id": application_id,
            "version": version.model_dump(),
            "start_batch": run.start_batch}


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _new_checkpoint(ctx: JobContext, checkpoint: str) -> str:
    """``checkpoint`` if a new run of the job may use it: one the job owns, apart from the savepoint root."""
    store = ctx.checkpoint(checkpoint)  # a relative path or unknown scheme is refused first
    if not ctx.job.owns_checkpoint(checkpoint):
        raise InvalidInputError(f"job '{ctx.job.name}': checkpoint {checkpoint} is neither its configured checkpoint "
                                f"{ctx.job.checkpoint} nor named after it", f"give {ctx.job.checkpoint.rstrip('/')}-<suffix>, "
                                "or change the job's checkpoint in the jobs file")
    check_apart(store, ctx.root)
    return checkpoint


def own_savepoint(ctx: JobContext, pointer: str) -> None:
    """Refuse (:class:`ForeignSavepointError`) a savepoint that is not one of this job in its folder of the root."""
    location, manifest = resolve_pointer(pointer, ctx.root.storage_options)
    inside = ctx.folder.contains(location) and ctx.folder.resolved().contains(location.resolved())
    if inside and manifest.job == ctx.job.name:
        return
    whose = f"of job '{manifest.job}'" if manifest.job != ctx.job.name else f"outside {ctx.folder.url}"
    raise ForeignSavepointError(
        f"savepoint {location.url} is {whose}, not one of job '{ctx.job.name}' in {ctx.folder.url}",
        "pass --from-other-job (allow_foreign_savepoint=True) if starting this job from it is meant")


def _prepare_checkpoint(ctx: JobContext, pointer: str | None, fresh: bool, target: str | None,
                        restore_checks: dict[str, Any],
                        allow_foreign: bool = False) -> tuple[str, dict[str, str], dict[str, Any] | None]:
    """The new run's checkpoint: the job's (empty) one for a fresh start, else a restored savepoint."""
    job, root = ctx.job, ctx.root
    if fresh:
        checkpoint = _new_checkpoint(ctx, target or job.checkpoint)
        if ctx.checkpoint(checkpoint).list_files():
            raise InvalidInputError(
                f"fresh_start needs an empty checkpoint location, but {checkpoint} holds files",
                "restore from a savepoint instead, or give an empty target_checkpoint",
            )
        ctx.log(f"starting job {job.name} with EMPTY state (fresh start) at {checkpoint}")
        return checkpoint, {}, None
    if pointer is None:
        latest = restore_default(root, job.name)
        if latest is None:
            raise NoSavepointError(f"job '{job.name}' has no completed savepoint of its current lineage in {root.url}",
                                   "pass a pointer, or fresh_start=True (--fresh) to start it with empty state")
        pointer = latest.pointer
    elif not allow_foreign:
        own_savepoint(ctx, pointer)
    checkpoint = _new_checkpoint(ctx, target or f"{job.checkpoint.rstrip('/')}-{datetime.now(UTC):%Y%m%dT%H%M%S}")
    kafka = {"kafka_bootstrap_servers": job.kafka.bootstrap_servers, "kafka_options": job.kafka.client_options} if job.kafka else {}
    result = restore_savepoint(pointer, checkpoint, storage_options=root.storage_options,
                               target_storage_options=ctx.checkpoint_options, **kafka,
                               **{**sink_checks(ctx), **restore_checks})
    ctx.log(f"restored {pointer} (batch {result.batch_id}) into {checkpoint}")
    if result.repartition_batch_id is not None and ctx.job.sink is None:
        ctx.log(f"warning: job {ctx.job.name} declares no sink: {result.sink.detail}")
    return checkpoint, result.spark_conf_to_set, result.model_dump(mode="json")


def sink_checks(ctx: JobContext) -> dict[str, Any]:
    """What a restore of the job checks of its sink: the jobs file's ``sink:``, and the last batch the job
    committed (its recorded run's checkpoint), so the restore can say which batches run again."""
    sink, run = ctx.job.sink, read_run(ctx.folder)
    checks: dict[str, Any] = {}
    if sink is not None and sink.kind != "other":
        checks.update(sink_kind=sink.kind, sink_path=sink.path, sink_app_id=sink.app_id,
                      sink_storage_options=sink.storage_options if sink.storage_options is not None
                      else ctx.root.options_for(sink.path) if sink.path else None)
    if run is not None and ctx.job.owns_checkpoint(run.checkpoint):
        checks["rerun_until"] = checkpoint_progress(ctx.checkpoint(run.checkpoint))[0]
    return checks


def _resume_checkpoint(ctx: JobContext, checkpoint: str) -> tuple[str, dict[str, str], None]:
    """A last-state start: the live checkpoint as it is; Spark recovers from it, nothing is copied."""
    checkpoint = _new_checkpoint(ctx, checkpoint)
    if not ctx.checkpoint(checkpoint).list_files("commits"):
        raise InvalidInputError(f"checkpoint {checkpoint} has no committed batch to resume from",
                                "start from a savepoint instead (upgrade mode 'savepoint')")
    ctx.log(f"starting job {ctx.job.name} on its live checkpoint {checkpoint} (last-state: nothing copied)")
    return checkpoint, {}, None


def _wait_until_live(ctx: JobContext, run: JobRun, timeout: float, poll: float = 1.0, *,
                     new_batch: bool = False) -> tuple[int | None, str]:
    """Wait until the run is live; returns its newest committed batch and how it was seen live.

    Live: it committed a batch newer than the one it started from (``"commit"``), or its heartbeat
    says its query is active (``running``) and completed a trigger with no data (``triggered``: an
    idle source is healthy; ``"heartbeat"``). A run without the helper writes no heartbeat, and so
    does ``new_batch``'s wait ignore it: then only a commit counts. Fails fast (:class:`JobFailedError`)
    if the run's query fails first (with Spark's message, from its ``failed.json``), or it exits or
    is fenced. Keeps the run's lease until its driver renews it, and records its application id."""
    checkpoint = ctx.checkpoint(run.checkpoint)
    folder = control_folder(ctx.folder, run.run_id)
    control = JobControl(folder) if folder is not None else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.application_id is None and (app := application_id_from_log(run.log_file)):
            run = run.model_copy(update={"application_id": app})
            write_run(ctx.folder, run)
        batch, _ = checkpoint_progress(checkpoint)
        if batch is not None and (run.start_batch is None or batch > run.start_batch):
            return batch, "commit"
        heartbeat = control.heartbeat() if control is not None else None
        failure = control.failure() if control is not None else None
        if failure is None and heartbeat is not None and heartbeat.get("state") == "failed":
            failure = heartbeat
        if failure is not None:
            raise JobFailedError(
                f"job '{run.job}' run {run.run_id} failed before committing a batch past {run.start_batch}: "
                + spark_message(str(failure.get("error") or "no error recorded")),
                f"see the full log in {run.log_file} and `airflow-savepoints job status {run.job}`; fix the cause, "
                "then start it again")
        if heartbeat is not None and heartbeat.get("state") == "running" and heartbeat.get("triggered") is True \
                and not new_batch:
            return batch, "heartbeat"
        if control is not None and (fenced := control.fenced()) is not None:
            raise JobFailedError(f"job '{run.job}' run {run.run_id} stopped itself: {fenced.get('reason')}",
                                 "another run holds the job's lease; see `airflow-savepoints job status`")
        if LocalRunner().status(run.target()).state == "ended":
            ctx.lease.release(run.run_id or "")
            raise JobFailedError(
                f"job '{run.job}' (pid {run.pid}) exited before committing a batch; last log lines:\n"
                + log_tail(run.log_file), f"see the full log in {run.log_file}")
        if heartbeat is None and run.run_id:
            ctx.lease.renew(run.run_id, {})  # the driver has not taken its lease over yet
        time.sleep(poll)
    raise JobFailedError(f"job '{run.job}' committed no batch within {timeout:.0f}s",
                         f"see its log in {run.log_file}; it is still running as pid {run.pid}")


def wait_for_new_batch(ctx: JobContext, timeout: float) -> int:
    """Wait until the recorded run commits a batch newer than the one it started from (an
    upgrade's health: a live run that does not progress is not healthy); fail fast as a start does."""
    run = read_run(ctx.folder)
    if run is None:
        raise JobFailedError(f"job '{ctx.job.name}' has no recorded run to wait for", "start it first")
    return _wait_until_live(ctx, run, timeout, new_batch=True)[0]


def wait_for_savepoint_in_flight(ctx: JobContext, timeout: float) -> None:
    """Wait (at most ``timeout`` seconds) until no savepoint of the job is in flight; raise
    :class:`SavepointInFlightError` if one still is (so a stop refuses before it stops anything)."""
    lock = JobLock(ctx.folder, request_id=None)
    deadline = time.monotonic() + timeout
    waited = False
    while (holder := lock.current()) is not None and not lock.is_stale(holder):
        if time.monotonic() >= deadline:
            raise SavepointInFlightError(
                f"a savepoint of job '{ctx.job.name}' is still in flight after {timeout:.0f}s (request "
                f"{holder.request_id!r}, owner {holder.owner}); the job was not stopped",
                "retry the stop once that savepoint completes, or raise inflight_wait",
            )
        if not waited:
            ctx.log(f"waiting for the savepoint in flight (request {holder.request_id!r}) before stopping")
            waited = True
        time.sleep(0.5)


def stop(ctx: JobContext, *, grace: float = 60, request_id: str | None = None, inflight_wait: float = 300,
         on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Stop the job with a ``stop`` savepoint of its last committed batch.

    A savepoint in flight is waited for first (at most ``inflight_wait`` s; after that the stop
    refuses, before it stops anything). Then the run is asked through its control folder to stop
    between two batches (a ``clean`` savepoint); one that does not answer within ``grace`` seconds
    is ended through its runner; its savepoint is ``crash-consistent`` when the kill caught a batch in
    flight (that batch re-runs on restore), ``clean`` when it did not."""
    run = Run.read(ctx)
    state = run.state()
    run.refuse_stop_of_failed(state)
    checkpoint = run.owned_checkpoint()
    if checkpoint is None:
        raise UntrustedRunFileError(f"{run.untrusted()}; job '{ctx.job.name}' was not stopped",
                                    f"cancel it (`airflow-savepoints job cancel {ctx.job.name}`: the checkpoint is left as "
                                    f"it is), or correct {ctx.folder.url_of(RUN_FILE)}")
    wait_for_savepoint_in_flight(ctx, inflight_wait)
    stop_request = request_id or f"stop-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    stopped = run.end(state, grace, stop_request)
    ctx.log(f"job {ctx.job.name} stopped: {stopped}")
    if (ended := Run.read(ctx)).recorded:  # as the end left it
        ended.record_end("stopped", {"stop": stopped})
    deadline = time.monotonic() + inflight_wait
    while True:  # a periodic savepoint that began meanwhile is waited for, not raced
        try:
            info = take_savepoint(ctx.checkpoint(checkpoint), ctx.job.name, savepoint_dir=ctx.root,
                                  savepoint_type=SavepointType.STOP, reason="stop", request_id=request_id,
                                  spark_version=state.spark_version, on_event=on_event,
                                  job_version=state.version or ctx.job.version().model_dump())
            break
        except SavepointInFlightError:
            if time.monotonic() >= deadline:
                raise
            wait_for_savepoint_in_flight(ctx, max(deadline - time.monotonic(), 1))
    consistency = "crash-consistent" if info.manifest.includes_next_offsets else "clean"
    ctx.log(f"stop savepoint {info.pointer} of batch {info.manifest.batch_id} ({consistency})")
    return {**info.summary(), "stop_method": stopped["method"], "consistency": consistency, "run_id": state.run_id,
            "checkpoint": checkpoint, "version": info.manifest.job_version}


def savepoint(ctx: JobContext, *, savepoint_type: str = SavepointType.MANUAL.value, reason: str | None = None,
              request_id: str | None = None, on_event: Callable[[str, dict[str, Any]], None] | None = None,
              **options: Any) -> dict[str, Any]:
    """A savepoint of the job's live query (Flink's ``flink savepoint <jobId>``): the checkpoint its live
    run writes, from the run record, from any host; refused (:class:`JobNotRunningError`) when no run
    lives. ``options`` go to :func:`take_savepoint` (``parallelism``, ``max_attempts``)."""
    run = Run.read(ctx)
    state = run.state()
    if not state.live:
        raise JobNotRunningError(
            f"job '{ctx.job.name}' has no live run (it is {state.state}); nothing was copied",
            f"start it (`airflow-savepoints job start {ctx.job.name}`); a stopped job's last state is its stop savepoint")
    checkpoint = run.owned_checkpoint()
    if checkpoint is None:
        raise UntrustedRunFileError(f"{run.untrusted()}; no savepoint was taken",
                                    f"correct {ctx.folder.url_of(RUN_FILE)}, or stop and start the job again")
    info = take_savepoint(ctx.checkpoint(checkpoint), ctx.job.name, savepoint_dir=ctx.root, savepoint_type=savepoint_type,
                          reason=reason, request_id=request_id, spark_version=state.spark_version, on_event=on_event,
                          job_version=state.version or ctx.job.version().model_dump(), **options)
    ctx.log(f"savepoint {info.pointer} of batch {info.manifest.batch_id} (run {state.run_id}, {checkpoint})")
    return {**info.summary(), "run_id": state.run_id, "checkpoint": checkpoint, "last_batch": state.last_batch}


def cancel(ctx: JobContext, *, policy: str | None = None, grace: float = 60,
           on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """End the job without a savepoint (its control folder first, then its runner), then apply its
    checkpoint retention policy for a cancellation. A run that had already failed on its own stays a
    failure: the policy is applied to it as to a failure, once. A run whose end is recorded keeps it."""
    chosen = parse_policy(policy or ctx.job.checkpoint_retention)  # bad input fails before the cancel
    run = Run.read(ctx)
    state = run.state()
    if state.state == "failed" and state.ended is None:
        failed = handle_failure(ctx, state, chosen.value, run=run)
        if failed is not None:
            return {**failed, "stop_method": "not_running", "detail": f"run {state.run_id} had already failed: its "
                    "end is recorded as a failure, not a cancellation"}
    ended = run.end(state, grace, f"cancel-{datetime.now(UTC):%Y%m%dT%H%M%S%f}")
    ctx.log(f"job {ctx.job.name} ended: {ended}")
    current = Run.read(ctx)  # as the end left it
    outcome = current.apply_retention(chosen, "cancelled", state, on_event)
    if current.recorded and state.ended is None:
        current.record_end("cancelled", outcome)
    return {**outcome, "stop_method": ended["method"], "run_id": state.run_id,
            **({"warnings": state.warnings} if state.warnings else {}),
            **({"detail": ended["detail"]} if ended.get("detail") else {})}


def abandon(ctx: JobContext, reason: str, *, grace: float = 60) -> dict[str, Any]:
    """End the current run (if it still runs) and record it as failed with ``reason``, leaving its
    checkpoint as it is: no savepoint, no retention policy (an upgrade's rollback goes back to the
    state that run started from; a last-state restart resumes on that checkpoint)."""
    run = Run.read(ctx)
    state = run.state()
    ended = run.end(state, grace, f"abandon-{datetime.now(UTC):%Y%m%dT%H%M%S%f}")
    current = Run.read(ctx)  # as the end left it
    if current.recorded and state.ended is None:
        current.record_end("failed", {"reason": reason, "action": "left as it is", "run_id": state.run_id,
                                      "checkpoint": current.checkpoint})
    return {**ended, "checkpoint": current.owned_checkpoint()}


def check(ctx: JobContext) -> JobState:
    """The job's state; a failed (or lost) run gets its checkpoint retention policy for a failure
    applied once, and raises :class:`JobFailedError` with the reason."""
    run = Run.read(ctx)
    state = run.state()
    if state.state == "lost":
        raise JobFailedError(f"job '{ctx.job.name}' run {state.run_id} is lost: {state.detail}",
                             "restart it with restore_from_savepoint: the start takes its lapsed lease over")
    outcome = handle_failure(ctx, state, run=run)
    if outcome is not None:
        kept = outcome.get("retained_savepoint") or {}
        raise JobFailedError(
            f"job '{ctx.job.name}' failed: {outcome['reason']}\ncheckpoint {outcome['checkpoint']}: {outcome['action']} "
            f"({outcome['policy']})" + (f"; restorable as {kept['pointer']} (batch {kept['batch_id']})" if kept else ""),
            "fix the cause, then restart it with restore_from_savepoint (it takes the newest savepoint)",
        )
    if state.state == "failed":
        raise JobFailedError(f"job '{ctx.job.name}' is down since it failed: {(state.error or '')[:500]}",
                             "fix the cause, then restart it with restore_from_savepoint")
    return state


def committed_past(checkpoint: Store, after_batch: int, run: JobRun | None) -> int | None:
    """The newest committed batch if it is past ``after_batch``, else None (keep waiting).

    Raises :class:`JobFailedError` when the run has ended (its query failed, it was stopped, or
    its process exited), so a waiting sensor fails with a reason instead of hanging."""
    batch, _ = checkpoint_progress(checkpoint)
    if batch is not None and batch > after_batch:
        return batch
    if run is None:
        return None
    control = JobControl(Store(run.control, checkpoint.storage_options)) if run.control else None
    ended = run.ended or (control and (control.failure() or control.stopped() or control.fenced()) and "ended")
    if ended or LocalRunner().status(run.target()).state == "ended":
        raise JobFailedError(
            f"job '{run.job}' (pid {run.pid}) is not running; its last committed batch is {batch}, "
            f"waiting for one past {after_batch}. Last log lines:\n{log_tail(run.log_file)}",
            f"see {run.log_file}; restart it with restore_from_savepoint",
        )
    return None


def submit_conf(job: StreamingJob, savepoint_dir: Store | str, *, checkpoint: str | None = None,
                heartbeat_interval: float | None = None, lease_timeout: float | None = None,
                skip_missing_input: bool = False) -> dict[str, str]:
    """The Spark conf to add to a job launched by another operator (SparkSubmitOperator,
    SparkKubernetesOperator, Databricks, EMR) so that savepoints, stop, status, the run lease and
    restore work for it: its job folder (control folders, lease) and checkpoint. The driver makes
    its own run id and takes the lease when it calls ``run_until_stopped``. ``skip_missing_input``:
    the restore accepted lost input, so the helper reads Kafka with ``failOnDataLoss=false``."""
    root = savepoint_dir if isinstance(savepoint_dir, Store) else Store(savepoint_dir)
    return {**run_conf(root.child(job.name).url, checkpoint=checkpoint or job.checkpoint,
                       heartbeat_interval=heartbeat_interval, lease_timeout=lease_timeout),
            **({SKIP_MISSING_INPUT_CONF: "true"} if skip_missing_input else {})}
