"""The autoscaler's policy: from a job's metric series, the executors and state partitions it needs.

:func:`decide` is pure (no I/O, no clock): it reads the series the in-job helper recorded
(:mod:`airflow_savepoints.jobs.description.metrics`), the job's ``autoscale:`` policy, what the job
runs with now and the past decisions, and returns a :class:`Decision` with its evidence. The
formulas (docs/autoscale.md), after FLIP-271's autoscaler for Flink:

- utilization of a batch = its duration / the trigger interval (back-to-back batches: input rate /
  processed rate); the job is behind when it stays above ``target_utilization + utilization_band``
  (or its backlog above ``max_backlog``: Kafka records, or files of the file sources) for all of
  ``scale_up_after`` seconds, and has too much when it stays below ``target_utilization -
  utilization_band`` for all of ``scale_down_after``;
- rate per core = processedRowsPerSecond / cores (rows a core processes while busy; the mean over
  the window);
- required cores = (input rate + backlog / scale_up_after) / (target_utilization x rate per core), the backlog
  in rows (Kafka's records; the files not yet read times the rows a file held in the window), rounded up
  to whole executors and kept within ``[min_executors, max_executors]``;
- state partitions change only on a scale-up of a stateful query with ``min_partitions`` and
  ``max_partitions`` set, when they bind: the target cores exceed the partitions (the stateful
  stage runs one task per partition), or the state's skew (largest partition over the mean) is
  at least :data:`SKEW_LIMIT`.

No decision is taken while a savepoint, upgrade, check or restore is in flight, within ``cooldown``
of the last action, while the run catches up after its start (until a batch runs below the trigger
interval with its backlog drained, at most ``scale_up_after`` seconds), or without metrics covering
the whole window.

:func:`evaluate` reads those inputs from the job's storage and, with ``mode: act``, carries a change out
through the upgrade path (:mod:`airflow_savepoints.jobs.workflows.upgrade`): a savepoint-mode upgrade to
the version the run was started with, the new executors' Spark conf on top (:func:`spark_conf_for`),
``state_partitions`` when they change, checked first and rolled back on failure.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from airflow_savepoints.core.catalog import Catalog
from airflow_savepoints.core.lease import JobLock, Lease, LeaseState
from airflow_savepoints.core.names import AUTOSCALE_LEASE, CHECK_FOLDER, RESCALE_FOLDER, STATE_SUMMARIES_FOLDER
from airflow_savepoints.core.state_summary import SUMMARY_SUFFIX, read_summary
from airflow_savepoints.errors import (
    AutoscaleActFailedError,
    AutoscaleNotConfiguredError,
    AutoscaleRolledBackError,
    SavepointError,
    UpgradeCheckFailedError,
)
from airflow_savepoints.jobs.description.channel import run_id_time
from airflow_savepoints.jobs.description.metrics import MetricPoint, append_decision, read_decisions, read_series
from airflow_savepoints.jobs.description.model import AutoscaleSettings
from airflow_savepoints.jobs.workflows.run import MAX_WORK_TIMEOUT

if TYPE_CHECKING:
    from pathlib import Path

    from airflow_savepoints.jobs.workflows.run import JobContext, JobState
    from airflow_savepoints.jobs.workflows.upgrade import SubmitFor, UpgradeRequest

Action = Literal["scale_up", "scale_down", "hold"]
SKEW_LIMIT = 2.0  # the largest state partition's rows over the mean at which partitions bind
ACTED = ("acted", "rolled_back", "failed")  # history outcomes of an attempt to act: the cooldown counts from them
AUTOSCALER_STALE_AFTER = 120.0  # seconds: an acting autoscaler's lease not renewed for this long is broken
SKEW_SAVEPOINTS = 5  # the newest completed savepoints looked at for a recorded state summary (the skew)
# seconds: a check's or rescale's folder older is left over (a check's batch: at most MAX_WORK_TIMEOUT, then 2 h for its
# restore and the rest)
IN_FLIGHT_LIFETIME = MAX_WORK_TIMEOUT + 2 * 3600.0
CAUSE_CHARS = 2000  # of an action's error kept in the history (bounded: the history stays below the readers' cap)


@dataclass(frozen=True)
class Current:
    """What the job runs with now, and what else is going on."""

    cores: int  # the application's task slots
    partitions: int | None = None  # the state partitions of a stateful query (None: stateless or unknown)
    skew: float | None = None  # the state's largest partition over the mean (a state summary's), if known
    running: bool = True  # the job has a live run
    in_flight: str | None = None  # a savepoint, upgrade, check or restore of the job in flight: what it is
    skew_from: dict[str, Any] | None = None  # where the skew was read (the savepoint, its summary), or why none

    def skew_evidence(self) -> dict[str, Any]:
        return {"skew": self.skew, **({"skew_from": self.skew_from} if self.skew_from is not None else {})}


class Decision(BaseModel):
    action: Action
    reason: str  # a short code: scale_up, scale_down, in_flight, cooldown, not_running, no_metrics, catching_up, ...
    message: str
    current_executors: int | None = None
    current_cores: int | None = None
    current_partitions: int | None = None
    target_executors: int | None = None
    target_cores: int | None = None
    target_partitions: int | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)

    @property
    def changes(self) -> bool:
        return self.action != "hold"


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds") if epoch is not None else None


def _last_action(history: list[dict[str, Any]]) -> float | None:
    """When the last decision that was acted on (or rolled back) was taken, epoch seconds."""
    times = [entry.get("at_epoch") for entry in history if entry.get("outcome") in ACTED]
    times = [t for t in times if isinstance(t, int | float) and math.isfinite(t)]
    return max(times) if times else None


def catch_up_end(points: list[MetricPoint], policy: AutoscaleSettings) -> float | None:
    """When the run's catch-up after its start ended: the first batch that ran within its trigger interval
    (utilization below 1) with its backlog, where known, no more than that batch's input, but no later than
    ``scale_up_after`` seconds after the run's first batch (a run that never keeps up is not waited on
    forever). None: still catching up. ``points`` are one run's, oldest first."""
    if not points:
        return None
    for point in points:
        used = point.utilization
        drained = ((point.backlog is None or point.backlog <= (point.input_rows or 0))
                   and (point.backlog_files is None or point.backlog_files <= (point.files_read or 0)))
        if used is not None and used < 1.0 and drained:
            return point.time
    limit = points[0].time + policy.scale_up_after
    return limit if points[-1].time >= limit else None


