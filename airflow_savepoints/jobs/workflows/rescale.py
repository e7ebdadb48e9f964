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
* :class:`RescaleStandby`: an upgrade's rescale, submitted the same way before the job stops (``--standby``):
  its Spark starts while the job still runs, and once the stop savepoint is restored only the rewrite is left
  (Spark's start, 5-8 s of a rescale, is no longer downtime). It is asked through sealed files in its folder
  ``_rescale/<id>/`` with a secret only this process and the application hold; one that is not ready within
  :data:`STANDBY_READY_TIMEOUT` (or gone) is ended, and the rescale runs as its own application after the stop.
* :func:`refuse_unrescalable` checks, before an upgrade stops anything, that the running version's state
  can be rescaled: the live checkpoint's newest batch as a savepoint would record it (state store
  provider, operators and their metadata), with no Spark.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.models import FileEntry, SavepointManifest, StateStoreSettings
from airflow_savepoints.core.names import (
    CHECK_RESULT_FILE,
    RESCALE_FOLDER,
    RESCALE_OWNER_FILE,
    RESCALE_READY_FILE,
    RESCALE_REQUEST_FILE,
)
from airflow_savepoints.core.rescale import RescalePlan, plan_rescale, reported_error
from airflow_savepoints.core.savepoint import plan_listed
from airflow_savepoints.errors import RescaleError, RescaleFailedError, StorageError
from airflow_savepoints.jobs.description import trust
from airflow_savepoints.jobs.driver import rescale_app
from airflow_savepoints.jobs.launch.launcher import log_tail, spawn_submit
from airflow_savepoints.jobs.launch.runners import kill_own_child, own_driver_pod
from airflow_savepoints.storage import Store

if TYPE_CHECKING:
    from airflow_savepoints.jobs.workflows.run import JobContext, JobState

RESCALE_TIMEOUT = 3600.0  # seconds the rescale application may take (it reads and writes all the state)
STANDBY_READY_TIMEOUT = 120.0  # seconds an upgrade waits, its job still running, for a standby's Spark to start
STANDBY_WAIT = 1800.0  # seconds a standby waits for its request (the stop, its savepoint, the copy) before it ends
CHECKPOINT_PLACEHOLDER = "{checkpoint}"


def rescale_on_the_job(ctx: JobContext, submit_command: Callable[[str, dict[str, str]], list[str]], log_dir: Path,
                       restore_options: dict[str, Any], standby: RescaleStandby | None = None) -> dict[str, Any]:
    """``restore_options`` with, when they ask for ``state_partitions``, the rescaler that runs it as the job's
    own Spark application (``standby``'s, when one was started and is ready)."""
    if restore_options.get("state_partitions") is None:
        return restore_options
    return {**restore_options, "rescaler": JobRescaler(ctx, submit_command, Path(log_dir), standby=standby)}


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
    standby: RescaleStandby | None = None

    def __call__(self, destination: Store, plan: RescalePlan, manifest: SavepointManifest, conf: dict[str, str],
                 file_sink: Store | None = None) -> tuple[int, dict[str, int]]:
        job, batch = self.ctx.job, manifest.batch_id + 1
        if self.standby is not None and self.standby.alive():
            self.ctx.log(f"rescaling {destination.url} into {plan.partitions} state partitions by the standby Spark "
                         f"application of job {job.name} (master {job.master})")
            log_file, result = self.standby.rescale(destination, plan.partitions, batch, conf, file_sink, self.timeout)
            return self._outcome(result, log_file, batch)
        scratch, (secret, secret_conf, secret_env) = self.ctx.work_folder(RESCALE_FOLDER), app_secret_for(job, "rescale")
        arguments = [destination.url, str(plan.partitions), str(batch), scratch.url, file_sink.url if file_sink else ""]
        command = application_command(job, self.submit_command, destination.url, {**conf, **secret_conf},
                                      rescale_app.__file__, arguments)
        self.ctx.log(f"rescaling {destination.url} into {plan.partitions} state partitions as a Spark application of "
                     f"job {job.name} (master {job.master})")
        try:
            log_file = self._run(command, secret_env)
            result = read_result(scratch, secret)
        finally:
            scratch.parent().remove_tree(scratch.name)
        return self._outcome(result, log_file, batch)

    def _outcome(self, result: dict[str, Any] | None, log_file: str, batch: int) -> tuple[int, dict[str, int]]:
        """The repartition batch and the partitions after, from the application's result; its error otherwise."""
        job = self.ctx.job
        if result is None:
            raise RescaleFailedError(f"the rescale application of job '{job.name}' ended without a result sealed with "
                                     f"the secret it was given; last log "
                                     f"lines:\n{log_tail(log_file)}",
                                     f"see {log_file}; nothing was restored; retry into a new, empty checkpoint location")
        if result.get("outcome") != "rescaled":
            raise reported_error(result.get("error") or {})
        self.ctx.log(f"rescaled by application {result.get('application_id')} (Spark {result.get('spark_version')})")
        return batch, {str(op): int(count) for op, count in (result.get("partitions") or {}).items()}

    def _run(self, command: list[str], env: dict[str, str]) -> str:
        return run_to_end(command, self.log_dir, f"{self.ctx.job.name}-rescale", self.timeout, lambda log_file: RescaleFailedError(
            f"the rescale application of job '{self.ctx.job.name}' did not end within {self.timeout:.0f}s: ended",
            f"see {log_file}; nothing was restored"), env=env)


