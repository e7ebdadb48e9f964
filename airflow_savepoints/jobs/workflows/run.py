"""One run of a streaming job: its files read once, and the only code that acts on it.

A :class:`Run` is what the job folder says of the job's current run, read in one pass (through
:mod:`airflow_savepoints.jobs.description.files`, which validates every file): its record (``_run.json``),
its run lease, its control folder (derived from the job folder and the run id, never read from a
file) and heartbeat, and its runner's handle (:class:`RunTarget`). It answers the run's state and
is the only code that

* signals a process (:meth:`Run.end`, :func:`kill`: the runner back ends of
  :mod:`airflow_savepoints.jobs.launch.runners` stay behind it),
* deletes or keeps a checkpoint (:meth:`Run.apply_retention`: only one the job owns), and
* writes a control file (a stop request, in :meth:`Run.end`).

The lifecycle verbs (:mod:`airflow_savepoints.jobs.workflows.lifecycle`) are short scripts over it; this
module imports neither the lifecycle nor Airflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.core.lease import CLOCK_SLACK, store_now
from airflow_savepoints.core.names import RUN_FILE
from airflow_savepoints.core.termination import apply_checkpoint_retention, parse_policy
from airflow_savepoints.errors import InvalidInputError, JobFailedError, JobNotStoppedError, StorageError
from airflow_savepoints.jobs.description.channel import CONTROL_FOLDER, HEARTBEAT_FILE, JobControl, new_run_id, run_id_time
from airflow_savepoints.jobs.description.files import control_folder, safe_run_id
from airflow_savepoints.jobs.description.lease import DEFAULT_LEASE_TIMEOUT, RunLease, RunLeaseHolder, age_on_store_clock
from airflow_savepoints.jobs.description.model import StreamingJob
from airflow_savepoints.jobs.description.record import JobRun, RunTarget, read_run, record_end, write_run
from airflow_savepoints.jobs.launch.launcher import log_tail
from airflow_savepoints.jobs.launch.runners import (
    DRIVER_POD_CONF,
    LocalRunner,
    Runner,
    YarnRunner,
    is_driver_pod_of,
    runner_for,
)
from airflow_savepoints.storage import Store

LIVE_STATES = ("starting", "running", "stopping", "unknown")
State = Literal["not_started", "starting", "running", "stopping", "stopped", "failed", "lost", "unknown"]


class JobState(BaseModel):
    """A job's state as seen from storage (and its runner)."""

    job: str
    state: State
    run_id: str | None = None
    host: str | None = None
    application_id: str | None = None
    last_batch: int | None = None  # the last committed batch (a live run's heartbeat's, else the checkpoint's)
    heartbeat_age_s: float | None = None  # on the store's clock
    error: str | None = None
    detail: str | None = None  # why this state (the runner's words, the fencing, ...)
    pid: int | None = None
    checkpoint: str | None = None
    control: str | None = None
    runner: str | None = None
    helper: bool = False  # the run writes heartbeats (it calls run_until_stopped)
    ended: str | None = None  # stopped / cancelled / failed once a stop, cancel or failure was handled
    log_file: str | None = None
    spark_version: str | None = None  # the driver's (its heartbeat or lease), for the manifests of its savepoints
    version: dict[str, Any] | None = None  # the job version the run was started with (its run record)
    watchdog: dict[str, Any] | None = None  # the watchdog's last decision and restarts (status(..., watchdog=True))
    warnings: list[str] = []  # damaged or untrusted run files, and what was done instead

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


MAX_WORK_TIMEOUT = 4 * 3600.0  # seconds an upgrade check's batch or a job's inspection may be given at most
WORK_FOLDER_LIFETIME = 24 * 3600.0  # seconds after which a check's, rescale's or inspection's folder was left over


def refuse_long_work(timeout: float, what: str) -> None:
    """Refuse (:class:`InvalidInputError`) a check's or inspection's ``timeout`` that is not a number of seconds above 0
    and at most :data:`MAX_WORK_TIMEOUT`: its folder is taken for left over (and removed) after a day."""
    if not (0 < timeout <= MAX_WORK_TIMEOUT):
        raise InvalidInputError(f"{what} timeout {timeout} s is not above 0 and at most {MAX_WORK_TIMEOUT:.0f} s",
                                f"give {what} at most {MAX_WORK_TIMEOUT / 3600:.0f} hours")


