"""The in-job helper: what a streaming job's driver runs to take part in its lifecycle.

Each run has a control folder (``<savepoint dir>/<job>/_control/<run id>/``) on shared storage,
passed to the job as Spark conf (:func:`airflow_savepoints.jobs.description.channel.run_conf`). A job that cooperates calls
:func:`run_until_stopped` instead of ``query.awaitTermination()``; it then

1. claims the job's run lease (``<savepoint dir>/<job>/_lease.json``) for its run id, or stops at
   once (:class:`JobFencedError`) when another live run holds it, and announces itself (``job.json``),
2. every ``spark.savepoints.heartbeatInterval`` seconds writes ``heartbeat.json`` (run id,
   application id, last committed batch, host, time) and renews the lease; when another run owns
   the lease (or it could not renew it for longer than the lease timeout) it stops its query
   between two batches and fails with :class:`JobFencedError`, so two drivers never both write
   the sink,
3. watches for ``stop-request.json`` (sealed with the run's secret, else ignored); when one appears,
   lets the batch in flight commit and starts no other (so the stop savepoint is of the last committed
   batch, exactly), acknowledges with ``stopped.json`` and releases the lease,
4. records each new batch's progress (duration, trigger interval, input and processed rates, cores,
   state rows, memory and partitions, Kafka backlog; the file sources' files not yet read, counted in a
   thread of its own, :mod:`airflow_savepoints.jobs.driver.file_backlog`) and writes the job's bounded metric series
   (``<savepoint dir>/<job>/_metrics.json``) with the heartbeats, for the autoscaler
   (:class:`MetricsRecorder`),
5. if the query fails, writes ``failed.json`` (the error) and releases the lease before failing as
   ``awaitTermination()`` does,
6. when the start accepted lost input (``spark.savepoints.skipMissingInput=true``, from
   ``job start --skip-missing-input``), makes every Kafka source of the session read with
   ``failOnDataLoss=false`` (:func:`install_skip_missing_input`; on import when pyspark is loaded,
   and in :func:`claim_run`).

Each heartbeat says ``last_committed_batch`` (the newest batch the query committed, never the one in
flight or the next one an idle trigger names) and ``triggered`` once the query completed a trigger,
with data or none (an idle source is healthy): a start waits for that, or a commit.

A job that does not cooperate never announces itself: its runner (local process, standalone
master, cluster manager) says what it can, and it is stopped through that runner
(crash-consistent). This module and the storage layer are all a driver imports: no Airflow.
The channel uses the job's own credentials for the store; nothing secret is passed in the conf.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from tenacity import Retrying, stop_after_attempt, wait_fixed

from airflow_savepoints.errors import JobFencedError
from airflow_savepoints.jobs.description.channel import (
    CHECK_CONF,
    CHECK_ENV,
    CHECKPOINT_CONF,
    CONTROL_CONF,
    CONTROL_FOLDER,
    DEFAULT_HEARTBEAT_INTERVAL,
    HEARTBEAT_CONF,
    JOB_FOLDER_CONF,
    LEASE_CONF,
    LEASE_TIMEOUT_CONF,
    RUN_ID_CONF,
    RUN_SECRET_CONF,
    SKIP_MISSING_INPUT_CONF,
    JobControl,
    new_run_id,
    now_iso,
)
from airflow_savepoints.jobs.description.files import process_started
from airflow_savepoints.jobs.description.lease import DEFAULT_LEASE_TIMEOUT, LEASE_FILE, RELEASED, RunLease, RunLeaseHolder
from airflow_savepoints.jobs.description.metrics import DEFAULT_KEEP, MetricPoint, point_of, read_series, write_series
from airflow_savepoints.jobs.driver.file_backlog import FileBacklog
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)


RUNNING_A_BATCH = ("Processing new data", "No new data but cleaning up state")  # Spark's status messages


class _GracefulEnd:
    """Ends a JVM query as Spark ends an ``availableNow`` one: its state is set to TERMINATED with no
    interrupt, so no further trigger starts and a batch already executing runs to its commit.

    Spark 4 interrupts a batch itself when it finds the query terminated at the end of the batch's
    planning (after its offsets were logged), so the moment is chosen: see :func:`_safe_moment`.
    Raises where the internals differ (Spark Connect, another Spark): the caller falls back.
    """

    def __init__(self, query) -> None:
        execution = query._jsq.streamingQuery()
        self.state = execution.state()
        active = self.state.get()
        if active.toString() != "ACTIVE":
            raise RuntimeError(f"query is {active.toString()}")
        package = active.getClass().getName().rsplit(".", 1)[0]
        self.terminated = active.getClass().forName(f"{package}.TERMINATED$").getField("MODULE$").get(None)
        self.tracker = execution.sparkSession().sparkContext().statusTracker()
        self.job_group = str(query.runId)  # Spark runs a query's jobs in a job group named by its run id

    def jobs_running(self) -> bool:
        """A Spark job of the query runs: its batch executes (planning launches none for most sources)."""
        active = set(self.tracker.getActiveJobIds())
        return bool(active) and any(job in active for job in self.tracker.getJobIdsForGroup(self.job_group))

    def end(self) -> bool:
        active = self.state.get()
        return active.toString() == "ACTIVE" and bool(self.state.compareAndSet(active, self.terminated))


def _trigger_interval_ms(query) -> int | None:
    """The interval of a JVM query's processing-time trigger; None for another trigger or no access."""
    try:
        trigger = query._jsq.streamingQuery().trigger()
        return int(trigger.intervalMs()) if trigger.getClass().getSimpleName() == "ProcessingTimeTrigger" else None
    except Exception:  # noqa: BLE001 - Spark Connect or other internals
        return None