@dataclass
class RescaleStandby:
    """A job's rescale application submitted before the job stops (see the module's description): it waits in
    ``folder`` for one request sealed with ``secret``; :meth:`close` ends it (asked, then killed) and removes the
    folder."""

    ctx: JobContext
    folder: Store
    secret: str
    process: subprocess.Popen
    log_file: Path
    started: float = field(default_factory=time.monotonic)
    ready: dict[str, Any] | None = None  # its sealed ready.json: its application id and Spark version
    ready_after_s: float | None = None
    used: bool = False
    beating: threading.Event | None = None  # set to end the beats of a standby on another host (:meth:`start_owner_beats`)

    @classmethod
    def start(cls, ctx: JobContext, submit_command: Callable[[str, dict[str, str]], list[str]], log_dir: Path,
              wait: float = STANDBY_WAIT) -> RescaleStandby:
        """Submit the standby with the job's submit path (its master, deploy mode and conf), not waiting for it."""
        job, folder = ctx.job, ctx.work_folder(RESCALE_FOLDER)
        secret, conf, env = app_secret_for(job, "rescale")
        command = application_command(job, submit_command, job.checkpoint, conf, rescale_app.__file__,
                                      [rescale_app.STANDBY_FLAG, folder.url, str(wait), rescale_app.owner_of_this_process()])
        log_file = new_log_file(Path(log_dir), f"{job.name}-rescale")
        process = spawn_submit(command, log_file, env=env)
        standby = cls(ctx, folder, secret, process, log_file)
        if job.deploy_mode == "cluster":  # its driver runs elsewhere: it cannot watch this process, it hears it
            standby.start_owner_beats()
        return standby

    def start_owner_beats(self) -> None:
        """Write a sealed ``owner.json`` with a new count every ``rescale_app.OWNER_BEAT_INTERVAL`` s from a thread,
        until :meth:`close`: a standby whose driver runs on another host ends (and removes its folder) when they stop,
        so one whose upgrade died holds no cluster resources for its whole wait (``rescale_app.OwnerWatch``)."""
        self.beating, interval = threading.Event(), rescale_app.OWNER_BEAT_INTERVAL

        def beats(stop: threading.Event) -> None:
            count = 0
            while not stop.is_set():
                count += 1
                with contextlib.suppress(StorageError):  # one missed beat is not silence
                    trust.write_sealed(self.folder, RESCALE_OWNER_FILE, {"beat": count}, self.secret)
                stop.wait(interval)

        threading.Thread(target=beats, args=(self.beating,), name=f"standby-beat-{self.folder.name}", daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float = STANDBY_READY_TIMEOUT) -> bool:
        """Whether its Spark started (a sealed ``ready.json``) within ``timeout`` s while it lives."""
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            self.ready = self._sealed(RESCALE_READY_FILE)
            if self.ready is not None:
                self.ready_after_s = round(time.monotonic() - self.started, 2)
                return True
            time.sleep(min(self.folder.poll_interval, 0.2))
        return False

    def summary(self) -> dict[str, Any]:
        """What an upgrade reports of it: its application, how long its Spark took to start, whether it rescaled."""
        return {"application_id": (self.ready or {}).get("application_id"), "ready_after_s": self.ready_after_s,
                "used": self.used}

    def rescale(self, destination: Store, partitions: int, batch: int, conf: dict[str, str], file_sink: Store | None,
                timeout: float) -> tuple[str, dict[str, Any] | None]:
        """Ask for the rewrite and wait for its sealed result (written once Spark has stopped: nothing of it writes
        into the copy any more, while its process exits) or the application's end: its log file and the result
        (None: none). Not done in ``timeout`` s, or interrupted: the application is killed."""
        self.used = True
        self._ask({"checkpoint": destination.url, "partitions": partitions, "batch": batch, "conf": conf,
                   "sink": file_sink.url if file_sink else ""})
        deadline = time.monotonic() + timeout
        try:
            while (result := self._sealed(CHECK_RESULT_FILE)) is None and self.alive():
                if time.monotonic() >= deadline:
                    raise RescaleFailedError(
                        f"the rescale application of job '{self.ctx.job.name}' did not end within {timeout:.0f}s: ended",
                        f"see {self.log_file}; nothing was restored")
                time.sleep(min(self.folder.poll_interval, 0.05))
        except BaseException:
            kill_own_child(self.process)
            raise
        return str(self.log_file), result or self._sealed(CHECK_RESULT_FILE)

    def close(self, grace: float = 15.0) -> None:
        """End it if it still waits (a sealed cancel, then a kill after ``grace`` s) and remove its folder."""
        if self.beating is not None:
            self.beating.set()
        try:
            if self.alive():
                with contextlib.suppress(StorageError):
                    self._ask({"cancel": True})
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(grace)
                kill_own_child(self.process)
        finally:
            with contextlib.suppress(StorageError):
                self.ctx.folder.child(RESCALE_FOLDER).remove_tree(self.folder.name)

    def _ask(self, request: dict[str, Any]) -> None:
        trust.write_sealed(self.folder, RESCALE_REQUEST_FILE, request, self.secret)

    def __post_init__(self) -> None:
        self._forged = trust.once_per_file(lambda url: self.ctx.log(
            f"warning: {url} is not sealed with the standby's secret (forged, or written by another application): ignored"))

    def _sealed(self, name: str) -> dict[str, Any] | None:
        return trust.read_sealed(self.folder, name, self.secret, self._forged)


