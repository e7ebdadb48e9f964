"""The watchdog: restart failed or lost jobs with backoff, give up after a maximum, report stalls.

What the Flink Kubernetes operator does with ``kubernetes.operator.job.restart.failed`` (and Flink
with its exponential-delay restart strategy), for jobs of a jobs file, one call per job and check
(the ``supervise_jobs`` DAG calls :func:`supervise` every minute):

* running: healthy, unless it has a ``progress_timeout`` and a batch was planned (its offsets
  logged: input is waiting) but not committed for longer than that: ``stalled`` (reported, not
  restarted: a restart would not unstick a sink that cannot be written);
* failed or lost, with ``restart.enabled``: restarted on its live checkpoint (last-state: nothing
  copied, Spark's own recovery) when that checkpoint passes the planner's checks and
  ``restart.last_state`` allows it, else from the job's newest savepoint. The n-th restart in a
  ``restart.window`` waits ``restart.backoff * 2**(n-2)`` seconds after the one before ended (at
  most ``restart.max_backoff``); after ``restart.max_restarts`` restarts in the window the job stays
  down (``gave_up``) until someone starts it again (which starts a fresh count);
* stopped or never started: left alone (a stop is on purpose).

Every decision is written, with the restarts and the next retry time, to
``<savepoint dir>/<job>/_watchdog.json`` beside the run lease (before a restart is attempted, so
a watchdog that dies mid-restart still counts it), and shown by ``job status --json``. Times are
on the store's clock, as the lease's. No Airflow here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.core.lease import store_now
from airflow_savepoints.core.names import WATCHDOG_FILE
from airflow_savepoints.core.settings import parse_duration
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs.workflows.run import JobContext, JobState

HISTORY = 20  # decisions kept in the file
Action = Literal["healthy", "stalled", "not_running", "down", "restarted", "restart_failed", "backoff", "gave_up"]
ALERTS = ("stalled", "down", "gave_up")  # what fails the supervising task


class WatchdogError(SavepointError):
    """A job the watchdog cannot bring back, or one that stalled."""

    code = "job_unhealthy"


class Decision(BaseModel):
    """One decision of the watchdog about one job."""

    job: str
    action: Action
    reason: str = ""
    at: float  # epoch seconds, store clock
    state: str | None = None
    run_id: str | None = None
    mode: str | None = None  # of a restart: last-state or savepoint
    last_batch: int | None = None
    next_retry_at: float | None = None

    def describe(self) -> str:
        retry = f"; next retry at {_iso(self.next_retry_at)}" if self.next_retry_at else ""
        return f"job {self.job}: {self.action}" + (f" ({self.reason})" if self.reason else "") + retry


class WatchdogState(BaseModel):
    """What the watchdog keeps per job: restart times in the window, next retry, recent decisions."""

    restarts: list[float] = Field(default_factory=list)
    next_retry_at: float | None = None
    gave_up: str | None = None  # the reason, until the job runs again
    history: list[Decision] = Field(default_factory=list)

    def view(self) -> dict[str, Any]:
        """For ``job status --json``: the last decision, restarts and next retry (ISO times)."""
        last = self.history[-1] if self.history else None
        return {"restarts": len(self.restarts), "restart_times": [_iso(t) for t in self.restarts],
                "next_retry_at": _iso(self.next_retry_at), "gave_up": self.gave_up,
                "last_decision": {**last.model_dump(), "at": _iso(last.at)} if last else None}


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, UTC).isoformat() if epoch is not None else None


def read_state(ctx: JobContext) -> WatchdogState:
    try:
        return WatchdogState.model_validate_json(ctx.folder.read_bytes(WATCHDOG_FILE))
    except FileNotFoundError:
        return WatchdogState()
    except (ValidationError, ValueError):  # damaged: start over rather than stop supervising
        return WatchdogState()


def _save(ctx: JobContext, state: WatchdogState, decision: Decision) -> Decision:
    state.history = [*state.history, decision][-HISTORY:]
    ctx.folder.write_bytes_atomic(WATCHDOG_FILE, json.dumps(state.model_dump(mode="json"), indent=1).encode())
    ctx.log(decision.describe())
    return decision


def stall_reason(ctx: JobContext, state: JobState) -> str | None:
    """Why the running job counts as stalled (a planned batch uncommitted past its
    ``progress_timeout``), or None."""
    timeout = ctx.job.progress_timeout
    if timeout is None or not state.checkpoint:
        return None
    checkpoint = ctx.checkpoint(state.checkpoint)
    committed, _ = checkpoint_progress(checkpoint)
    planned = max((int(p) for p in checkpoint.list_files("offsets") if p.isdigit()), default=None)
    if planned is None or (committed is not None and planned <= committed):
        return None  # no input waiting: nothing to commit
    try:  # aged on the checkpoint store's clock, probed beside the checkpoint (never inside it)
        modified = checkpoint.stat(f"offsets/{planned}").modified
    except FileNotFoundError:
        return None
    age = None if modified is None else store_now(checkpoint.parent()) - modified
    if age is None or age <= timeout:
        return None
    return (f"batch {planned} was planned {age:.0f}s ago and is not committed (progress_timeout {timeout:.0f}s); "
            f"last committed batch {committed}")


def _backoff(ctx: JobContext, restarts: int) -> float:
    """Seconds to wait after the ``restarts``-th restart in the window before the next one."""
    policy = ctx.job.restart
    return min(policy.backoff * 2 ** max(restarts - 1, 0), policy.max_backoff)


def supervise(ctx: JobContext, *, submit_command: Callable[[str, dict[str, str]], list[str]], log_dir: Path,
              wait_timeout: float = 300) -> Decision:
    """Look at one job and act: restart it, wait (backoff), give up, or report; return the decision."""
    from airflow_savepoints.jobs.workflows import lifecycle  # here: `job status` reads read_state alone

    state = lifecycle.status(ctx)
    memory = read_state(ctx)
    now = store_now(ctx.folder)
    memory.restarts = [t for t in memory.restarts if now - t < parse_duration(ctx.job.restart.window)]
    facts = {"job": ctx.job.name, "at": now, "state": state.state, "run_id": state.run_id,
             "last_batch": state.last_batch}
    if state.live:
        if memory.gave_up and state.state == "running":  # started again by someone: a fresh window
            memory.gave_up, memory.restarts, memory.next_retry_at = None, [], None
        stalled = stall_reason(ctx, state)
        return _save(ctx, memory, Decision(**facts, action="stalled" if stalled else "healthy", reason=stalled or ""))
    if state.state not in ("failed", "lost"):
        return _save(ctx, memory, Decision(**facts, action="not_running", reason=state.detail or ""))
    why = state.error or state.detail or state.state
    if not ctx.job.restart.enabled:
        return _save(ctx, memory, Decision(**facts, action="down", reason=f"{why}; restarts are not enabled"))
    if memory.gave_up or len(memory.restarts) >= ctx.job.restart.max_restarts:
        memory.gave_up = memory.gave_up or (f"{len(memory.restarts)} restarts within {ctx.job.restart.window} "
                                            f"(max_restarts {ctx.job.restart.max_restarts}); last failure: {why}")
        return _save(ctx, memory, Decision(**facts, action="gave_up", reason=memory.gave_up))
    if memory.next_retry_at is not None and now < memory.next_retry_at:
        return _save(ctx, memory, Decision(**facts, action="backoff", reason=why, next_retry_at=memory.next_retry_at))
    return _restart(ctx, memory, state, facts, submit_command=submit_command, log_dir=log_dir,
                    wait_timeout=wait_timeout)


def _restart(ctx: JobContext, memory: WatchdogState, state: JobState, facts: dict[str, Any], *,
             submit_command: Callable[[str, dict[str, str]], list[str]], log_dir: Path,
             wait_timeout: float) -> Decision:
    """Restart a failed or lost job: last-state when its checkpoint passes the checks, else from the
    newest savepoint. The attempt is recorded first (write-ahead), then made."""
    from airflow_savepoints.jobs.workflows import lifecycle
    from airflow_savepoints.jobs.workflows.upgrade import checkpoint_problem

    problem = "restart.last_state is off" if not ctx.job.restart.last_state else checkpoint_problem(ctx, state.checkpoint)
    mode = "savepoint" if problem else "last-state"
    memory.restarts.append(facts["at"])
    memory.next_retry_at = facts["at"] + _backoff(ctx, len(memory.restarts))
    why = state.error or state.detail or state.state
    _save(ctx, memory, Decision(**facts, action="restarted", mode=mode, reason=f"restarting after: {why}"[:2000],
                                next_retry_at=memory.next_retry_at))
    if problem:
        ctx.log(f"job {ctx.job.name}: not last-state ({problem}): from the newest savepoint")
    ended = lifecycle.abandon(ctx, f"{state.state}: {why}"[:2000])  # its checkpoint stays as it is
    try:
        if mode == "last-state":
            started = lifecycle.resume(ctx, ended["checkpoint"], submit_command=submit_command, log_dir=log_dir,
                                       wait_timeout=wait_timeout)
        else:
            started = lifecycle.start(ctx, submit_command=submit_command, log_dir=log_dir, wait_timeout=wait_timeout)
    except SavepointError as exc:
        outcome = Decision(**facts, action="restart_failed", mode=mode, reason=str(exc)[:2000],
                           next_retry_at=memory.next_retry_at)
    else:
        outcome = Decision(**{**facts, "run_id": started["run_id"], "last_batch": started["first_batch"]},
                           action="restarted", mode=mode, reason=f"after: {why}"[:2000],
                           next_retry_at=memory.next_retry_at)
    memory.history.pop()  # the write-ahead entry, now completed by the outcome
    memory.next_retry_at = outcome.next_retry_at = store_now(ctx.folder) + _backoff(ctx, len(memory.restarts))
    return _save(ctx, memory, outcome)


def alerts(decisions: list[Decision]) -> WatchdogError | None:
    """The error a supervising task fails with, if any decision is an alert."""
    bad = [d for d in decisions if d.action in ALERTS]
    if not bad:
        return None
    return WatchdogError("; ".join(d.describe() for d in bad),
                         "see `airflow-savepoints job status JOB --json` (watchdog); fix the cause, then start the job")