def _graceful_end_of(query, attempts: int = 3) -> _GracefulEnd | None:
    """A :class:`_GracefulEnd` of ``query``, or None (logged) where its internals cannot be reached."""
    try:
        return Retrying(stop=stop_after_attempt(attempts), wait=wait_fixed(0.05), reraise=True)(_GracefulEnd, query)
    except Exception as exc:  # noqa: BLE001 - Spark Connect or other internals: stop while it waits
        log.warning("cannot end query %s gracefully (%s: %s): stopping it while it waits", query.name,
                    type(exc).__name__, exc)
        return None


def _progress_mark(progress: dict | None) -> tuple | None:
    """Which batch a query's last progress is of (``query.lastProgress``: read once, a JVM call and JSON)."""
    return (progress["batchId"], progress["timestamp"]) if progress else None


def _planning_allowance(query) -> float:
    """Seconds after a batch is first seen running by which its planning is surely over: twice the
    longest that the last 5 batches took to get their data and plan, plus 100 ms (0.5 s with no history)."""
    durations = [p.get("durationMs") or {} for p in query.recentProgress]
    planned = [d.get("getBatch", 0) + d["queryPlanning"] for d in durations if "queryPlanning" in d][-5:]
    return 2 * max(planned) / 1000 + 0.1 if planned else 0.5


def _executes_a_batch(status: dict) -> bool:
    """A query's status (``query.status``) says a batch executes: past reading offsets, not idle."""
    return bool(status.get("isTriggerActive")) and status.get("message") in RUNNING_A_BATCH


def _note_batch_running(query, seen_running: dict, last_progress: dict | None) -> None:
    """Keep in ``seen_running`` when the batch in flight was first seen executing (at most one batch: the
    newest). The run's loop looks at every poll, so a stop asked in the middle of a batch counts that batch's
    planning allowance from its first sight, not from the request. ``last_progress``: the query's, read just
    before (the status is read after it, as :func:`_safe_moment` does; not at all once the batch is noted)."""
    mark = _progress_mark(last_progress)
    if mark in seen_running:
        return
    if _executes_a_batch(query.status):
        seen_running.clear()
        seen_running[mark] = time.monotonic()