def new_log_file(log_dir: Path, name: str) -> Path:
    """``<log_dir>/<name>-<UTC time>.log`` (the folder made if missing): a name the launcher's log reader accepts."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return log_dir / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}.log"


def app_secret_for(job: Any, role: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """A fresh secret for one of ``job``'s one-off applications (``role``: rescale, inspect), and how it gets there:
    (the secret, the Spark conf to add, the environment of the submit). The conf: the secret where the driver runs
    on another host (read there, redacted), and a driver pod of the application's own where the job pins its pod's
    name on Kubernetes (``own_driver_pod``)."""
    secret = trust.new_secret()
    conf = {**own_driver_pod(job, role), **({trust.APP_SECRET_CONF: secret} if job.deploy_mode == "cluster" else {})}
    return secret, conf, {trust.APP_SECRET_ENV: secret}


def run_to_end(command: list[str], log_dir: Path, name: str, timeout: float,
               timed_out: Callable[[Path], Exception], env: dict[str, str] | None = None) -> str:
    """Run a job application's submit command (``env`` added to its environment) to its end (its own process group;
    ended, and ``timed_out(log file)`` raised, after ``timeout`` s or when interrupted); its log file."""
    log_file = new_log_file(log_dir, name)
    process = spawn_submit(command, log_file, env=env)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        kill_own_child(process)
        raise timed_out(log_file) from exc
    except BaseException:
        kill_own_child(process)  # interrupted: nothing may go on writing
        raise
    return str(log_file)


def read_result(scratch: Store, secret: str, on_forged: Callable[[str], None] = lambda url: None) -> dict[str, Any] | None:
    """The ``result.json`` a rescale, inspection or check application wrote into ``scratch``, sealed with the
    ``secret`` it was given; None while there is none (one not sealed with it: ``on_forged``, see
    :func:`~airflow_savepoints.jobs.description.trust.read_sealed`)."""
    return trust.read_sealed(scratch, CHECK_RESULT_FILE, secret, on_forged)


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
