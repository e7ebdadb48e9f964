"""``airflow-savepoints job``: start, stop (with a savepoint), cancel and watch streaming jobs.

The same lifecycle code as the job operators (:mod:`airflow_savepoints.jobs.workflows.lifecycle`), so it
works from any machine that reaches the job's storage (and its runner, for a forced stop).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from airflow_savepoints.cli.options import (
    MaxAgeOption,
    SkipMissingInputOption,
    StatePartitionsOption,
    option_group,
    with_option_groups,
)
from airflow_savepoints.cli.output import command, emit, err, escape, print_state_summary
from airflow_savepoints.cli.storage import open_root
from airflow_savepoints.cli.storage import storage_options as connection_storage_options
from airflow_savepoints.errors import InvalidInputError

if TYPE_CHECKING:  # the job modules are imported by the commands that run (not by every CLI start)
    from airflow_savepoints.jobs.description.model import StreamingJob
    from airflow_savepoints.jobs.workflows.run import JobContext
    from airflow_savepoints.storage import Store

# `airflow-savepoints job`: made when a command line names it (cli/main.py's LAZY_GROUPS), with the main
# application's settings (plain help texts: "[savepoints]" is an Airflow config section, not markup)
app = typer.Typer(name="job", help="Start, stop (with a savepoint), cancel and watch streaming jobs from a jobs file.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

def _seconds(*, zero: bool) -> Callable[[float], float]:
    """A callback refusing a number of seconds that is not finite (``nan`` and ``inf`` would never end a wait) or is
    negative, and 0 unless ``zero`` (0: do not wait)."""
    def finite(value: float) -> float:
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise typer.BadParameter(f"{value} is not a finite number of seconds, " + ("0 or more" if zero else "above 0"))
        return value

    return finite


_finite_positive, _finite_non_negative = _seconds(zero=False), _seconds(zero=True)


JobArgument = Annotated[str, typer.Argument(help="The job's name in the jobs file.")]
JobsFile = Annotated[str, typer.Option("--jobs-file", envvar="SAVEPOINTS_JOBS_FILE",
                                       help="The YAML file of jobs (default: jobs.yaml here, or $SAVEPOINTS_JOBS_FILE).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text.")]
DirOption = Annotated[str | None, typer.Option("--dir", help="Savepoint directory (default: the job's "
                                                              "savepoint_dir, then AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR).")]
OptionsOption = Annotated[str | None, typer.Option("--storage-options", help="fsspec storage options of the savepoint "
                                                                             "directory, as JSON.")]
CheckpointOptions = Annotated[str | None, typer.Option("--checkpoint-storage-options",
                                                       help="fsspec storage options of the job's checkpoints, as JSON "
                                                            "(default: the savepoint directory's on the same kind of store).")]
ConnOption = Annotated[str | None, typer.Option("--conn-id", help="An Airflow 'savepoints' connection for the savepoint "
                                                                  "directory and its credentials (needs Airflow here).")]
CheckpointConn = Annotated[str | None, typer.Option("--checkpoint-conn-id", help="An Airflow 'savepoints' connection "
                                                                                 "whose storage options open the checkpoints.")]


def _options(text: str | None, what: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(f"{what} is not JSON: {exc}", 'give a JSON object, e.g. \'{"endpoint_url": "..."}\'') from exc
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a JSON object", 'e.g. \'{"endpoint_url": "..."}\'')
    return value


@option_group
class JobTarget:
    """Where a job command finds the job and its storage (connections as every command resolves them)."""

    jobs_file: JobsFile = "jobs.yaml"
    savepoint_dir: DirOption = None
    storage_options: OptionsOption = None
    checkpoint_storage_options: CheckpointOptions = None
    conn_id: ConnOption = None
    checkpoint_conn_id: CheckpointConn = None

    def context(self, job_name: str) -> JobContext:
        """The job named ``job_name`` in the jobs file, with its savepoint root and checkpoint options."""
        from airflow_savepoints.jobs import load_jobs
        from airflow_savepoints.jobs.workflows.run import JobContext
        from airflow_savepoints.storage import Store

        jobs = load_jobs(self.jobs_file)
        if job_name not in jobs:
            raise InvalidInputError(f"no job named {job_name!r} in {self.jobs_file}",
                                    f"use one of: {', '.join(sorted(jobs))}")
        job = jobs[job_name]
        root = open_root(self.conn_id, self.savepoint_dir or job.savepoint_dir)
        extra = _options(self.storage_options, "--storage-options")
        if extra:
            root = Store(root.url, {**root.storage_options, **extra})
        checkpoint = _options(self.checkpoint_storage_options, "--checkpoint-storage-options")
        if checkpoint is None and self.checkpoint_conn_id:
            checkpoint = connection_storage_options(self.checkpoint_conn_id)
        if checkpoint is None:
            checkpoint = root.options_for(job.checkpoint)
        master = None
        if job.spark_conn_id:  # a Spark connection is Airflow's: its master is the runner's address
            from airflow_savepoints.hooks.streaming_job import connection_master

            master = connection_master(job)
        return JobContext(job, root, checkpoint, log=lambda message: err.print(message, markup=False),
                          spark_master=master)


def _report(as_json: bool, action) -> None:
    """Run ``action() -> (payload, text)`` and print it; errors as every command reports them."""
    @command
    def run(as_json: bool = False) -> None:
        payload, text = action()
        emit(as_json, payload, text)

    run(as_json=as_json)


def _submit_command(ctx: JobContext):
    from airflow_savepoints.jobs.launch.launcher import spark_submit_command

    if ctx.job.spark_conn_id:  # a Spark connection is Airflow's: build the command as the operators do
        from airflow_savepoints.hooks.streaming_job import SparkStreamingJobHook

        return SparkStreamingJobHook(ctx.job).submit_command
    return lambda checkpoint, conf: spark_submit_command(ctx.job, checkpoint, conf)


def _submit_for(ctx: JobContext):
    """The submit command builder of any version of ``ctx``'s job (an upgrade's or a check's new version)."""
    from airflow_savepoints.jobs.workflows.run import JobContext

    return lambda version: _submit_command(JobContext(version, ctx.root))


