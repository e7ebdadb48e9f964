"""``airflow-savepoints``: take, list, show, verify, restore, inspect and dispose savepoints from a terminal.

Every command takes ``--json``: its answer, an error and a usage error are then one JSON document on
stdout. Exit status: 0 done, 1 an error (what went wrong and how to fix it), 2 a usage error (bad or
missing option). Storage is reached as the operators reach it (``--conn-id``, see cli/storage.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import threading
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # recent typer carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer on click
    from click.exceptions import UsageError

from airflow_savepoints import __version__, core
from airflow_savepoints.cli.options import (
    MaxAgeOption,
    SkipMissingInputOption,
    StatePartitionsOption,
    option_group,
    with_option_groups,
)
from airflow_savepoints.cli.output import command as _command
from airflow_savepoints.cli.output import emit as _emit
from airflow_savepoints.cli.output import err, escape, human_size, out, print_state_summary
from airflow_savepoints.cli.storage import open_root, storage_options
from airflow_savepoints.core.names import CATALOG_FILE
from airflow_savepoints.errors import MissingBackendError
from airflow_savepoints.sinks import KINDS

# Each command imports what it uses (`core` on first use, `job`'s commands when `job` is named, rich when text
# is printed): a command pays for its own modules only. tests/unit/cli/test_import_budget.py holds each to it.

# Command groups made when first named (cli/job.py and what it imports are not every command's start): the
# module whose ``app`` it is, and the command it is listed after in ``--help``.
LAZY_GROUPS = {"job": ("airflow_savepoints.cli.job", "catalog")}


class JsonAwareGroup(TyperGroup):
    """With ``--json`` anywhere on the command line, a usage error is a JSON document too (exit 2).
    The groups of LAZY_GROUPS are made with the group (``app`` has every command), or, in the console
    script's group (``lazy_groups``), when a command line names them."""

    lazy_groups = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.lazy_groups:
            for name in LAZY_GROUPS:
                self.get_command(None, name)

    def get_command(self, ctx, cmd_name):
        if cmd_name in LAZY_GROUPS and cmd_name not in self.commands:
            import importlib

            module, after = LAZY_GROUPS[cmd_name]
            group = typer.main.get_group(importlib.import_module(module).app)
            names = list(self.commands)  # listed where it was registered: after ``after``
            at = names.index(after) + 1 if after in names else len(names)
            self.commands = {**{n: self.commands[n] for n in names[:at]}, cmd_name: group,
                             **{n: self.commands[n] for n in names[at:]}}
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        names = super().list_commands(ctx)
        for name, (_, after) in LAZY_GROUPS.items():
            if name not in names:
                names.insert(names.index(after) + 1 if after in names else len(names), name)
        return names

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = list(sys.argv[1:] if args is None else args)
        if "--json" not in argv or not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as exc:
            command = exc.ctx.command_path.split(" ")[1:] if exc.ctx else []
            hint = " ".join(["see: airflow-savepoints", *command, "--help"])
            sys.stdout.write(json.dumps({"error": {"code": "usage_error", "message": exc.format_message(),
                                                   "hint": hint}}, indent=2) + "\n")
            sys.exit(exc.exit_code)
        except typer.Abort:
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


class ConsoleGroup(JsonAwareGroup):
    """The console script's group: a lazy group is imported when named (``only_the_command_named``)."""

    lazy_groups = True


app = typer.Typer(
    name="airflow-savepoints",
    cls=JsonAwareGroup,
    help="Flink-style savepoints for Spark Structured Streaming checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[savepoints]" is an Airflow config section, not markup
)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text (errors too).")]
QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
DirOption = Annotated[
    str | None,
    typer.Option("--dir", help="Savepoint directory (default: the connection's host, else [savepoints] savepoint_dir "
                               "from AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR or airflow.cfg)."),
]
ConnOption = Annotated[
    str | None,
    typer.Option("--conn-id", help="Airflow connection (type savepoints) giving the directory and credentials, as the "
                                   "operators use it (default: [savepoints] conn_id, else savepoints_default when "
                                   "AIRFLOW_CONN_SAVEPOINTS_DEFAULT defines it; '' for none)."),
]