def _safe_moment(query, interval_ms: int | None, jobs_running: Callable[[], bool] | None, seen_running: dict,
                 allowances: dict) -> bool:
    """True at a moment when ending ``query`` cuts no batch short.

    Waiting: idle twice, 20 ms apart, with no batch finished in between (not merely passing between
    two batches that run back to back), and, for a processing-time trigger, which fires at the next
    multiple of its interval since the epoch, that trigger far enough away and the last batch not
    one that overran it (the next then starts at once, however long its thread takes to). Executing (only where
    ``jobs_running`` can tell): a batch seen running for longer than its planning takes, with a Spark job of
    the query running, so it commits however it ends. ``seen_running`` holds, for each batch seen running,
    when it was first seen so; ``allowances`` its planning allowance, reckoned when the stop first met it (the
    recent batches' planning then: a long first batch leaves the window as the query runs on).
    """
    mark = _progress_mark(query.lastProgress)
    status = query.status
    if status.get("isTriggerActive"):
        if jobs_running is None or not _executes_a_batch(status):
            time.sleep(0.002)  # reading or logging offsets, or a batch that only a stop could cut
            return False
        first_seen = seen_running.setdefault(mark, time.monotonic())
        if mark not in allowances:
            allowances[mark] = _planning_allowance(query)
        if time.monotonic() < first_seen + allowances[mark] or not jobs_running():
            time.sleep(0.005)
            return False
        return _progress_mark(query.lastProgress) == mark and bool(query.status.get("isTriggerActive"))
    time.sleep(0.02)
    progress = query.lastProgress
    if query.status.get("isTriggerActive") or _progress_mark(progress) != mark:
        return False
    if interval_ms:
        margin_ms = min(0.4 * interval_ms, 250)
        if _may_be_between_back_to_back_batches(progress, interval_ms, margin_ms):
            time.sleep(0.02)
            return False
        left_ms = interval_ms - (time.time() * 1000) % interval_ms
        if left_ms < margin_ms:
            time.sleep((left_ms + 10) / 1000)
            return False
    return True