@dataclass
class JobContext:
    """A job and where its things are: the savepoint directory (with its storage options) and the
    storage options of its checkpoints."""

    job: StreamingJob
    root: Store
    checkpoint_options: dict[str, Any] | None = None
    heartbeat_interval: float | None = None  # passed to runs this context starts (default 5 s)
    lease_timeout: float | None = None  # (default 30 s)
    log: Callable[[str], None] = field(default=lambda message: None)
    spark_master: str | None = None  # the Spark connection's master, for a job that names one (its ``spark_conn_id``)

    def __post_init__(self) -> None:
        self.heartbeat_interval = self.heartbeat_interval or self.job.heartbeat_interval
        self.lease_timeout = self.lease_timeout or self.job.lease_timeout

    @property
    def master(self) -> str:
        """The job's master as configured (the Spark connection's, else jobs.yaml's): its runner's address."""
        return self.spark_master or self.job.master

    @property
    def folder(self) -> Store:
        return self.root.child(self.job.name)

    @property
    def lease(self) -> RunLease:
        return RunLease(self.folder)

    def checkpoint(self, url: str) -> Store:
        return Store(url, self.checkpoint_options)

    def work_folder(self, kind: str) -> Store:
        """A new ``<job>/<kind>/<id>/`` (``kind``: ``_check``, ``_rescale``, ``_inspect``) for one check, rescale or
        inspection, which removes it when done. Those of the same kind made more than :data:`WORK_FOLDER_LIFETIME` ago
        (the id says when; a live one is hours younger: its timeouts are bounded) were left by a process killed meanwhile:
        removed first, each logged. Nothing else in ``kind`` is touched."""
        parent, now = self.folder.child(kind), time.time()
        for name in parent.listdir(folders_only=True):
            made = run_id_time(name)
            if made is None or now - made.timestamp() <= WORK_FOLDER_LIFETIME:
                continue
            try:
                parent.remove_tree(name)
                self.log(f"removed {parent.url}/{name}, made at {made.isoformat()} and left by a process that ended "
                         "without removing it")
            except StorageError as exc:
                self.log(f"warning: {parent.url}/{name} is left over (made at {made.isoformat()}) and was not removed: {exc}")
        return parent.child(new_run_id())


class _Seen(NamedTuple):
    """What :meth:`Run.state` reads of a run once: its facts, last heartbeat and its age, driver, runner."""

    base: dict[str, Any]
    heartbeat: dict[str, Any] | None
    age: float | None
    target: RunTarget
    runner: Runner