@option_group
class StartFrom:
    """What a started run's checkpoint comes from."""

    pointer: Annotated[str | None, typer.Option("--from", help="A savepoint to start from (default: the newest).")] = None
    fresh: Annotated[bool, typer.Option("--fresh", help="Start with EMPTY state in the job's (empty) checkpoint.")] = False
    max_age: MaxAgeOption = None
    skip_missing_input: SkipMissingInputOption = False
    state_partitions: StatePartitionsOption = None
    to: Annotated[str | None, typer.Option("--to", help="The new checkpoint location: the job's checkpoint or "
                                                        "<checkpoint>-<suffix> (default <checkpoint>-<UTC time>).")] = None
    from_other_job: Annotated[bool, typer.Option("--from-other-job", help="Allow --from a savepoint of another job "
                                                 "or outside this job's folder of the savepoint root.")] = False
    sink_path: Annotated[str | None, typer.Option("--sink-path", help="The job's sink, instead of the jobs file's "
                                                  "sink: (its location).")] = None
    sink_kind: Annotated[str | None, typer.Option("--sink-kind", help="The sink's kind: file, delta, kafka, foreach, "
                                                  "foreach_batch or other (default: the jobs file's; a path alone: "
                                                  "file, or delta when it holds _delta_log).")] = None
    allow_repeats: Annotated[bool, typer.Option("--allow-repeats", help="Start even though an at-least-once sink gets "
                                                "the batches after the savepoint again (else sink_repeats).")] = False
    reprocess: Annotated[bool, typer.Option("--reprocess", help="Delta: a new query id, so the table gets the batches "
                                            "after the savepoint again (only once their rows are gone).")] = False

    def restore_checks(self, root: Store) -> dict[str, Any]:
        """The restore's own choices, and the sink given here instead of the jobs file's (opened with the
        savepoint directory's options when on the same kind of store)."""
        checks = {"max_age": self.max_age, "skip_missing_input": self.skip_missing_input,
                  "state_partitions": self.state_partitions, "allow_repeats": self.allow_repeats,
                  "reprocess": self.reprocess}
        if self.sink_path or self.sink_kind:
            checks.update(sink_path=self.sink_path, sink_kind=self.sink_kind, sink_app_id=None,
                          sink_storage_options=root.options_for(self.sink_path) if self.sink_path else None)
        return checks


def _log_dir(given: Path | None) -> Path:
    return given or Path(os.environ.get("TMPDIR", "/tmp")) / "airflow-savepoints-jobs"