def _may_be_between_back_to_back_batches(progress: dict | None, interval_ms: int, margin_ms: float) -> bool:
    """True when the last batch (``progress``: the query's last progress) ended at (or within
    ``margin_ms`` of) the time its next trigger was due, less than an interval (at least 1 s) ago:
    Spark then starts that trigger at once, so the query looking idle means only that its thread has
    not got there yet (a loaded machine can hold it for tens of ms). A processing-time trigger is due
    at the first multiple of its interval after the previous trigger started."""
    if not progress:
        return False
    started_ms = datetime.fromisoformat(progress["timestamp"]).timestamp() * 1000
    ended_ms = started_ms + (progress.get("durationMs") or {}).get("triggerExecution", 0)
    due_ms = (started_ms // interval_ms + 1) * interval_ms
    return ended_ms >= due_ms - margin_ms and time.time() * 1000 < ended_ms + max(interval_ms, 1000)


def _stop_between_batches(query, timeout: float, seen_running: dict | None = None) -> bool:
    """Stop ``query`` with no batch cut short; True if a safe moment came within ``timeout`` seconds.

    A JVM query is ended gracefully (:class:`_GracefulEnd`) while it waits for its next trigger or
    while a batch executes, and waited for; any other query is stopped while it waits (its trigger
    far enough away, where its interval can be read). At
    ``timeout`` it is stopped regardless: a batch cut short keeps its logged offsets, and Spark,
    like a restore of the savepoint, re-runs it with the same offsets. ``seen_running``: when the batch in
    flight was first seen executing (:func:`_note_batch_running`), if it was before the stop.
    """
    deadline = time.monotonic() + timeout
    graceful = _graceful_end_of(query)
    interval_ms = _trigger_interval_ms(query)
    seen_running, allowances = ({} if seen_running is None else seen_running), {}
    safe = False
    while not safe and time.monotonic() < deadline:
        safe = _safe_moment(query, interval_ms, graceful.jobs_running if graceful else None, seen_running, allowances)
    if safe and graceful is not None:
        safe = graceful.end() and bool(query.awaitTermination(max(deadline - time.monotonic(), 1)))
    query.stop()  # no-op after a graceful end; else interrupts whatever runs
    return safe


class RunHandle:
    """The driver's side of one run: claims and renews the run lease, writes heartbeats."""

    def __init__(self, control: Store, run_id: str, lease: RunLease, *, run_id_given: bool,
                 heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL, lease_timeout: float = DEFAULT_LEASE_TIMEOUT,
                 facts: dict[str, Any] | None = None, secret: str | None = None) -> None:
        self.control = JobControl(control, secret=secret)
        self.run_id = run_id
        self.lease = lease
        self.run_id_given = run_id_given
        self.heartbeat_interval = heartbeat_interval
        self.lease_timeout = lease_timeout
        self.facts = {"host": socket.gethostname(), "pid": os.getpid(), "pid_started": process_started(os.getpid()),
                      "control": control.url, "timeout_s": lease_timeout, **(facts or {})}
        self.last_renewed = time.monotonic()

    @classmethod
    def from_conf(cls, get: Callable[[str], str | None], facts: dict[str, Any] | None = None) -> RunHandle | None:
        """The run described by a Spark conf (``get(key)``); None when the job was not given a control folder."""
        control_url, job_folder, run_id = get(CONTROL_CONF), get(JOB_FOLDER_CONF), get(RUN_ID_CONF)
        if not control_url and not job_folder:
            return None
        run_id_given = bool(run_id) or bool(control_url)
        if not control_url:
            run_id = run_id or new_run_id()
            control_url = Store(job_folder).child(CONTROL_FOLDER).child(run_id).url
        control = Store(control_url)
        run_id = run_id or control.name
        lease_url = get(LEASE_CONF) or (Store(job_folder).url_of(LEASE_FILE) if job_folder
                                        else control.parent().parent().url_of(LEASE_FILE))
        facts = {**(facts or {}), "checkpoint": get(CHECKPOINT_CONF)}
        return cls(control, run_id, RunLease.at(lease_url), run_id_given=run_id_given,
                   heartbeat_interval=float(get(HEARTBEAT_CONF) or DEFAULT_HEARTBEAT_INTERVAL),
                   lease_timeout=float(get(LEASE_TIMEOUT_CONF) or DEFAULT_LEASE_TIMEOUT), facts=facts,
                   secret=get(RUN_SECRET_CONF) or None)

    def _may_take_over(self, holder: RunLeaseHolder) -> bool:
        # a run id given at launch was written into the lease by the start that launched it: another
        # holder came later, so this driver is the stale one, lapsed or not
        return not self.run_id_given

    def claim(self) -> None:
        """Take the run lease, or raise :class:`JobFencedError` (after recording why)."""
        if self.run_id_given and (self.control.stopped() or self.control.failure()):
            self._fence(None, "this run already ended; start a new run instead of re-running it")
        holder = self.lease.acquire(self.run_id, self.facts, may_take_over=self._may_take_over)
        if holder is not None:
            self._fence(holder, "another run holds the job's run lease")
        self.last_renewed = time.monotonic()

    def _fence(self, holder: RunLeaseHolder | None, why: str, **facts: Any) -> None:
        self.control.report_fenced(holder, run_id=self.run_id, reason=why, **facts)
        raise JobFencedError(
            f"run {self.run_id} stopped: {why}" + (f" ({holder.describe()})" if holder else ""),
            "only one run of a job may write its sink: stop the other run first, or let this one end",
        )

    def _beat_facts(self, state: str, facts: dict[str, Any]) -> dict[str, Any]:
        return {**self.facts, **facts, "run_id": self.run_id, "state": state, "interval_s": self.heartbeat_interval,
                "timeout_s": self.lease_timeout}

    def beat(self, state: str = "running", **facts: Any) -> RunLeaseHolder | None | bool:
        """Write a heartbeat and renew the lease. Returns None while this run holds the lease; the
        other holder (or True: not renewed for longer than the lease timeout) when it is fenced off."""
        try:
            self.control.beat(**self._beat_facts(state, facts))
            holder = self.lease.renew(self.run_id, self.facts)
        except Exception as exc:  # noqa: BLE001 - the store is unreachable: fenced once the lease may have lapsed
            log.warning("heartbeat of run %s failed: %s", self.run_id, exc)
            return True if time.monotonic() - self.last_renewed > self.lease_timeout else None
        if holder is None:
            self.last_renewed = time.monotonic()
        return holder

    def end(self, state: str, **facts: Any) -> None:
        """The last heartbeat (``stopped``, ``failed``, ``fenced``), then the lease is released."""
        try:
            self.control.beat(**self._beat_facts(state, facts))
            self.lease.release(self.run_id)
        except Exception as exc:  # noqa: BLE001 - the lease lapses by itself
            log.warning("could not end run %s cleanly: %s", self.run_id, exc)


def claim_run(spark=None) -> RunHandle | None:
    """Claim the job's run lease before the query starts (optional: :func:`run_until_stopped`
    claims it too). Raises :class:`JobFencedError` when another live run holds it, so a stale
    driver writes nothing at all. None when the job was not started with a control folder."""
    spark = spark or _active_session()
    install_skip_missing_input()
    if _check_run(spark):  # an upgrade check (jobs/workflows/check.py): noop sink, no lease, no heartbeat
        return None
    handle = RunHandle.from_conf(lambda key: spark.conf.get(key, None), _driver_facts(spark))
    if handle is not None:
        handle.claim()
        spark.conf.set(RUN_ID_CONF, handle.run_id)  # a run id made here is the one run_until_stopped uses
        spark.conf.set(CONTROL_CONF, handle.control.folder.url)
    return handle


def _driver_facts(spark) -> dict[str, Any]:
    """What the driver knows of itself, for its lease and heartbeats; ``spark_version`` ends up in the
    manifests of savepoints taken of its checkpoint (a checkpoint does not record which Spark wrote it)."""
    return {"application_id": spark.sparkContext.applicationId, "master": spark.sparkContext.master,
            "spark_version": spark.version}


def _check_run(spark) -> str | None:
    """The scratch folder when this driver runs an upgrade check (:mod:`airflow_savepoints.jobs.workflows.check`),
    with the noop sink installed for its queries; None for an ordinary run."""
    folder = (spark.conf.get(CHECK_CONF, None) if spark is not None else None) or os.environ.get(CHECK_ENV)
    if not folder:
        return None
    from airflow_savepoints.jobs.driver.check_sink import install_noop_sink

    install_noop_sink()
    return folder


def _active_session():
    from pyspark.sql import SparkSession

    return SparkSession.active()


def install_skip_missing_input() -> None:
    """From now on a streaming Kafka source of this driver reads with ``failOnDataLoss=false`` when
    its session has ``spark.savepoints.skipMissingInput=true`` (the start accepted that records the
    savepoint resumes at are gone); set last, so it wins over the application's own option. Spark has
    no session conf for it. Classic PySpark only (not Spark Connect's reader)."""
    from pyspark.sql.streaming.readwriter import DataStreamReader

    if getattr(DataStreamReader.load, "_savepoints_skip", False):
        return
    original_format, original_load = DataStreamReader.format, DataStreamReader.load

    def format(self, source):  # noqa: A001 - Spark's name
        self._savepoints_format = source  # the JVM reader does not tell its format back
        return original_format(self, source)

    def load(self, path=None, format=None, schema=None, **options):  # noqa: A002 - Spark's names
        source = format or getattr(self, "_savepoints_format", None)
        if str(source).lower() == "kafka" and str(self._spark.conf.get(SKIP_MISSING_INPUT_CONF, "false")).lower() == "true":
            options["failOnDataLoss"] = "false"
            log.warning("%s=true: this Kafka source reads with failOnDataLoss=false (records gone are skipped)",
                        SKIP_MISSING_INPUT_CONF)
        return original_load(self, path, format, schema, **options)

    load._savepoints_skip = True
    DataStreamReader.format = format
    DataStreamReader.load = load


def _last_batch(query) -> int | None:
    """The newest batch ``query`` committed: its last progress's, unless that trigger ran no batch
    (an idle trigger's progress names the next batch id, and has no ``addBatch``)."""
    progress = query.lastProgress
    if not progress:
        return None
    batch = progress["batchId"] if "addBatch" in (progress.get("durationMs") or {}) else progress["batchId"] - 1
    return batch if batch >= 0 else None


class MetricsRecorder:
    """Records each new batch's progress as a point of the job's metric series (``_metrics.json`` in the
    job folder, the last ``keep`` points; :mod:`airflow_savepoints.jobs.description.metrics`): read when
    seen (:meth:`observe`, every poll), written with the heartbeats (:meth:`flush`). Never fails the run:
    a store or Spark error is logged and the points stay for the next write."""

    def __init__(self, job_folder: Store, run_id: str, *, trigger_interval_ms: int | None = None,
                 cores: Callable[[], int | None] = lambda: None, executors: Callable[[], int | None] = lambda: None,
                 keep: int = DEFAULT_KEEP, file_backlog: FileBacklog | None = None) -> None:
        self.job_folder, self.run_id, self.keep = job_folder, run_id, keep
        self.trigger_interval_ms = trigger_interval_ms
        self.cores, self.executors = cores, executors
        self.file_backlog = file_backlog  # counts the file sources' backlog in its own thread
        self.points: list[MetricPoint] | None = None  # the series as written, read at the first flush
        self.pending: list[MetricPoint] = []
        self.rewrite = False  # a count of the file backlog came in for a point already written
        self.last_backlog: tuple[int, int | None] = (-1, None)  # (batch id, files not yet read) of the newest count
        self.seen: tuple | None = None  # (batchId, timestamp) of the newest progress recorded

    def observe(self, query) -> None:
        """Take the query's progress of every trigger since the last seen (its recent progress, when
        more than one ended since the last poll)."""
        try:
            last = query.lastProgress
            mark = _progress_mark(last)
            if mark is None or mark == self.seen:
                return
            progresses = [last]
            if self.seen is not None and mark[0] > self.seen[0] + 1:  # more than one trigger since: all of them
                progresses = [p for p in query.recentProgress if _progress_mark(p) > self.seen] or [last]
            cores, executors = self.cores(), self.executors()
            for progress in progresses:
                point = point_of(progress, trigger_interval_ms=self.trigger_interval_ms, cores=cores,
                                 executors=executors, run_id=self.run_id)
                if point is not None:
                    self.pending.append(point)
            self.seen = mark
            if self.file_backlog is not None:
                self.file_backlog.submit(last)  # the files not yet read after this batch, counted off the run's path
        except Exception as exc:  # noqa: BLE001 - metrics never fail a run
            log.warning("could not record the batch's metrics: %s: %s", type(exc).__name__, exc)

    def _attach_file_backlog(self) -> None:
        """Put the file backlog counted after a batch into that batch's point (pending, or already written: then
        written again at this flush); a count for a batch no longer kept is dropped."""
        if self.file_backlog is None:
            return
        counted = self.file_backlog.take()
        for batch_id, (unread, read) in counted.items():
            for where in (self.pending, self.points or []):
                found = next((i for i in range(len(where) - 1, -1, -1)
                              if where[i].batch_id == batch_id and where[i].run_id == self.run_id), None)
                if found is not None:
                    where[found] = where[found].model_copy(update={"backlog_files": unread, "files_read": read})
                    self.rewrite = self.rewrite or where is not self.pending
                    break
        if counted:
            self.last_backlog = (max(counted), counted[max(counted)][0])
        newest, unread = self.last_backlog
        if unread is not None:  # a batch no count followed (one ran, or the last was recent): the last count
            self.pending = [p.model_copy(update={"backlog_files": unread}) if p.backlog_files is None
                            and p.batch_id > newest and p.run_id == self.run_id else p for p in self.pending]

    def flush(self) -> None:
        self._attach_file_backlog()
        if not self.pending and not self.rewrite:
            return
        try:
            if self.points is None:
                self.points = read_series(self.job_folder)
            self.points = write_series(self.job_folder, self.points + self.pending, self.keep)
            self.pending, self.rewrite = [], False
        except Exception as exc:  # noqa: BLE001 - metrics never fail a run: kept for the next write (bounded)
            self.pending = self.pending[-self.keep:]
            log.warning("could not write the metric series to %s: %s: %s", self.job_folder.url, type(exc).__name__, exc)


def _metrics_recorder(handle: RunHandle, query, spark) -> MetricsRecorder:
    def cores() -> int | None:
        return int(spark.sparkContext.defaultParallelism)

    def executors() -> int | None:
        try:  # the block managers known, less the driver's; a local master has none of its own
            count = int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1
        except Exception:  # noqa: BLE001 - Spark Connect or other internals
            return None
        return count if count > 0 else None

    job_folder = handle.control.folder.parent().parent()  # <job folder>/_control/<run id>
    return MetricsRecorder(job_folder, handle.run_id, trigger_interval_ms=_trigger_interval_ms(query), cores=cores,
                           executors=executors, file_backlog=FileBacklog(_checkpoint_of(query, spark)))


def _checkpoint_of(query, spark) -> Store | None:
    """The query's checkpoint (the run's, as its start passed it; else the query's own root); None if unknown."""
    try:
        url = spark.conf.get(CHECKPOINT_CONF, None) or str(query._jsq.streamingQuery().resolvedCheckpointRoot())
        return Store(url)
    except Exception as exc:  # noqa: BLE001 - Spark Connect or other internals: no file backlog
        log.warning("no checkpoint found for the file sources' backlog: %s: %s", type(exc).__name__, exc)
        return None


def run_until_stopped(query, spark=None, *, poll_interval: float | None = None, idle_timeout: float = 600) -> None:
    """Wait for ``query`` like ``awaitTermination()``, with heartbeats, fencing and a clean stop
    when Airflow asks (see the module's description).

    Without a control folder (the job was not started for airflow-savepoints) this is exactly
    ``query.awaitTermination()``. A stop request is looked for every ``poll_interval`` seconds (by default
    the control folder's store's: 0.1 s on a local disk or HDFS, 0.5 s where each read is a billed request).
    A failed query raises as ``awaitTermination()`` does; a fenced run raises :class:`JobFencedError` once
    its query has stopped.
    """
    spark = spark or _active_session()
    if (check_folder := _check_run(spark)) is not None:  # an upgrade check: one batch on a scratch copy, then stop
        from airflow_savepoints.jobs.driver.check_sink import run_check

        run_check(query, spark, check_folder)
        return
    handle = RunHandle.from_conf(lambda key: spark.conf.get(key, None),
                                 {**_driver_facts(spark), "query_id": str(query.id),
                                  "driver_pod": spark.conf.get("spark.kubernetes.driver.pod.name", None)})
    if handle is None:
        query.awaitTermination()
        return
    try:
        handle.claim()
    except JobFencedError:
        query.stop()
        raise
    control = handle.control
    control.announce(application_id=spark.sparkContext.applicationId, pid=os.getpid(), host=socket.gethostname(),
                     query_id=str(query.id), run_id=str(query.runId), query_name=query.name, run=handle.run_id)
    poll_interval = poll_interval or control.folder.poll_interval
    request, fenced_by, next_beat, triggered, seen_running, observed = None, None, 0.0, False, {}, None
    metrics = _metrics_recorder(handle, query, spark)
    while request is None and fenced_by is None:
        with _failure_reported(handle):
            if query.awaitTermination(poll_interval):
                metrics.observe(query)
                metrics.flush()
                handle.end("finished", last_committed_batch=_last_batch(query))
                return
        last = query.lastProgress  # read once a poll (a JVM call and its JSON: about 0.8 ms)
        _note_batch_running(query, seen_running, last)
        request = control.stop_requested()
        if not triggered and last is not None:  # its first trigger completed: said at once
            triggered, next_beat = True, 0.0
        if (mark := _progress_mark(last)) != observed:  # a trigger ended since the last poll
            metrics.observe(query)
            observed = mark
        if request is None and time.monotonic() >= next_beat:
            fenced_by = handle.beat(last_committed_batch=_last_batch(query), triggered=triggered)
            next_beat = time.monotonic() + handle.heartbeat_interval
            if fenced_by is None:  # a fenced run writes nothing more
                metrics.flush()
    if fenced_by is not None:
        log.warning("run %s lost its run lease (%s): stopping between batches", handle.run_id, fenced_by)
        detected_at = now_iso()
        handle.control.beat(**handle._beat_facts("fencing", {"last_committed_batch": _last_batch(query)}))
        with _failure_reported(handle):
            idle = _stop_between_batches(query, idle_timeout, seen_running)
        holder = fenced_by if isinstance(fenced_by, RunLeaseHolder) else None
        handle.end("fenced", last_committed_batch=_last_batch(query))  # frees the lease only if still this run's
        why = ("the run lease could not be renewed within its timeout" if holder is None else
               "the run lease was released: the run was stopped or cancelled from elsewhere"
               if holder.run_id == RELEASED else "another run holds the job's run lease")
        handle._fence(holder if holder is not None and holder.run_id != RELEASED else None, why,
                      between_batches=idle, last_committed_batch=_last_batch(query), detected_at=detected_at)
    log.info("stop requested (%s): stopping between batches", request.get("request_id"))
    handle.beat("stopping", last_committed_batch=_last_batch(query))
    with _failure_reported(handle):
        idle = _stop_between_batches(query, idle_timeout, seen_running)
    control.acknowledge_stop(request, between_batches=idle, last_committed_batch=_last_batch(query))
    metrics.observe(query)
    metrics.flush()  # the last batches, while this run still holds the lease
    handle.end("stopped", last_committed_batch=_last_batch(query))


@contextmanager
def _failure_reported(handle: RunHandle) -> Iterator[None]:
    """A query that fails inside says why in the control folder and frees the lease, then fails as before."""
    try:
        yield
    except Exception as exc:
        handle.control.report_failure(exc)
        handle.end("failed", error=f"{type(exc).__name__}: {str(exc)[:500]}")
        raise


if os.environ.get(CHECK_ENV):  # an upgrade check's driver: the sink is swapped before any query starts
    _check_run(None)
if "pyspark.sql" in sys.modules:  # a driver: its Kafka sources get the start's failOnDataLoss choice
    install_skip_missing_input()