@dataclass
class Run:
    """The job's current run as its files describe it: its record (if a start launched it), lease,
    control folder, and the warnings reading them gave. Read it with :meth:`read`."""

    ctx: JobContext
    record: JobRun | None
    holder: RunLeaseHolder | None
    run_id: str | None
    control: JobControl | None
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, ctx: JobContext) -> Run:
        """The current run: the lease holder's, else the recorded one, else the newest that wrote heartbeats."""
        warnings: list[str] = []
        record = read_run(ctx.folder, warnings)
        holder = ctx.lease.holder(warnings)
        run_id = holder.run_id if holder else (record.run_id if record else None)
        if record is not None and holder is not None and record.run_id != holder.run_id:
            record = None  # the recorded run is an older one: the lease holder (started by another tool) is current
        if holder is None:  # no run holds the lease: the newest run that wrote heartbeats may be newer than the record
            latest = _latest_beating_run(ctx)
            if latest is not None and JobControl(ctx.folder.child(CONTROL_FOLDER).child(latest[0]),
                                                 warnings).heartbeat() is None:
                latest = None  # a heartbeat not sealed with its run's secret names no run
            if latest is not None and (record is None or (latest[0] != record.run_id
                                                           and latest[1] > record.started_at.timestamp())):
                record, run_id = None, latest[0]
        folder = control_folder(ctx.folder, run_id)
        if run_id and folder is None:
            warnings.append(f"run id {run_id!r} in {ctx.lease.url if holder else ctx.folder.url_of(RUN_FILE)} is no "
                            "folder name: the run has no control folder")
        named = {(holder.control if holder and holder.run_id == run_id else None), (record.control if record else None)}
        for url in named - {None, folder.url if folder else None}:
            warnings.append(f"the run files name control folder {url}; ignored: a run's control folder is "
                            f"{ctx.folder.url_of(CONTROL_FOLDER)}/<run id>")
        control = JobControl(folder, warnings) if folder is not None else None
        return cls(ctx, record, holder, run_id, control, warnings)

    @property
    def recorded(self) -> bool:
        return self.record is not None or self.holder is not None

    def target(self) -> RunTarget:
        """Where the run's driver is: the record's facts, bettered by the driver's own (its lease, its
        announcement); the runner's addresses are the configuration's (:attr:`JobContext.master`), never a file's."""
        ctx = self.ctx
        target = self.record.target() if self.record else RunTarget(job=ctx.job.name)
        target.job, target.run_id, target.master, target.master_ui = ctx.job.name, self.run_id, ctx.master, ctx.job.master_ui
        target.app_name = ctx.job.app_name or ctx.job.name  # a standalone kill is only of the application so named
        holder = self.holder if self.holder and self.holder.run_id == self.run_id else None
        if holder is not None:  # the driver's own facts are the better ones
            target.host = holder.host or target.host
            target.application_id = holder.application_id or target.application_id
            target.driver_pod = holder.driver_pod
            if self.record is None or self.record.pid is None:
                target.pid, target.pid_started = holder.pid, holder.pid_started
        if self.control is not None and not target.application_id:
            target.application_id = (self.control.announcement() or {}).get("application_id")
        target.driver_pod = self._driver_pod(target)
        return target

    def _driver_pod(self, target: RunTarget) -> str | None:
        """The Kubernetes driver pod a kill may delete: the job's configured ``spark.kubernetes.driver.pod.name``,
        else the one the run files name if spark-submit would name it so for this job (else None, with a warning)."""
        if not target.driver_pod or not (target.master or "").startswith("k8s"):
            return target.driver_pod
        configured = self.ctx.job.spark_conf.get(DRIVER_POD_CONF)
        if configured or is_driver_pod_of(target.driver_pod, target.app_name or target.job):
            return configured or target.driver_pod
        self.warnings.append(f"the run files name driver pod {target.driver_pod!r}, which is not job "
                             f"'{target.job}''s (spark-submit names its driver pods "
                             f"<{target.app_name or target.job}>-<id>-driver): ignored, it is never deleted")
        return None

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint the run's files name (see :meth:`owned_checkpoint` before touching it)."""
        if self.record is not None:
            return self.record.checkpoint
        return self.holder.checkpoint if self.holder else None

    def owned_checkpoint(self) -> str | None:
        """The run's checkpoint if the job owns it (:meth:`StreamingJob.owns_checkpoint`), the job's
        configured one if its files name none; None, with a warning, when they name another location."""
        recorded = self.checkpoint
        if not recorded:
            return self.ctx.job.checkpoint
        if self.ctx.job.owns_checkpoint(recorded):
            return recorded
        if (warning := self.untrusted()) not in self.warnings:
            self.warnings.append(warning)
        return None

    def untrusted(self) -> str:
        job = self.ctx.job
        return (f"the run files of job '{job.name}' name checkpoint {self.checkpoint}, which is neither its "
                f"configured checkpoint {job.checkpoint} nor one named after it: it is not touched")

    def state(self) -> JobState:
        """The run's state from its lease, heartbeat (aged on the store's clock) and runner. The batch
        of a run that no longer runs is its checkpoint's last commit (its last heartbeat may be older
        than that, or name the batch in flight when it failed)."""
        state = self._state()
        if state.helper and not state.live and state.checkpoint:
            committed, _ = checkpoint_progress(self.ctx.checkpoint(state.checkpoint))
            if committed is not None:
                state.last_batch = committed
        return state

    def refuse_stop_of_failed(self, state: JobState) -> None:
        """A stop has nothing to stop, and no savepoint to take, when the run (``state``) failed: raise
        :class:`JobFailedError` naming it and its error, changing nothing (it stays ``failed``)."""
        if state.state != "failed":
            return
        raise JobFailedError(
            f"job '{self.ctx.job.name}' is not running: run {state.run_id} failed"
            + (f" ({state.detail})" if state.ended else "") + f": {(state.error or 'no error recorded')[:1000]}; "
            f"its checkpoint {state.checkpoint} last committed batch {state.last_batch}. Nothing was stopped, "
            "no savepoint taken",
            f"fix the cause, then `airflow-savepoints job start {self.ctx.job.name}` (it applies the checkpoint "
            f"retention policy for a failure first), or `airflow-savepoints job cancel {self.ctx.job.name}`")

    def _state(self) -> JobState:
        """Judged from the surest evidence down: an end the run recorded or wrote, its heartbeat, its runner."""
        if self.run_id is None and self.record is None:
            return JobState(job=self.ctx.job.name, state="not_started", detail=f"no run recorded in {self.ctx.folder.url}",
                            warnings=self.warnings)
        seen = self._seen()
        ended = self._ended(seen)
        if ended is not None:
            return ended
        return self._by_heartbeat(seen) if seen.heartbeat is not None else self._by_runner(seen)

    def _seen(self) -> _Seen:
        """What the run's files, heartbeat and checkpoint say of it, once."""
        ctx, record, holder, control = self.ctx, self.record, self.holder, self.control
        target = self.target()
        checkpoint = self.owned_checkpoint()
        base: dict[str, Any] = {"job": ctx.job.name, "run_id": self.run_id, "host": target.host,
                                "application_id": target.application_id, "pid": target.pid,
                                "checkpoint": checkpoint, "control": control.folder.url if control else None,
                                "version": ctx.job.redacted(record.version) if record else None,
                                **{key: getattr(record, key) if record else None for key in ("ended", "log_file")}}
        heartbeat = control.heartbeat(self.warnings) if control else None
        age = age_on_store_clock(control.folder, HEARTBEAT_FILE) if heartbeat is not None else None
        base.update(helper=heartbeat is not None, heartbeat_age_s=round(age, 3) if age is not None else None,
                    last_batch=(heartbeat or {}).get("last_committed_batch"), warnings=self.warnings,
                    spark_version=(heartbeat or {}).get("spark_version") or (holder.spark_version if holder else None))
        if base["last_batch"] is None and checkpoint:
            base["last_batch"], _ = checkpoint_progress(ctx.checkpoint(checkpoint))
        runner = runner_for(target.master)
        base["runner"] = runner.name
        return _Seen(base, heartbeat, age, target, runner)

    def _ended(self, seen: _Seen) -> JobState | None:
        """The run's end as its record or its driver's files (failure, stop answer, fencing) say it; None: not ended."""
        record, control, base = self.record, self.control, seen.base
        if record is not None and record.ended is not None:
            failed = record.ended == "failed"
            return JobState(**base, state="failed" if failed else "stopped",
                            error=(record.termination or {}).get("reason") if failed else None,
                            detail=f"{record.ended} at {record.ended_at}")
        failure = control.failure() if control else None
        if failure is not None:
            return JobState(**base, state="failed", error=failure.get("error"))
        if control is not None and control.stopped() is not None:
            return JobState(**base, state="stopped", detail="it acknowledged a stop request")
        fenced = control.fenced() if control else None
        if fenced is not None:
            return JobState(**base, state="stopped", detail=f"fenced off: {fenced.get('reason')}")
        return None

    def _by_heartbeat(self, seen: _Seen) -> JobState:
        """A run of the in-job helper: its last heartbeat's state and age (on the store's clock), its local process."""
        base, heartbeat, age, control = seen.base, seen.heartbeat, seen.age, self.control
        beat_state = heartbeat.get("state")
        if beat_state in ("stopped", "finished", "fenced"):
            return JobState(**base, state="stopped", detail=f"its last heartbeat says {beat_state}")
        if beat_state == "failed":
            return JobState(**base, state="failed", error=heartbeat.get("error"))
        # a cluster manager that tells of its applications (YARN's ResourceManager) adds its words: state, diagnostics;
        # an application it says ended (a killed ApplicationMaster or driver container, a lost node) failed, with its words
        cluster = seen.runner.status(seen.target) if isinstance(seen.runner, YarnRunner) else None
        stopping = beat_state in ("stopping", "fencing") or control.stop_requested() is not None
        if cluster is not None and cluster.state == "ended" and not stopping:
            return JobState(**base, state="failed", error=f"{cluster.detail} without a stop request",
                            detail=log_tail(self.record.log_file if self.record else None, 10) or None)
        local = LocalRunner().status(seen.target) if seen.target.pid else None
        timeout = heartbeat.get("timeout_s") or DEFAULT_LEASE_TIMEOUT
        if local is not None and local.state == "ended":
            return JobState(**base, state="failed", error=f"{local.detail} without a stop request",
                            detail=log_tail(self.record.log_file if self.record else None, 10) or None)
        if age is not None and age < 0:
            self.warnings.append(f"{control.folder.url_of(HEARTBEAT_FILE)} is dated {-age:.0f}s ahead of the "
                                 "store's clock: treated as lapsed")
            return JobState(**{**base, "heartbeat_age_s": None}, state="lost",
                            detail=f"its heartbeat is dated {-age:.0f}s ahead of the store's clock")
        if age is not None and age > timeout:
            return JobState(**base, state="lost", detail=f"no heartbeat for {age:.0f}s (timeout {timeout:.0f}s)"
                            + (f"; {cluster.detail}" if cluster is not None else ""))
        return JobState(**base, state="stopping" if stopping else "running",
                        detail=cluster.detail if cluster is not None else None)

    def _by_runner(self, seen: _Seen) -> JobState:
        """A run without heartbeats: what its runner (else its local process) and its run lease say."""
        base, target, runner, holder = seen.base, seen.target, seen.runner, self.holder
        view = runner.status(target)
        if view.state == "unknown" and not isinstance(runner, LocalRunner) and target.pid:
            view = LocalRunner().status(target)  # a client-mode driver on this host
        held = holder is not None and holder.run_id == self.run_id
        if held and not holder.lapsed and view.state != "ended":
            return JobState(**base, state="starting", detail=view.detail)
        if view.state == "running":
            return JobState(**base, state="running", detail=f"{view.detail} (no heartbeats: a job without the helper)")
        if view.state == "ended":
            return JobState(**base, state="failed", error=f"{view.detail} without a stop request",
                            detail=log_tail(self.record.log_file if self.record else None, 10) or None)
        if not _checkable(target):  # no heartbeat, no live lease, nothing a runner could look up: nothing runs that we know of
            lease = (f"its run lease lapsed {holder.age_s or 0:.0f}s ago" if held and holder.age_s is not None
                     else "its run lease lapsed" if held else "no run lease")
            return JobState(**base, state="lost", detail=f"{lease}, it wrote no heartbeat, and no runner can tell of it"
                            + (f" ({view.detail})" if target.pid else ""))
        return JobState(**base, state="unknown", detail=view.detail)

    def end(self, state: JobState, grace: float, request_id: str) -> dict[str, Any]:
        """End the run (``state``: its :meth:`state`): through its control folder first (a stop
        request, answered within ``grace`` seconds), then its runner. Returns how."""
        if not state.live and state.state != "lost":
            return {"method": "not_running", "pid": state.pid, "state": state.state}
        if state.helper and state.state != "lost" and self.control is not None:
            self.control.request_stop(request_id)
            acknowledged = self.control.wait_until_stopped(request_id, timeout=grace)
            if acknowledged is not None:
                self._wait_for_driver_exit(grace)
                return {"method": "cooperative", "pid": state.pid, "run_id": state.run_id, "acknowledgement": acknowledged}
            self.ctx.log(f"run {state.run_id} did not acknowledge the stop within {grace:.0f}s: forcing it")
        outcome = kill(self.target(), grace)
        if outcome["killed"] or outcome["method"] == "not_running":
            return {**outcome, "pid": state.pid, "run_id": state.run_id}
        if state.state == "lost":
            return {"method": "lease_lapsed", "pid": state.pid, "run_id": state.run_id, "detail": outcome["detail"]}
        if state.helper:  # it beats but does not answer, and cannot be signalled from here: wait for its lease to lapse
            if self._wait_for_lapse(grace + float(self.holder.timeout_s if self.holder else 30)):
                return {"method": "lease_lapsed", "pid": state.pid, "run_id": state.run_id, "detail": outcome["detail"]}
        raise JobNotStoppedError(
            f"run {state.run_id} of job '{self.ctx.job.name}' could not be stopped from here: {outcome['detail']}",
            f"stop it from {state.host or 'its host'} or through its cluster manager; nothing else was changed",
        )

    def _wait_for_driver_exit(self, grace: float) -> None:
        """After a stop is acknowledged: wait until the driver has gone (where that can be seen)."""
        target = self.target()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and LocalRunner().status(target).state == "running":
            time.sleep(0.05)  # a local process table read

    def _wait_for_lapse(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if Run.read(self.ctx).state().state not in ("running", "stopping", "starting"):
                return True
            time.sleep(1)
        return False

    def apply_retention(self, policy: Any, termination: Literal["cancelled", "failed"], state: JobState,
                        on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Apply the checkpoint retention ``policy`` to the run's checkpoint, if the job owns it; else
        leave it as it is and say why (``warning``)."""
        checkpoint = self.owned_checkpoint()
        if checkpoint is None:
            warning = self.untrusted()
            self.ctx.log(f"warning: {warning}")
            return {"policy": parse_policy(policy).value, "termination": termination, "checkpoint": self.checkpoint,
                    "action": "left as it is", "warning": warning}
        started_at = self.record.start_batch if self.record is not None and termination == "failed" else None
        return apply_checkpoint_retention(self.ctx.checkpoint(checkpoint), self.ctx.job.name, policy, termination,
                                          savepoint_dir=self.ctx.root, spark_version=state.spark_version,
                                          job_version=state.version, on_event=on_event, started_at=started_at)

    def record_end(self, ended: Literal["stopped", "cancelled", "failed"], termination: dict[str, Any] | None = None) -> None:
        """Mark the run ended in its record (recording a run another tool started first) and free its lease."""
        record = self.record
        if record is None:  # a run started by another tool: recorded now, so its end is known
            record = JobRun(job=self.ctx.job.name, checkpoint=self.checkpoint or self.ctx.job.checkpoint,
                            started_at=datetime.now(UTC), run_id=self.run_id,
                            control=self.control.folder.url if self.control else None,
                            host=self.holder.host if self.holder else None,
                            master=self.holder.master if self.holder else None)
            write_run(self.ctx.folder, record)
        record_end(self.ctx.folder, record, ended, termination)
        if self.run_id:
            self.ctx.lease.release(self.run_id)


def kill(target: RunTarget, grace: float) -> dict[str, Any]:
    """Force a run to end through its runner (``{"method", "killed", "detail"}``); a client-mode
    driver on this host, which outlives its application, is signalled too."""
    runner = runner_for(target.master)
    outcome = runner.kill(target, grace)
    if not isinstance(runner, LocalRunner) and target.pid:
        LocalRunner().kill(target, grace)
    return outcome


def stop_process(run: JobRun | None, grace: float = 60) -> bool:
    """SIGTERM the run's process group, SIGKILL after ``grace`` seconds (the local runner, on the
    run's own host only, and only when its pid and start time match). True if it was running here."""
    if run is None or not run.pid:
        return False
    return bool(LocalRunner().kill(run.target(), grace)["killed"])


def _checkable(target: RunTarget) -> bool:
    """Whether a runner could find the run: a driver pid with its start time, or an application id."""
    return bool((target.pid and target.pid_started is not None) or target.application_id or target.driver_pod)


def _latest_beating_run(ctx: JobContext) -> tuple[str, float] | None:
    """The run whose heartbeat was written last (its id and the heartbeat's mtime), if any."""
    folder = ctx.folder.child(CONTROL_FOLDER)
    try:
        listing = folder.list_files()
    except FileNotFoundError:
        return None
    beats = [(path.split("/")[0], stat.modified or 0.0) for path, stat in listing.items()
             if path.endswith("/" + HEARTBEAT_FILE) and path.count("/") == 1 and safe_run_id(path.split("/")[0])]
    if beats and max(beat[1] for beat in beats) > store_now(ctx.folder) + CLOCK_SLACK:  # one dated ahead never wins
        now = store_now(ctx.folder, fresh=True) + CLOCK_SLACK
        beats = [beat for beat in beats if beat[1] <= now]
    return max(beats, key=lambda beat: beat[1]) if beats else None


class JobStatus(BaseModel):
    """A short status of the job's current run (see :func:`job_status`)."""

    job: str
    state: str
    running: bool
    pid: int | None
    application_id: str | None = None  # what the driver announced, or its log said (local-…, app-…)
    last_committed_batch: int | None
    last_progress_at: datetime | None


def job_status(job: str, job_folder: Store) -> JobStatus:
    """Whether the job's current run is alive (by its heartbeats, else its runner), its application
    id, and its checkpoint's progress."""
    run = read_run(job_folder)
    placeholder = StreamingJob.model_construct(name=job, application="", checkpoint=run.checkpoint if run else "",
                                               master="local[2]", master_ui=None)  # no jobs.yaml: no runner address
    state = Run.read(JobContext(placeholder, job_folder.parent())).state()
    batch, at = checkpoint_progress(Store(state.checkpoint)) if state.checkpoint else (None, None)
    return JobStatus(job=job, state=state.state, running=state.state in ("starting", "running", "stopping"),
                     pid=state.pid, application_id=state.application_id, last_committed_batch=batch,
                     last_progress_at=at)