def Table(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - rich's Table, imported when a table is printed
    from rich.table import Table as RichTable

    return RichTable(*args, **kwargs)


def validate_job_name(name: str) -> str:
    """The core's check, imported when a command runs (pydantic's models are not needed to start)."""
    from airflow_savepoints.core.models import validate_job_name as validate

    return validate(name)


class TriggerType(StrEnum):
    manual = "manual"
    periodic = "periodic"
    stop = "stop"  # of a job stopped by other means (YARN, Kubernetes): see docs/airflow.md


@contextlib.contextmanager
def progress_bar(action: str, *, enabled: bool):
    """A progress bar (bytes) fed by the core's on_event callback; only when stdout is a terminal."""
    if not (enabled and out.is_terminal):
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (TextColumn(action), BarColumn(), DownloadColumn(), TextColumn("{task.fields[files]} files"),
               TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=out.rich, transient=True) as progress:
        task = progress.add_task(action, total=None, files="")
        counted = {"done": 0, "total": 0}
        lock = threading.Lock()  # files finish on the copying threads

        def on_event(event: str, data: dict[str, Any]) -> None:
            with lock:
                if event == "planned":  # again on a retry: start over
                    counted.update(done=0, total=data["files"])
                    progress.reset(task, total=data["bytes"], files=f"0/{data['files']}")
                elif event == "file_done":
                    counted["done"] += 1
                    progress.update(task, advance=data["bytes"], files=f"{counted['done']}/{counted['total']}")

        yield on_event


def _human_age(created: datetime) -> str:
    seconds = int((datetime.now(UTC) - created).total_seconds())
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds // span}{unit}"
    return f"{max(seconds, 0)}s"


@option_group
class TriggerOptions:
    """What kind of savepoint is asked for, and how it is copied."""

    savepoint_type: Annotated[TriggerType, typer.Option(
        "--type", help="manual (kept by retention), periodic (subject to retention) or stop (of a job stopped by "
                       "other means).")] = TriggerType.manual
    reason: Annotated[str | None, typer.Option(help="Why it is taken (kept in the manifest).")] = None
    request_id: Annotated[str | None, typer.Option(help="Idempotency key: a retry returns the same savepoint.")] = None
    max_attempts: Annotated[int, typer.Option(min=1, max=100, help="Attempts when the checkpoint moves during the "
                                                                   "copy.")] = 5
    parallelism: Annotated[int | None, typer.Option(
        min=1, max=256, help="Files copied at once (default: 32, or 8 where files are uploaded through this "
                             "machine to an object store).")] = None
    retired_checkpoint: Annotated[bool, typer.Option(
        "--retired-checkpoint", help="CHECKPOINT is one the job has left (its recorded run writes another): take it "
                                     "anyway; such a savepoint is never a restore default.")] = False


@app.command()
@_command
@with_option_groups
def trigger(
    checkpoint: Annotated[str, typer.Argument(help="The live checkpoint location of the query.")],
    job: Annotated[str, typer.Option("--job", help="Job name: the folder of its savepoints.")],
    *,
    savepoint_dir: DirOption = None,
    conn_id: ConnOption = None,
    asked: TriggerOptions,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Take a savepoint of the newest committed batch of CHECKPOINT (of a job's live query: `job savepoint`)."""
    from airflow_savepoints.jobs.description.lease import running_spark_version
    from airflow_savepoints.jobs.description.record import refuse_left_checkpoint

    validate_job_name(job)  # a bad name is reported before the storage is opened
    root = open_root(conn_id, savepoint_dir)
    refuse_left_checkpoint(root.child(job), job, checkpoint, retired=asked.retired_checkpoint)
    with progress_bar("savepoint", enabled=not (quiet or as_json)) as on_event:
        info = core.take_savepoint(
            checkpoint, job, savepoint_dir=root, savepoint_type=asked.savepoint_type.value, reason=asked.reason,
            request_id=asked.request_id, max_attempts=asked.max_attempts, parallelism=asked.parallelism,
            on_event=on_event, spark_version=running_spark_version(root, job, checkpoint),
            retired_checkpoint=asked.retired_checkpoint,
        )
    s = info.summary()
    _emit(as_json, s, f"[green]savepoint completed[/]: {s['pointer']}\n"
                      f"  batch {s['batch_id']}, {s['files']} files, {human_size(s['bytes'])}, query {s['query_id']}")


@app.command(name="list")
@_command
def list_(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    savepoint_dir: DirOption = None,
    conn_id: ConnOption = None,
    as_json: JsonFlag = False,
) -> None:
    """List a job's savepoints from its catalog, oldest first (completed, in progress, failed, disposing)."""
    root = open_root(conn_id, savepoint_dir, must_exist=True)
    records = core.list_savepoints(root, job)
    rows = [r.summary() for r in records]
    if as_json:
        _emit(True, {"job": job, "savepoint_dir": root.url, "savepoints": rows})
        return
    if not rows:
        out.print(f"no savepoints of job '{job}' in {root.url}")
        return
    from rich import box

    # fits an 80-column terminal: narrow, the ids lose their common "savepoint-" prefix, type and state are cut,
    # the reason takes what is left; --json has every value in full
    narrow = out.width < 100
    table = Table(title=f"savepoints of {job} in {root.child(job).url}/", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True,
                  caption="ids without savepoint-; --json: every value in full" if narrow else None, caption_justify="left")
    table.add_column("savepoint", no_wrap=True, min_width=19 if narrow else 29)
    table.add_column("type", no_wrap=True, overflow="ellipsis", max_width=10 if narrow else None)
    table.add_column("state", no_wrap=True, overflow="ellipsis", max_width=9 if narrow else None)
    table.add_column("batch", no_wrap=True, justify="right", min_width=5)
    table.add_column("size", no_wrap=True, justify="right", min_width=9)
    table.add_column("age", no_wrap=True, justify="right", min_width=4)
    table.add_column("reason", no_wrap=True, overflow="ellipsis", max_width=max(10, out.width - 66) if narrow else 40)
    versions = any(r.job_version_hash for r in records)  # a column only when a savepoint knows its job version
    if versions:
        table.add_column("version", no_wrap=True)  # the job version's short hash: whole, to compare at a glance
    for record in records:
        version = (record.job_version_hash or "",) if versions else ()
        table.add_row(record.savepoint_id.removeprefix("savepoint-") if narrow else record.savepoint_id,
                      record.type.value, record.state.value, "" if record.batch_id is None else str(record.batch_id),
                      "" if record.bytes is None else human_size(record.bytes), _human_age(record.created_at),
                      record.reason or "", *version)
    out.print(table)


@app.command()
@_command
def show(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    conn_id: ConnOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a savepoint's manifest."""
    from airflow_savepoints.core.manifest import resolve_savepoint

    location, manifest = resolve_savepoint(pointer, storage_options(conn_id))
    if as_json:
        _emit(True, {"pointer": location.url, "manifest": manifest.model_dump(mode="json")})
        return
    summary = core.SavepointInfo(pointer=location.url, manifest=manifest).summary()
    humane = {"bytes": f"{summary['bytes']} ({human_size(summary['bytes'])})",
              "created_at": f"{summary['created_at']} ({_human_age(manifest.created_at)} ago)"}
    for key, value in summary.items():
        if key != "conflict":  # the catalog's finding; `list` shows it
            out.print(f"{key:26} {escape(str(humane.get(key, value)))}")
    out.print(f"{'checkpoint':26} {escape(manifest.checkpoint)}")
    out.print(f"{'state store':26} {escape(str(manifest.state_store.model_dump()))}")


@app.command()
@_command
def verify(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    conn_id: ConnOption = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Check every file of a savepoint against the sizes and checksums in its manifest."""
    with progress_bar("verify", enabled=not (quiet or as_json)) as on_event:
        location, manifest = core.verify_savepoint(pointer, storage_options(conn_id), on_event=on_event)
    _emit(as_json, {"pointer": location.url, "ok": True, "files": len(manifest.files), "bytes": manifest.total_bytes},
          f"[green]ok[/]: {location.url}: {len(manifest.files)} files, {human_size(manifest.total_bytes)} verified")


SinkKind = StrEnum("SinkKind", {k: k for k in KINDS})


@option_group
class RestoreChecks:
    """What a restore checks before it copies anything."""

    sink_path: Annotated[str | None, typer.Option(
        help="The job's sink location (a file sink's output path, a Delta table): refuse if it is past the savepoint.")] = None
    sink_kind: Annotated[SinkKind | None, typer.Option(
        help="What the sink is (with no kind, --sink-path is a file sink, or Delta if it holds _delta_log).")] = None
    sink_app_id: Annotated[str | None, typer.Option(
        help="A foreach_batch sink writing Delta with txnAppId: that appId (query_id: the query id).")] = None
    rerun_until: Annotated[int | None, typer.Option(
        min=0, help="The job's last committed batch M: the restored run runs N+1..M again.")] = None
    allow_repeats: Annotated[bool, typer.Option(
        help="Restore though an at-least-once sink (kafka, foreach, foreach_batch) gets batches N+1..M again.")] = False
    max_age: MaxAgeOption = None
    skip_missing_input: SkipMissingInputOption = False
    kafka_bootstrap_servers: Annotated[str | None, typer.Option(
        help="The brokers of the Kafka topics the savepoint resumes: refuse if records it starts at were deleted.")] = None


@app.command()
@_command
@with_option_groups
def restore(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    to: Annotated[str, typer.Option("--to", help="A new, empty checkpoint location.")],
    *,
    new_query_id: Annotated[bool, typer.Option(help="Give the restored query a new id (a fork).")] = False,
    reprocess: Annotated[bool, typer.Option(help=(
        "Delta: give the restored query a new id so Delta writes the batches it recorded again; only once their rows "
        "are gone from the table (a table RESTORE)."))] = False,
    state_partitions: StatePartitionsOption = None,
    many_state_partitions: Annotated[bool, typer.Option(
        "--many-state-partitions", help="Allow --state-partitions above 10,000.")] = False,
    checks: RestoreChecks,
    conn_id: ConnOption = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Restore a savepoint into a new checkpoint location (the savepoint is not changed)."""
    with progress_bar("restore", enabled=not (quiet or as_json)) as bar:
        def on_event(event: str, data: dict[str, Any]) -> None:
            if bar is not None:
                bar(event, data)
            if quiet or (bar is not None and event == "planned"):
                return
            if event == "planned":  # one line per step on stderr (stdout keeps the answer alone)
                err.print(f"restore: copying {data['files']} files ({human_size(data['bytes'])})", highlight=False)
            elif event == "rescaling":
                err.print(f"restore: Spark rewrites the state into {data['partitions']} partitions", highlight=False)

        result = core.restore_savepoint(pointer, to, new_query_id=new_query_id, reprocess=reprocess,
                                        **{**dataclasses.asdict(checks), "sink_kind": checks.sink_kind and checks.sink_kind.value},
                                        state_partitions=state_partitions, many_state_partitions=many_state_partitions,
                                        storage_options=storage_options(conn_id),
                                        on_event=on_event)
    confs = " ".join(f"--conf {k}={v}" for k, v in result.spark_conf_to_set.items())
    scale = ""
    if state_partitions is not None:
        counts = ", ".join(f"operator {op}: {result.partitions_before.get(op)} -> {n}" for op, n in result.partitions_after.items())
        scale = (f"\n  state rescaled ({counts}); Spark's repartition batch {result.repartition_batch_id}" if result.rescaled
                 else f"\n  the state already has {state_partitions} partitions: restored as is")
    _emit(as_json, result.model_dump(mode="json"),
          f"[green]restored[/] batch {result.batch_id} into {result.checkpoint} (query {result.query_id}){scale}\n"
          f"  sink: {escape(result.sink.detail)}\n"
          f"  start the query with checkpointLocation={result.checkpoint} and {confs}")


class ReadVia(StrEnum):
    auto = "auto"
    in_place = "in-place"
    copy = "copy"


@app.command(name="inspect")
@_command
def inspect_(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    operator: Annotated[int | None, typer.Option("--operator", min=0, help="Only this operator id.")] = None,
    sample: Annotated[int, typer.Option("--sample", min=0, max=1000, help="Rows of each store to show.")] = 0,
    read_via: Annotated[ReadVia, typer.Option(
        "--read-via", help="auto: a local savepoint in place, a remote one through a local temporary copy; in-place: "
                           "give Spark the store's URL (a session with its connector).")] = ReadVia.auto,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show Spark's own log (its warnings and progress).")] = False,
    conn_id: ConnOption = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Read a savepoint's state with Spark's state sources (needs the [spark] extra); nothing is written into it.
    A store Spark cannot read is an error (``state_unreadable``, Spark's error class and message as its cause)."""
    import psutil

    from airflow_savepoints.core.state_reader import inspect_savepoint

    # seconds since this process started (Python's own start and the imports included): the time a user waits
    started = time.monotonic() - max(time.time() - psutil.Process().create_time(), 0.0)

    def progress(line: str) -> None:  # on stderr: stdout keeps the answer alone
        if not quiet:
            err.print(f"[dim]{time.monotonic() - started:5.1f}s[/] {escape(line)}", highlight=False, soft_wrap=True)

    summary = inspect_savepoint(pointer, operator=operator, sample=sample, storage_options=storage_options(conn_id),
                                read_via=read_via.value.replace("-", "_"), progress=progress, verbose=verbose, strict=True)
    if as_json:
        _emit(True, summary.as_json())
        return
    print_state_summary(summary)


@app.command()
@_command
def offsets(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    conn_id: ConnOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Print each source's committed position at the savepoint's batch (Kafka as startingOffsets takes it)."""
    from airflow_savepoints.core.source_positions import source_positions

    positions = source_positions(pointer, storage_options(conn_id))
    if as_json:
        _emit(True, positions.as_json())
        return
    out.print(f"sources of {positions.savepoint_id} at batch {positions.batch_id} (query {positions.query_id})")
    for source in positions.sources:
        if source.kind == "kafka":
            text = f"startingOffsets={source.starting_offsets}"
        elif source.kind == "file":
            text = f"{len(source.files)} files processed (file source log batch {source.log_offset})"
        else:
            text = json.dumps(source.offset)
        out.print(f"  source {escape(source.source)} ({source.kind}): {escape(text)}")


@app.command()
@_command
def dispose(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    savepoint_dir: DirOption = None,
    conn_id: ConnOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete a savepoint (only a complete savepoint inside the savepoint directory)."""
    root = open_root(conn_id, savepoint_dir, required=False)
    info = core.dispose_savepoint(pointer, savepoint_dir=root.url if root else None,
                                  storage_options=root.storage_options if root else storage_options(conn_id),
                                  by="airflow-savepoints dispose (CLI)")
    _emit(as_json, {"disposed": info.pointer, "savepoint_id": info.manifest.savepoint_id},
          f"disposed {info.pointer}")


@app.command()
@_command
def status(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    savepoint_dir: DirOption = None,
    conn_id: ConnOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show whether the job's recorded run is alive, its application id and its last committed batch."""
    from airflow_savepoints.jobs.description.record import read_run
    from airflow_savepoints.jobs.workflows.run import job_status

    job_folder = open_root(conn_id, savepoint_dir).child(validate_job_name(job))
    state = job_status(job, job_folder).model_dump(mode="json")
    run = read_run(job_folder)
    state.update(checkpoint=run.checkpoint if run else None, log_file=run.log_file if run else None)
    if run is None:
        text = f"job {job}: no run recorded in {job_folder.url} (start it with restore_from_savepoint)"
    else:
        at = (f"{state['last_progress_at']} ({_human_age(datetime.fromisoformat(state['last_progress_at']))} ago)"
              if state["last_progress_at"] else "never")
        text = (f"job {job}: {'[green]running[/]' if state['running'] else '[red]not running[/]'} "
                f"(pid {state['pid']}, application {state['application_id'] or 'unknown'})\n"
                f"  checkpoint {state['checkpoint']}\n  last committed batch {state['last_committed_batch']} at {at}\n"
                f"  log {state['log_file']}")
    _emit(as_json, state, text)


@option_group
class PolicyOptions:
    """The retention policy; what is not given comes from the [savepoints] configuration."""

    max_periodic: Annotated[int | None, typer.Option(help="Periodic savepoints to keep (default: [savepoints] "
                                                          "max_periodic_savepoints, else 10).")] = None
    max_age: Annotated[str | None, typer.Option(help="Dispose periodic savepoints older than this (7d, 12h; 'none': no "
                                                     "limit; default: [savepoints] max_savepoint_age, else 7d).")] = None
    orphan_timeout: Annotated[str | None, typer.Option(help="Remove locations without _metadata older than this "
                                                            "(default: [savepoints] orphan_timeout, else 1h).")] = None
    max_manual: Annotated[str | None, typer.Option(help="Manual, stop and retained-checkpoint savepoints to keep "
                                                        "('none': no limit; default: [savepoints] max_manual_savepoints, "
                                                        "else none).")] = None


@app.command()
@_command
@with_option_groups
def retain(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    *,
    savepoint_dir: DirOption = None,
    conn_id: ConnOption = None,
    given: PolicyOptions,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Apply the retention policy to a job's savepoints (manual and stop savepoints only beyond --max-manual)."""
    from airflow_savepoints.core.retention import RetentionPolicy
    from airflow_savepoints.core.retention import retain as run_retention

    policy = RetentionPolicy.resolve(**dataclasses.asdict(given))
    report = run_retention(open_root(conn_id, savepoint_dir, must_exist=True), job, policy, dry_run=dry_run)
    summary = report.summary()
    if as_json:
        _emit(True, summary)
    else:
        table = Table(title=f"retention of {job} in {report.plan.savepoint_dir}" + (" (dry run: nothing changed)" if dry_run else ""))
        for column in ("savepoint", "type", "state", "batch", "action", "why"):
            table.add_column(column, overflow="fold")
        for d in report.plan.decisions:
            colour = "green" if d.action == "keep" else "red"
            table.add_row(d.savepoint_id, d.type or "", d.state, "" if d.batch_id is None else str(d.batch_id),
                          f"[{colour}]{d.action.value}[/]", d.reason)
        out.print(table)
        verb = "would remove" if dry_run else "removed"
        out.print(f"{verb} {len(report.plan.of('dispose'))} savepoints and {len(report.plan.of('remove_orphan'))} orphans; "
                  f"kept {len(report.plan.of('keep'))}")
        for problem in report.skipped + report.failed:
            err.print(f"[yellow]{problem['savepoint_id']}[/]: {problem['error']}: {escape(problem['message'])}")
    if report.failed:
        raise typer.Exit(1)


@app.command()
@_command
def catalog(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    savepoint_dir: DirOption = None,
    conn_id: ConnOption = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Recreate the catalog from the _metadata files.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show (or --rebuild) the job's savepoint catalog; _metadata files are the source of truth."""
    from airflow_savepoints.core.catalog import Catalog

    store = open_root(conn_id, savepoint_dir, must_exist=True).child(validate_job_name(job))
    document = Catalog(store, job).rebuild() if rebuild else Catalog(store, job).load()
    states: dict[str, int] = {}
    for record in document.records.values():
        states[record.state.value] = states.get(record.state.value, 0) + 1
    payload = {"job": job, "catalog": store.url_of(CATALOG_FILE), "rebuilt": rebuild, "records": len(document.records),
               "states": states, "pins": [p.model_dump(mode="json") for p in document.pins.values()]}
    _emit(as_json, payload, f"{'rebuilt ' if rebuild else ''}{payload['catalog']}: {len(document.records)} records "
                            f"{states}, {len(document.pins)} pins")


@app.command()
def version(as_json: JsonFlag = False) -> None:
    """Print the version."""
    _emit(as_json, {"version": __version__}, __version__)


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"airflow-savepoints {__version__}\n")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print the version and exit.")] = False,
) -> None:
    """Flink-style savepoints for Spark Structured Streaming checkpoints."""


@app.command()
@_command
def demo(
    workdir: Annotated[Path, typer.Option(help="Work folder (emptied first): Airflow home, DAGs, input, output, "
                                               "checkpoints, savepoints.")] = Path("demo-run"),
    rounds: Annotated[int, typer.Option(min=1, max=100, help="Runs of periodic_savepoints.")] = 4,
    interval: Annotated[float, typer.Option(min=0, help="Seconds between them.")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="The demo's lines on stderr; one JSON document "
                                                         "(ok, exit_code, workdir) on stdout at the end.")] = False,
    console: Annotated[bool, typer.Option("--console", help="Serve the savepoints console on the demo in WORKDIR "
                                                            "(run it first if there is none) until Ctrl-C.")] = False,
    port: Annotated[int, typer.Option(min=1, max=65535, help="The console's port (with --console).")] = 8080,
) -> None:
    """Run the end-to-end demo: the example DAGs on a local Airflow and Spark (needs the [spark] extra)."""
    from importlib.metadata import PackageNotFoundError, distribution

    if console and (workdir / "savepoints").is_dir():
        from airflow_savepoints.demo.console import serve

        raise typer.Exit(serve(workdir, port))

    try:
        distribution("pyspark")  # the full pyspark (with Spark's jars), not only the Spark provider's pyspark-client
    except PackageNotFoundError:
        raise MissingBackendError("the demo runs Spark locally, and pyspark (with Spark's jars) is not installed",
                                  "pip install 'airflow-savepoints[spark]' (and Java 17 or newer)") from None
    from airflow_savepoints.demo.__main__ import console as demo_console
    from airflow_savepoints.demo.__main__ import run as run_demo

    if as_json:
        demo_console.file = sys.stderr
    code = run_demo(workdir.resolve(), rounds, interval)
    _emit(as_json, {"ok": code == 0, "exit_code": code, "workdir": str(workdir.resolve())})
    if console and code == 0:
        from airflow_savepoints.demo.console import serve

        code = serve(workdir, port)
    raise typer.Exit(code)


dags_app = typer.Typer(help="The example DAGs shipped in the package.", no_args_is_help=True)
app.add_typer(dags_app, name="dags")


@dags_app.command("install")
@_command
def dags_install(
    folder: Annotated[Path, typer.Argument(help="Your Airflow DAGs folder ([core] dags_folder).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace files of the same names.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Copy the example DAGs and their jobs.yaml into FOLDER."""
    from airflow_savepoints.demo import install_example_dags

    written = install_example_dags(folder, overwrite=overwrite)
    _emit(as_json, {"folder": str(folder.expanduser().resolve()), "files": [str(p) for p in written]},
          f"copied {len(written)} files into {folder.expanduser().resolve()}: " + ", ".join(p.name for p in written)
          + "\nedit jobs.yaml to describe your streaming jobs")


def only_the_command_named(argv: list[str]) -> typer.Typer:
    """``app`` for the console script: with only the command ``argv`` names (its first word that is not an
    option), since a process runs one command and typer builds every registered command's options before it
    parses; every command when none is named (``--help``, ``--version``, a typo: the full list answers). Its
    group is a ``ConsoleGroup``: ``job`` (cli/job.py and what it imports) is made only when named."""
    import copy

    name = next((word for word in argv if not word.startswith("-")), None)
    commands = [c for c in app.registered_commands
                if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    console, console.info = copy.copy(app), copy.copy(app.info)
    console.info.cls = ConsoleGroup
    if name in LAZY_GROUPS or commands or groups:
        console.registered_commands, console.registered_groups = commands, groups
    return console


def main() -> None:  # console script entry point
    from airflow_savepoints.cli import storage

    storage.freeze_after_open = True
    only_the_command_named(sys.argv[1:])()


if __name__ == "__main__":
    main()