@app.command()
@with_option_groups
def start(
    job: JobArgument,
    *,
    origin: StartFrom,
    wait_timeout: Annotated[float, typer.Option(help="Seconds to wait until the run is live (its heartbeat; "
                                                     "without the helper: a new committed batch).",
                                                callback=_finite_positive)] = 300,
    log_dir: Annotated[Path | None, typer.Option(envvar="SAVEPOINTS_LOG_DIR", help="Where the driver's log goes "
                                                 "(default: $TMPDIR/airflow-savepoints-jobs).")] = None,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Start JOB from a savepoint (or --fresh); refused while another run of JOB lives anywhere."""
    def action():
        from airflow_savepoints.jobs.workflows import lifecycle

        if origin.pointer and origin.fresh:
            raise InvalidInputError("--from and --fresh exclude each other", "give one of them")
        ctx = target.context(job)
        result = lifecycle.start(ctx, submit_command=_submit_command(ctx), log_dir=_log_dir(log_dir),
                                 pointer=origin.pointer, fresh=origin.fresh, target_checkpoint=origin.to,
                                 wait_timeout=wait_timeout, allow_foreign_savepoint=origin.from_other_job,
                                 **origin.restore_checks(ctx.root))
        return result, (f"[green]started[/] job {job}: run {result['run_id']} (pid {result['pid']} on {result['host']}), "
                        f"{'live at' if result.get('live') == 'heartbeat' else 'committed'} batch {result['first_batch']}"
                        f"\n  checkpoint {result['checkpoint']}\n  log {result['log_file']}")

    _report(as_json, action)


@app.command()
@with_option_groups
def stop(
    job: JobArgument,
    *,
    grace: Annotated[float, typer.Option(help="Seconds for the job to stop between batches before it is forced.",
                                         callback=_finite_non_negative)] = 60,
    inflight_wait: Annotated[float, typer.Option(help="Seconds to wait for a savepoint in flight before stopping.",
                                                 callback=_finite_non_negative)] = 300,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Stop JOB with a final ``stop`` savepoint of its last committed batch."""
    def action():
        from airflow_savepoints.jobs.workflows import lifecycle

        ctx = target.context(job)
        result = lifecycle.stop(ctx, grace=grace, inflight_wait=inflight_wait)
        return result, (f"[green]stopped[/] job {job} ({result['stop_method']}); {result['consistency']} stop "
                        f"savepoint of batch {result['batch_id']}: {result['pointer']}")

    _report(as_json, action)


class SavepointKind(StrEnum):
    manual = "manual"
    periodic = "periodic"


@app.command("savepoint")
@with_option_groups
def savepoint_job(
    job: JobArgument,
    *,
    savepoint_type: Annotated[SavepointKind, typer.Option(
        "--type", help="manual (kept by retention) or periodic (subject to retention).")] = SavepointKind.manual,
    reason: Annotated[str | None, typer.Option(help="Why it is taken (kept in the manifest).")] = None,
    request_id: Annotated[str | None, typer.Option(help="Idempotency key: a retry returns the same savepoint.")] = None,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Take a savepoint of JOB's live query: the checkpoint its live run writes, from any host."""
    def action():
        from airflow_savepoints.jobs.workflows import lifecycle

        ctx = target.context(job)
        result = lifecycle.savepoint(ctx, savepoint_type=savepoint_type.value, reason=reason, request_id=request_id)
        return result, (f"[green]savepoint completed[/]: {result['pointer']}\n  batch {result['batch_id']} of run "
                        f"{result['run_id']} ({result['checkpoint']})")

    _report(as_json, action)


@app.command()
@with_option_groups
def cancel(
    job: JobArgument,
    *,
    policy: Annotated[str | None, typer.Option(help="RETAIN_ON_CANCELLATION, RETAIN_ON_FAILURE or "
                                                    "NEVER_RETAIN_AFTER_TERMINATION (default: the job's).")] = None,
    grace: Annotated[float, typer.Option(help="Seconds for the job to answer before it is forced (0: at once).",
                                         callback=_finite_non_negative)] = 60,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Cancel JOB without a savepoint, then apply its checkpoint retention policy."""
    def action():
        from airflow_savepoints.jobs.workflows import lifecycle

        ctx = target.context(job)
        result = lifecycle.cancel(ctx, policy=policy, grace=grace)
        return result, (f"[yellow]cancelled[/] job {job} ({result['stop_method']}); checkpoint {result['checkpoint']} "
                        f"{result['action']} ({result['policy']})")

    _report(as_json, action)


STATUS_KEYS = ("job", "state", "run_id", "host", "application_id", "last_batch", "heartbeat_age_s")


@app.command()
@with_option_groups
def status(
    job: JobArgument,
    *,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Show JOB's state (starting, running, stopping, stopped, failed, lost, unknown, not_started)."""
    def action():
        from airflow_savepoints.jobs.workflows import watchdog
        from airflow_savepoints.jobs.workflows.run import Run

        ctx = target.context(job)
        found = Run.read(ctx).state()
        found.watchdog = watchdog.read_state(ctx).view()
        state = found.model_dump(mode="json")
        payload = {**{k: state[k] for k in STATUS_KEYS}, **state}
        colour = {"running": "green", "failed": "red", "lost": "red", "unknown": "yellow"}.get(state["state"], "cyan")
        text = f"job {job}: [{colour}]{state['state']}[/]" + (f" ({state['error']})" if state["error"] else "")
        if state["run_id"]:
            beat = f"heartbeat {state['heartbeat_age_s']} s ago" if state["helper"] else "no heartbeats"
            text += (f"\n  run {state['run_id']} on {state['host']}, application {state['application_id']}, "
                     f"pid {state['pid']}\n  last committed batch {state['last_batch']}, {beat}"
                     f"\n  checkpoint {state['checkpoint']}")
        if state["version"]:
            text += f"\n  version {state['version']['hash']}: {state['version']['application']}"
        if state["detail"]:
            text += f"\n  {state['detail']}"
        text += "".join(f"\n  [yellow]warning[/]: {warning}" for warning in state["warnings"])
        last = state["watchdog"]["last_decision"]
        if last:
            text += (f"\n  watchdog: {last['action']} at {last['at']}, {state['watchdog']['restarts']} restart(s) in "
                     f"the window" + (f", next retry {state['watchdog']['next_retry_at']}"
                                      if state["watchdog"]["next_retry_at"] else ""))
        return payload, text

    _report(as_json, action)


def _conf_pairs(pairs: list[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"--conf {pair!r} is not KEY=VALUE", "e.g. --conf spark.sql.shuffle.partitions=4")
        conf[key] = value
    return conf


@option_group
class NewVersion:
    """The version a job is upgraded to: what differs from the job's own definition."""

    application: Annotated[str | None, typer.Option(help="The new version's application (default: the job's).")] = None
    args: Annotated[list[str] | None, typer.Option("--arg", help="An application argument of the new version "
                                                   "(repeat; default: the job's).")] = None
    conf: Annotated[list[str] | None, typer.Option("--conf", help="KEY=VALUE Spark conf set on top of the job's "
                                                   "(repeat).")] = None

    def of(self, job: StreamingJob) -> StreamingJob:
        from airflow_savepoints.jobs.workflows.upgrade import new_version

        return new_version(job, self.application, self.args or None, _conf_pairs(self.conf or []))


LogDir = Annotated[Path | None, typer.Option(envvar="SAVEPOINTS_LOG_DIR", help="Where the drivers' logs go.")]


@option_group
class UpgradePolicy:
    """How an upgrade carries the state over and judges the new version (see UpgradeRequest)."""

    mode: Annotated[str | None, typer.Option(help="savepoint, last-state or stateless (default: the job's "
                                                  "upgrade_mode).")] = None
    fallback_to_savepoint: Annotated[bool, typer.Option(help="If last-state is refused, use the stop savepoint.")] = False
    allow_stateless: Annotated[bool, typer.Option(help="Allow mode stateless (the new version gets EMPTY state).")] = False
    health_timeout: Annotated[float, typer.Option(help="Seconds for the new version to commit past the stop "
                                                       "batch.")] = 300
    rollback: Annotated[bool, typer.Option(help="Start the previous version again if the new one is not "
                                                "healthy.")] = True
    check_first: Annotated[bool | None, typer.Option("--check-first/--no-check-first", help="Run the new version "
                                                     "for one batch on a scratch copy of the state (noop sink) before "
                                                     "anything stops (default: in savepoint mode).")] = None
    check_timeout: Annotated[float, typer.Option(help="Seconds for the check's batch.")] = 300
    state_partitions: StatePartitionsOption = None


@app.command("upgrade")
@with_option_groups
def upgrade_job(
    job: JobArgument,
    *,
    version: NewVersion,
    policy: UpgradePolicy,
    log_dir: LogDir = None,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Upgrade running JOB to a new version; roll back automatically if it is not healthy."""
    def action():
        from airflow_savepoints.jobs.workflows.upgrade import UpgradeRequest, upgrade

        ctx = target.context(job)
        request = UpgradeRequest(version=version.of(ctx.job), **dataclasses.asdict(policy))
        result = upgrade(ctx, request, submit_for=_submit_for(ctx), log_dir=_log_dir(log_dir))
        return result, (f"[green]upgraded[/] job {job} to version {result['to_version']['hash']} ({result['mode']}): "
                        f"run {result['started']['run_id']}, batch {result['started']['first_batch']} committed")

    _report(as_json, action)


@app.command("check")
@with_option_groups
def check_job(
    job: JobArgument,
    *,
    version: NewVersion,
    timeout: Annotated[float, typer.Option(help="Seconds for the new version's driver to commit its batch (it gets "
                                                "60 s more to start).", callback=_finite_positive)] = 300,
    state_partitions: StatePartitionsOption = None,
    log_dir: LogDir = None,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Check a new version of running JOB before anything stops: one batch on a scratch copy of its state, noop sink."""
    def action():
        from airflow_savepoints.jobs.workflows.check import check_upgrade

        ctx = target.context(job)
        result = check_upgrade(ctx, version.of(ctx.job), submit_for=_submit_for(ctx), log_dir=_log_dir(log_dir),
                               timeout=timeout, state_partitions=state_partitions)
        return result, (f"[green]check passed[/]: version {result['to_version']['hash']} of job {job} committed batch "
                        f"{result['checked_batch']} on a copy of savepoint {result['savepoint']} (batch "
                        f"{result['restored_batch']}); run {result['run_id']} untouched")

    _report(as_json, action)


@app.command("inspect")
@with_option_groups
def inspect_job(
    job: JobArgument,
    *,
    pointer: Annotated[str | None, typer.Option("--from", help="A savepoint of the job (default: its newest).")] = None,
    operator: Annotated[int | None, typer.Option("--operator", min=0, help="Only this operator id.")] = None,
    sample: Annotated[int, typer.Option("--sample", min=0, max=1000, help="Rows of each store to show.")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds the application may take.", callback=_finite_positive)] = 3600,
    log_dir: LogDir = None,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Read a savepoint of JOB with Spark's state sources on the job's own cluster: a Spark application of the
    job (its master, conf and store connector) counts the state; this machine needs no pyspark."""
    @command
    def run(as_json: bool = False) -> None:
        from airflow_savepoints.jobs.workflows.inspect import inspect_on_the_job

        ctx = target.context(job)
        summary, facts = inspect_on_the_job(ctx, _submit_command(ctx), _log_dir(log_dir), pointer=pointer,
                                            operator=operator, sample=sample, timeout=timeout,
                                            progress=lambda line: err.print(line, markup=False, soft_wrap=True))
        if as_json:
            emit(True, {**summary.as_json(), "application": facts})
            return
        print_state_summary(summary)

    run(as_json=as_json)


@app.command("autoscale")
@with_option_groups
def autoscale_job(
    job: JobArgument,
    *,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only report the decision and its evidence (always "
                                          "so for mode: recommend).")] = False,
    log_dir: LogDir = None,
    target: JobTarget,
    as_json: JsonFlag = False,
) -> None:
    """Decide whether JOB needs more or fewer executors (or state partitions) from its metric series, report why,
    and with mode: act carry it out: a checked savepoint upgrade to the same version, rolled back on failure."""
    @command
    def run(as_json: bool = False) -> None:
        from airflow_savepoints.jobs.workflows.autoscale import evaluate

        ctx = target.context(job)
        result = evaluate(ctx, dry_run=dry_run, submit_for=_submit_for(ctx), log_dir=_log_dir(log_dir))
        colour = {"acted": "green", "recommended": "cyan", "held": "yellow"}.get(result["outcome"], "red")
        current, wanted = result["current"], result["target"]
        text = (f"job {job}: {result['action']} ({result['reason']}, [{colour}]{result['outcome']}[/]): "
                f"{result['message']}\n  now {current['executors']} executor(s), {current['cores']} core(s), state "
                f"partitions {current['partitions']}")
        if result["action"] != "hold":
            text += (f"\n  target {wanted['executors']} executor(s), {wanted['cores']} core(s), state partitions "
                     f"{wanted['partitions']}" + (f"; conf {result['spark_conf']}" if result["spark_conf"] else ""))
        if result["upgrade"]:
            text += (f"\n  upgraded to version {result['upgrade']['to_version']}: run {result['upgrade']['run_id']}, "
                     f"batch {result['upgrade']['first_batch']} committed")
        evidence = result["evidence"]
        if evidence:
            text += "\n  evidence: " + ", ".join(f"{key} {value}" for key, value in evidence.items() if value is not None)
        text += "".join(f"\n  [yellow]warning[/]: {warning}" for warning in result["warnings"])
        emit(as_json, result, text)
        if result["error"]:  # rolled back or failed: recorded, printed, and a non-zero exit
            if not as_json:
                err.print(f"[bold red]error:[/] {escape(result['error']['message'])}")
                err.print(f"[yellow]how to fix:[/] {escape(result['error']['hint'] or '')}")
            raise typer.Exit(1)

    run(as_json=as_json)