def _covers(points: list[MetricPoint], start: float, window: float) -> bool:
    """Whether ``points`` (after ``start``) span ``window`` seconds, give or take one gap between two points."""
    usable = [p for p in points if p.time >= start]
    if len(usable) < 2:
        return False
    gaps = sorted(b.time - a.time for a, b in zip(usable, usable[1:], strict=False))
    gap = gaps[len(gaps) // 2]
    return usable[-1].time - usable[0].time >= window - gap


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def decide(policy: AutoscaleSettings, series: list[MetricPoint], current: Current, now: float,
           history: list[dict[str, Any]]) -> Decision:
    """The decision for a job now (epoch seconds ``now``): scale up, scale down, or hold, with why.
    First what holds any decision (no run, something in flight, the cooldown, no recent metrics, the
    catch-up after a start), then the windows of the settled batches (:class:`_Windows`)."""
    base = _Windows.unchanged(policy, current)
    last = _last_action(history)
    held = _held(policy, series, current, now, last, base)
    if held is not None:
        return held
    run_id = series[-1].run_id  # an attempt that left the run as it was (its check failed) is no start: no catch-up
    run = [p for p in series if p.run_id == run_id and (run_id is not None or last is None or p.time >= last)]
    settled = catch_up_end(run, policy)
    if settled is None:
        return _hold(base, "catching_up", "the run is catching up after its start (batches back to back or a backlog "
                     "draining): no decision until it keeps up", run_started_at=_iso(run[0].time if run else None),
                     backlog=series[-1].backlog, backlog_files=series[-1].backlog_files)
    windows = _Windows(policy, current, [p for p in run if p.time >= settled], series[-1], base)
    return windows.scale_up() or windows.scale_down() or windows.steady(run[0].time, settled)


def _hold(base: dict[str, Any], reason: str, message: str, **evidence: Any) -> Decision:
    return Decision(action="hold", reason=reason, message=message, evidence=evidence, **base)


def _held(policy: AutoscaleSettings, series: list[MetricPoint], current: Current, now: float, last: float | None,
          base: dict[str, Any]) -> Decision | None:
    """A hold whatever the metrics say: no live run, something in flight, the cooldown, no recent metrics."""
    if not current.running:
        return _hold(base, "not_running", "the job has no live run: nothing to scale")
    if current.in_flight:
        return _hold(base, "in_flight", f"{current.in_flight} in flight: no decision until it is over",
                     in_flight=current.in_flight)
    if last is not None and now < last + policy.cooldown:
        return _hold(base, "cooldown", f"within the cooldown of the last action (until {_iso(last + policy.cooldown)})",
                     last_action_at=_iso(last), cooldown_until=_iso(last + policy.cooldown))
    if not series:
        return _hold(base, "no_metrics", "no metric series recorded yet (the run needs the in-job helper, run_until_stopped)")
    newest = series[-1]
    stale_after = max(120.0, 5 * (newest.trigger_interval_ms or 0) / 1000)
    if now - newest.time > stale_after:
        return _hold(base, "no_metrics", f"the newest batch is {now - newest.time:.0f} s old: no recent metrics",
                     newest_batch_at=_iso(newest.time))
    return None


@dataclass
class _Windows:
    """The settled batches of one run (after its catch-up) judged over the policy's windows: behind for all
    of ``scale_up_after``, spare for all of ``scale_down_after``, or neither."""

    policy: AutoscaleSettings
    current: Current
    settled: list[MetricPoint]
    newest: MetricPoint
    base: dict[str, Any]

    @staticmethod
    def unchanged(policy: AutoscaleSettings, current: Current) -> dict[str, Any]:
        executors = math.ceil(current.cores / policy.executor_cores)
        return {"current_executors": executors, "current_cores": current.cores, "current_partitions": current.partitions,
                "target_executors": executors, "target_cores": current.cores, "target_partitions": current.partitions}

    @property
    def up_threshold(self) -> float:
        return self.policy.target_utilization + self.policy.utilization_band

    @property
    def down_threshold(self) -> float:
        return self.policy.target_utilization - self.policy.utilization_band

    def window(self, seconds: float) -> list[MetricPoint] | None:
        """The settled points of the last ``seconds``; None when they do not span it."""
        start = self.newest.time - seconds
        if not self.settled or not _covers(self.settled, max(start, self.settled[0].time), seconds):
            return None
        return [p for p in self.settled if p.time >= start]

    def _backlogged(self, point: MetricPoint) -> bool:
        """Above ``max_backlog`` in either unit: Kafka records, or files of the file sources."""
        limit = self.policy.max_backlog
        return limit is not None and any(b is not None and b > limit for b in (point.backlog, point.backlog_files))

    def behind(self, point: MetricPoint) -> bool:
        used = point.utilization
        return self._backlogged(point) or (used is not None and used > self.up_threshold)

    def spare(self, point: MetricPoint) -> bool:
        used = point.utilization
        return not self._backlogged(point) and used is not None and used < self.down_threshold

    def evidence(self, points: list[MetricPoint], seconds: float, rate: float | None = None,
                 per_core: float | None = None, required: float | None = None) -> dict[str, Any]:
        used = [u for p in points if (u := p.utilization) is not None]
        return {"window_s": seconds, "points": len(points), "from": _iso(points[0].time), "to": _iso(points[-1].time),
                "utilization_min": _round(min(used, default=None)), "utilization_mean": _round(_mean(used)),
                "utilization_max": _round(max(used, default=None)), "target_utilization": self.policy.target_utilization,
                "up_above": _round(self.up_threshold), "down_below": _round(self.down_threshold),
                "input_rate": _round(rate), "rate_per_core": _round(per_core), "required_cores": _round(required),
                "backlog": points[-1].backlog, "backlog_files": points[-1].backlog_files,
                "rows_per_file": _round(rows_per_file(points)) if points[-1].backlog_files else None,
                **self.current.skew_evidence()}

    def sizing(self, points: list[MetricPoint], rate: float, seconds: float) -> tuple[float | None, float | None]:
        """(rows per second per core, cores required at the target utilization, the backlog drained within
        ``seconds``) from ``points``."""
        per_core = _mean([p.processed_rate / (p.cores or self.current.cores) for p in points
                          if not p.idle and p.processed_rate and p.input_rows])
        if not per_core:
            return None, None
        wanted = rate + backlog_rows(points) / seconds
        return per_core, wanted / (self.policy.target_utilization * per_core)

    def bounded(self, cores: float) -> int:
        per = self.policy.executor_cores
        return min(max(math.ceil(max(cores, 1) / per) * per, self.policy.min_executors * per),
                   self.policy.max_executors * per)

    def scale_up(self) -> Decision | None:
        """Behind (utilization above the band, or backlog above max_backlog) for the whole up window."""
        policy, current, seconds = self.policy, self.current, self.policy.scale_up_after
        up = self.window(seconds)
        if up is None or not all(self.behind(p) for p in up):
            return None
        rate = _mean([p.input_rate for p in up if p.input_rate is not None]) or 0.0
        per_core, required = self.sizing(up, rate, seconds)
        found = self.evidence(up, seconds, rate, per_core, required)
        if required is None:
            return _hold(self.base, "no_rate", "behind for the whole window, but no batch processed rows: no rate per core",
                         **found)
        target = max(self.bounded(required), current.cores)
        partitions = _partitions_up(policy, current, target)
        if target <= current.cores and partitions == current.partitions:
            return _hold(self.base, "at_max", f"behind for {seconds:.0f} s, but already at the bound "
                         f"({policy.max_executors} executors{_partition_note(policy, current)})", **found)
        return Decision(action="scale_up", reason="scale_up", evidence=found, **{
            **self.base, "target_executors": target // policy.executor_cores, "target_cores": target,
            "target_partitions": partitions},
            message=f"utilization above {self.up_threshold:.2f} (or backlog above max_backlog) for {seconds:.0f} s: "
                    f"{current.cores} -> {target} cores" + (f", state partitions {current.partitions} -> {partitions}"
                                                            if partitions != current.partitions else ""))

    def scale_down(self) -> Decision | None:
        """Spare (utilization below the band, no backlog past max_backlog) for the whole down window, sized
        for the window's peak input: no scale-down that the next batch undoes."""
        policy, current, seconds = self.policy, self.current, self.policy.scale_down_after
        down = self.window(seconds)
        if down is None or not all(self.spare(p) for p in down):
            return None
        rate = max((p.input_rate for p in down if p.input_rate is not None), default=0.0)
        per_core, required = self.sizing(down, rate, seconds)
        found = self.evidence(down, seconds, rate, per_core, required)
        low = policy.min_executors * policy.executor_cores
        target = self.bounded(required) if required is not None else low
        if target >= current.cores:
            return _hold(self.base, "at_min" if current.cores <= low else "within_band",
                         f"below {self.down_threshold:.2f} for {seconds:.0f} s, but "
                         + ("already at min_executors" if current.cores <= low else f"the peak input needs {target} cores"),
                         **found)
        return Decision(action="scale_down", reason="scale_down", evidence=found, **{
            **self.base, "target_executors": target // policy.executor_cores, "target_cores": target},
            message=f"utilization below {self.down_threshold:.2f} for {seconds:.0f} s: "
                    f"{current.cores} -> {target} cores (state partitions unchanged)")

    def steady(self, run_started: float, settled: float) -> Decision:
        """Neither window says act: a hold saying why (not a window of settled batches yet, or within the band)."""
        policy = self.policy
        up, down = self.window(policy.scale_up_after), self.window(policy.scale_down_after)
        seen = self.window(min(policy.scale_up_after, policy.scale_down_after))
        if up is None and down is None and seen is None:
            if settled > run_started:  # the run caught up (or stopped being waited on) lately: a full window after it
                return _hold(self.base, "catching_up", f"the run caught up after its start at {_iso(settled)}: no "
                             "decision until a whole window of batches after it", run_started_at=_iso(run_started),
                             settled_at=_iso(settled), backlog=self.newest.backlog,
                             backlog_files=self.newest.backlog_files)
            return _hold(self.base, "no_metrics", "the run's metrics do not cover a window yet",
                         settled_at=_iso(settled), points=len(self.settled))
        points = up or down or seen or self.settled
        return _hold(self.base, "within_band", f"utilization stayed within [{self.down_threshold:.2f}, "
                     f"{self.up_threshold:.2f}] or crossed it for less than a window: no change",
                     **self.evidence(points, policy.scale_up_after if up else policy.scale_down_after))


def rows_per_file(points: list[MetricPoint]) -> float | None:
    """The rows a file of the file sources held, over ``points``' batches that read files; None if none did."""
    read = [p for p in points if p.files_read and p.input_rows is not None]
    files = sum(p.files_read or 0 for p in read)
    return sum(p.input_rows or 0 for p in read) / files if files else None


def backlog_rows(points: list[MetricPoint]) -> float:
    """The newest point's backlog in rows: Kafka's records, plus the files not yet read times the rows a file held
    in the window (a file backlog without a batch that read files adds nothing)."""
    newest = points[-1]
    per_file = rows_per_file(points) if newest.backlog_files else None
    return (newest.backlog or 0) + (newest.backlog_files or 0) * (per_file or 0)


def _partitions_up(policy: AutoscaleSettings, current: Current, target_cores: int) -> int | None:
    """The state partitions a scale-up to ``target_cores`` needs: changed only when they bind."""
    if policy.min_partitions is None or policy.max_partitions is None or current.partitions is None:
        return current.partitions
    wanted = current.partitions
    if target_cores > current.partitions:
        wanted = target_cores
    if current.skew is not None and current.skew >= SKEW_LIMIT:
        wanted = max(wanted, current.partitions * 2)
    return min(max(wanted, policy.min_partitions, current.partitions), policy.max_partitions)


def _partition_note(policy: AutoscaleSettings, current: Current) -> str:
    if policy.max_partitions is None or current.partitions is None:
        return ""
    return f", {current.partitions} of at most {policy.max_partitions} state partitions"


def spark_conf_for(master: str, decision: Decision, executor_cores: int) -> dict[str, str]:
    """The Spark conf that gives a run ``decision``'s executors: standalone ``spark.cores.max`` and
    ``spark.executor.cores``; YARN and Kubernetes ``spark.executor.instances`` (unchecked here); a local
    master takes its cores from ``local[N]``, so nothing."""
    if decision.target_cores is None or master.startswith("local"):
        return {}
    if master.startswith("spark://"):
        return {"spark.cores.max": str(decision.target_cores), "spark.executor.cores": str(executor_cores)}
    return {"spark.executor.instances": str(decision.target_executors), "spark.executor.cores": str(executor_cores)}


# --- reading a job's inputs, acting, recording the decision (``job autoscale``, AutoscaleJobsOperator) -----
def state_skew(ctx: JobContext, partitions: int | None, warnings: list[str] | None = None,
               ) -> tuple[float | None, dict[str, Any]]:
    """The skew of the job's state (its most skewed operator's largest partition over the mean) from the state
    summary recorded beside its newest savepoint that has one (``inspect``, InspectSavepointOperator; among the
    newest :data:`SKEW_SAVEPOINTS` completed ones), when that state has the run's ``partitions``: (skew, where it
    was read), or (None, why not). One catalog read, one listing and one summary read; never raises."""
    if partitions is None:
        return None, {"reason": "the run's metrics give no state partitions (a stateless query, or unknown)"}
    try:
        recorded = set(ctx.folder.listdir(STATE_SUMMARIES_FOLDER))
        if not recorded:
            return None, {"reason": "no state summary recorded beside a savepoint (InspectSavepointOperator)"}
        newest = [r for r in reversed(Catalog(ctx.folder, ctx.job.name).completed()) if not r.retired_checkpoint]
        for record in newest[:SKEW_SAVEPOINTS]:
            if f"{record.savepoint_id}{SUMMARY_SUFFIX}" not in recorded:
                continue
            summary = read_summary(ctx.folder, record.savepoint_id)
            if summary is None:
                continue
            found = {"savepoint_id": summary.savepoint_id, "batch_id": summary.batch_id,
                     "inspected_at": summary.inspected_at}
            held = {op.partitions for op in summary.operators}
            if held != {partitions}:
                return None, {**found, "reason": f"its state has {sorted(held) or 'no'} partitions, the run "
                                                 f"{partitions}: not the running state's"}
            skewed = [op for op in summary.operators if op.skew is not None]
            if not skewed:
                return None, {**found, "reason": "its summary has no rows per partition (unreadable or empty state)"}
            worst = max(skewed, key=lambda op: op.skew)
            return worst.skew, {**found, "operator_id": worst.operator_id, "operator": worst.name,
                                "partitions": worst.partitions, "rows": worst.rows,
                                "largest_partition_rows": max(worst.rows_per_partition, default=None)}
        return None, {"reason": f"none of the newest {SKEW_SAVEPOINTS} savepoints has a state summary"}
    except Exception as exc:  # noqa: BLE001 - the skew is an input, never a failure: the decision goes on without it
        text = f"the state's skew could not be read ({type(exc).__name__}: {exc}): decided without it"
        if warnings is not None:
            warnings.append(text)
        return None, {"reason": text}


def broker_backlog(ctx: JobContext, checkpoint: str | None, warnings: list[str] | None = None,
                   ) -> tuple[int | None, dict[str, Any]]:
    """The Kafka records the job has not read yet, asked of its brokers now (``kafka:`` in the jobs file): each
    partition's latest offset minus the offset its checkpoint's newest committed batch ended at, summed. (records,
    where they came from), or (None, why not): no brokers named, no Kafka source, or brokers that do not answer
    within 15 s (a warning; the decision then uses the backlog Spark's progress gave). Never raises."""
    from airflow_savepoints.checkpoint.progress import committed_kafka_offsets
    from airflow_savepoints.core.input_check import kafka_bounds

    if ctx.job.kafka is None:
        return None, {"reason": "the job names no Kafka brokers (kafka: in the jobs file): Spark's progress"}
    if not checkpoint:
        return None, {"reason": "no checkpoint recorded for the run"}
    try:
        batch, committed = committed_kafka_offsets(ctx.checkpoint(checkpoint))
        if not committed:
            return None, {"reason": f"the checkpoint's batch {batch} reads no Kafka topic"}
        bounds = kafka_bounds(committed, ctx.job.kafka.bootstrap_servers,
                              {"request_timeout_ms": 15000, **ctx.job.kafka.client_options})
    except Exception as exc:  # noqa: BLE001 - an input, never a failure: decided on Spark's progress instead
        text = (f"the Kafka backlog could not be read from {ctx.job.kafka.bootstrap_servers} ({type(exc).__name__}: "
                f"{exc}): Spark's progress used")
        if warnings is not None:
            warnings.append(text)
        return None, {"reason": text}
    records = sum(max(0, held[1] - committed[topic][partition])
                  for (topic, partition), held in bounds.items() if held is not None)
    return records, {"from": "brokers", "bootstrap_servers": ctx.job.kafka.bootstrap_servers, "batch_id": batch,
                     "partitions": sum(held is not None for held in bounds.values())}


def _in_flight(ctx: JobContext, state: JobState, now: float, warnings: list[str]) -> str | None:
    """What of the job is in flight: a start or stop (its run's state), a savepoint (the job's single-flight
    lease, live), an upgrade check (its scratch folder), a rescale (its folder); None when nothing is. A check's
    or a rescale's folder made more than :data:`IN_FLIGHT_LIFETIME` ago (its name says when) was left by a
    process that ended without removing it: not in flight, and a warning names it."""
    if state.state in ("starting", "stopping"):
        return "a start of the job" if state.state == "starting" else "a stop of the job"
    lease = JobLock(ctx.folder, request_id=None).lease.read()
    if lease is not None and not lease.stale:
        return "a savepoint"
    for folder, what in ((CHECK_FOLDER, "an upgrade check"), (RESCALE_FOLDER, "a rescale")):
        for name in ctx.folder.listdir(folder):
            made = run_id_time(name)
            if made is None or now - made.timestamp() < IN_FLIGHT_LIFETIME:
                return what
            warnings.append(f"{ctx.folder.url}/{folder}/{name} was made at {made.isoformat()} and left by {what} that "
                            "ended without removing it: not counted as in flight; the job's next check, rescale or "
                            "inspection removes it once a day old")
    return None


def scale_request(ctx: JobContext, state: JobState, decision: Decision, conf: dict[str, str]) -> UpgradeRequest:
    """The upgrade that carries out ``decision``: the version the run was started with and ``conf`` on top, in
    savepoint mode, checked first, rolled back on failure; ``state_partitions`` only when they change."""
    from airflow_savepoints.jobs.workflows.upgrade import UpgradeRequest, new_version, running_version

    running = ctx.job.with_version(running_version(ctx, state))
    return UpgradeRequest(version=new_version(running, spark_conf=conf), mode="savepoint", check_first=True,
                          rollback=True, state_partitions=changed_partitions(decision))


def changed_partitions(decision: Decision) -> int | None:
    """The state partitions an action asks for: the target's, only when they change."""
    return decision.target_partitions if decision.target_partitions != decision.current_partitions else None


def _act(ctx: JobContext, state: JobState, decision: Decision, conf: dict[str, str], submit_for: SubmitFor,
         log_dir: Path) -> tuple[str, dict[str, Any] | None, SavepointError | None]:
    """Carry ``decision`` out through the upgrade path: (outcome, what was done, the error)."""
    from airflow_savepoints.jobs.workflows.upgrade import UpgradeRolledBackError, upgrade

    request = scale_request(ctx, state, decision, conf)
    ctx.log(f"autoscale: {decision.message}; upgrading job {ctx.job.name} to version {request.version.hash} "
            f"(savepoint mode, checked first{f', state partitions {request.state_partitions}' if request.state_partitions else ''})")
    try:
        done = upgrade(ctx, request, submit_for=submit_for, log_dir=log_dir)
    except (UpgradeCheckFailedError, UpgradeRolledBackError) as exc:
        return "rolled_back", None, exc
    except SavepointError as exc:
        return "failed", None, exc
    check, started = done.get("check") or {}, done["started"]
    return "acted", {"mode": done["mode"], "from_version": done["from_version"]["hash"],
                     "to_version": done["to_version"]["hash"], "spark_conf": conf,
                     "state_partitions": request.state_partitions, "check_duration_s": check.get("duration_s"),
                     "stop_savepoint": done["stop_savepoint"], "stop_batch": done["stop_batch"],
                     "run_id": started["run_id"], "first_batch": started["first_batch"],
                     "checkpoint": started["checkpoint"], "rescale_standby": done.get("rescale_standby")}, None


def _act_error(name: str, decision: Decision, outcome: str, cause: SavepointError, until: str | None) -> SavepointError:
    """The typed error of an action that was rolled back or failed, naming the change and the cause."""
    change = (f"{decision.action} of job '{name}' ({decision.current_cores} -> {decision.target_cores} cores, state "
              f"partitions {decision.current_partitions} -> {decision.target_partitions})")
    text = f"{cause.code}: {cause.message}"[:CAUSE_CHARS]
    wait = f"no decision before {until} (the cooldown)"
    if outcome == "rolled_back":
        on = getattr(cause, "rolled_back_on", None) or {}
        where = ("failed its check on a copy of the state; the running configuration was not stopped"
                 if isinstance(cause, UpgradeCheckFailedError) else
                 "was not healthy after the restart; the previous configuration runs again "
                 + (f"on the new run's progress (savepoint {on.get('savepoint_id')}, batch {on.get('batch_id')})"
                    if on.get("from") == "progress" else "from the stop savepoint"))
        return AutoscaleRolledBackError(f"the {change} {where}: {text}", f"see the cause and its log; {wait}",
                                        cause=cause.cause)
    return AutoscaleActFailedError(f"the {change} failed: {text}", f"{cause.hint or 'see the cause'}; {wait}",
                                   cause=cause.cause)


def act_failures(results: list[dict[str, Any]]) -> SavepointError | None:
    """One error for the actions of ``results`` (``evaluate``'s) that were rolled back or failed; None if none."""
    errors = [r["error"] for r in results if r.get("error")]
    if not errors:
        return None
    kind = AutoscaleActFailedError if any(e["code"] == AutoscaleActFailedError.code for e in errors) \
        else AutoscaleRolledBackError
    return kind("\n".join(e["message"] for e in errors), "; ".join(dict.fromkeys(e["hint"] for e in errors if e["hint"])))


def evaluate(ctx: JobContext, *, dry_run: bool, submit_for: SubmitFor, log_dir: Path,
             now: float | None = None) -> dict[str, Any]:
    """The job's decision now from what its storage holds (status, metric series, decision history); with
    ``mode: act`` and not ``dry_run``, a change carried out (:func:`scale_request`). Recorded in its bounded
    decision history as ``recommended``, ``held``, ``acted``, ``rolled_back`` or ``failed``; what ``job
    autoscale`` prints. An action that was rolled back or failed is returned with its ``error``, not raised; one
    rolled back after its restart with its ``rollback`` (``rolled_back_on``: the new run's progress, a ``rollback``
    savepoint and its batch, or the stop savepoint).

    One acting autoscaler per job at a time: with ``mode: act`` and not ``dry_run``, the job's autoscaler lease
    (``_autoscale.lease``, :class:`~airflow_savepoints.core.lease.Lease`: one conditional create, renewed while it
    acts, broken :data:`AUTOSCALER_STALE_AFTER` seconds after its holder died) is taken before anything is read and
    released after the decision is recorded; a second one meanwhile holds (``in_flight``, recorded) and a dry run
    or ``mode: recommend`` reads it and holds too."""
    policy = ctx.job.autoscale
    if policy is None:
        raise AutoscaleNotConfiguredError(f"job '{ctx.job.name}' has no autoscale: policy in the jobs file",
                                          "add an autoscale: block to the job (docs/autoscale.md)")
    now = time.time() if now is None else now
    began = time.monotonic()
    warnings: list[str] = []
    lease = Lease(ctx.folder, AUTOSCALE_LEASE, stale_after=AUTOSCALER_STALE_AFTER,
                  facts={"started_at": now, "job": ctx.job.name})
    acting = policy.mode == "act" and not dry_run
    other = lease.try_acquire() if acting else lease.read()  # one acting autoscaler per job (docs/autoscale.md)
    if other is not None and other.stale and not acting:
        other = None
    if acting and other is None:
        lease.start_heartbeat()
    try:
        return _evaluate(ctx, policy, dry_run=dry_run, submit_for=submit_for, log_dir=log_dir, now=now, began=began,
                         warnings=warnings, other=_autoscaler_of(other))
    finally:
        if acting and other is None:
            lease.release()


def _autoscaler_of(holder: LeaseState | None) -> str | None:
    """Another autoscaler of the job that holds its lease (live): what it is, for an ``in_flight`` hold."""
    if holder is None:
        return None
    since = holder.facts.get("started_at")
    since = f", since {_iso(since)}" if isinstance(since, int | float) and math.isfinite(since) else ""
    return f"another autoscaler of the job (owner {holder.owner or 'unknown'}{since}, its lease {AUTOSCALE_LEASE})"


def _evaluate(ctx: JobContext, policy: AutoscaleSettings, *, dry_run: bool, submit_for: SubmitFor, log_dir: Path,
              now: float, began: float, warnings: list[str], other: str | None) -> dict[str, Any]:
    """:func:`evaluate` once the autoscaler's lease is settled: ``other`` names another autoscaler holding it."""
    from airflow_savepoints.jobs.workflows import lifecycle

    state = lifecycle.status(ctx)
    series = read_series(ctx.folder, warnings)
    history = read_decisions(ctx.folder, warnings)
    running = state.state in ("starting", "running", "stopping")
    backlog, backlog_from = broker_backlog(ctx, state.checkpoint, warnings) if running and series else (None, {})
    if backlog is not None:  # the brokers' figure now, in place of the one the newest batch's progress gave
        series[-1] = series[-1].model_copy(update={"backlog": backlog})
    run_points = [p for p in series if p.run_id == series[-1].run_id] if series else []
    newest = run_points[-1] if run_points else None
    cores = next((p.cores for p in reversed(run_points) if p.cores), None) or policy.min_executors * policy.executor_cores
    partitions = newest.state_partitions if newest else None
    skew, skew_from = state_skew(ctx, partitions, warnings)
    current = Current(cores=cores, partitions=partitions, skew=skew, skew_from=skew_from,
                      running=running, in_flight=other or _in_flight(ctx, state, now, warnings))
    decision = decide(policy, series, current, now, history)
    if backlog_from:
        decision.evidence["backlog_read"] = backlog_from
    if decision.reason == "not_running":
        decision.message = f"the job is {state.state}: nothing to scale"
    conf = spark_conf_for(ctx.master, decision, policy.executor_cores) if decision.changes else {}
    outcome, done, error, rollback = ("recommended" if decision.changes else "held"), None, None, None
    if decision.changes and policy.mode == "act" and not dry_run:
        if conf or decision.target_partitions != decision.current_partitions:
            outcome, done, error = _act(ctx, state, decision, conf, submit_for, log_dir)
            if on := getattr(error, "rolled_back_on", None):  # rolled back after the restart: what it runs from
                rollback = {"rolled_back_on": on, "state_partitions": changed_partitions(decision), "spark_conf": conf}
        else:
            warnings.append(f"master {ctx.master} gives the job its cores itself (local[N]) and the state partitions "
                            "stay: nothing to act on, recommended only; change the job's master for more cores")
    ended = now + (time.monotonic() - began)
    payload = {
        "job": ctx.job.name, "at": _iso(now), "mode": policy.mode, "dry_run": dry_run, "outcome": outcome,
        "action": decision.action, "reason": decision.reason, "message": decision.message,
        "current": {"executors": decision.current_executors, "cores": decision.current_cores,
                    "partitions": decision.current_partitions},
        "target": {"executors": decision.target_executors, "cores": decision.target_cores,
                   "partitions": decision.target_partitions},
        "spark_conf": conf, "evidence": decision.evidence, "run_id": newest.run_id if newest else None,
        "points": len(series), "upgrade": done, "rollback": rollback,
        "error": _act_error(ctx.job.name, decision, outcome, error, _iso(ended + policy.cooldown)).to_dict()
        if error is not None else None,
        "warnings": warnings,
    }
    append_decision(ctx.folder, {**{k: v for k, v in payload.items() if k != "warnings"}, "at_epoch": ended},
                    warnings=warnings)
    return payload
