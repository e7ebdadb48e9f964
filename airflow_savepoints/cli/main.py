"""``airflow-savepoints``: take, list, show, verify, restore and dispose savepoints from a terminal.

Every command takes ``--json``. Errors print what went wrong and how to fix it, and exit 1
(usage errors exit 2). Storage options (S3 endpoint, keys) come from fsspec's configuration
(``FSSPEC_S3_ENDPOINT_URL``, ``~/.config/fsspec``) or the usual environment variables.
"""

from __future__ import annotations

import functools
import json
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from airflow_savepoints import __version__, core
from airflow_savepoints.cli.job import app as job_commands
from airflow_savepoints.core.restore import verify_savepoint
from airflow_savepoints.core.settings import resolve_savepoint_dir
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.storage import Store

app = typer.Typer(
    name="airflow-savepoints",
    help="Flink-style savepoints for Spark Structured Streaming checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)  # pipes and CI logs: no truncation

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text.")]
DirOption = Annotated[
    str | None,
    typer.Option("--dir", help="Savepoint directory (default: AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR or airflow.cfg)."),
]


class TriggerType(StrEnum):
    manual = "manual"
    periodic = "periodic"
    stop = "stop"  # of a job stopped by other means (YARN, Kubernetes): see docs/airflow.md


def _emit(as_json: bool, payload: Any, text: str | None = None) -> None:
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    elif text is not None:
        out.print(text)


def _command(fn):
    """Run a command; a SavepointError becomes a clear message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except SavepointError as exc:
            if as_json:
                sys.stdout.write(json.dumps({"error": exc.to_dict()}, indent=2) + "\n")
            else:
                err.print(f"[bold red]error:[/] {exc.message}")
                if exc.hint:
                    err.print(f"[yellow]how to fix:[/] {exc.hint}")
            raise typer.Exit(1) from None

    return wrapper


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _human_age(created: datetime) -> str:
    seconds = int((datetime.now(UTC) - created).total_seconds())
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds // span}{unit}"
    return f"{max(seconds, 0)}s"


@app.command()
@_command
def trigger(
    checkpoint: Annotated[str, typer.Argument(help="The live checkpoint location of the query.")],
    job: Annotated[str, typer.Option("--job", help="Job name: the folder of its savepoints.")],
    savepoint_dir: DirOption = None,
    savepoint_type: Annotated[TriggerType, typer.Option("--type")] = TriggerType.manual,
    reason: Annotated[str | None, typer.Option(help="Why it is taken (kept in the manifest).")] = None,
    request_id: Annotated[str | None, typer.Option(help="Idempotency key: a retry returns the same savepoint.")] = None,
    max_attempts: Annotated[int, typer.Option(min=1, max=100)] = 5,
    parallelism: Annotated[int, typer.Option(min=1, max=256)] = 8,
    as_json: JsonFlag = False,
) -> None:
    """Take a savepoint of the newest committed batch of CHECKPOINT."""
    info = core.take_savepoint(
        checkpoint, job, savepoint_dir=savepoint_dir, savepoint_type=savepoint_type.value, reason=reason,
        request_id=request_id, max_attempts=max_attempts, parallelism=parallelism,
    )
    s = info.summary()
    _emit(as_json, s, f"[green]savepoint completed[/]: {s['pointer']}\n"
                      f"  batch {s['batch_id']}, {s['files']} files, {_human_size(s['bytes'])}, query {s['query_id']}")


@app.command(name="list")
@_command
def list_(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    savepoint_dir: DirOption = None,
    as_json: JsonFlag = False,
) -> None:
    """List a job's savepoints from its catalog, oldest first (completed, in progress, failed, disposing)."""
    root = Store(resolve_savepoint_dir(savepoint_dir))
    records = core.list_savepoints(root, job)
    rows = [r.summary() for r in records]
    if as_json:
        _emit(True, {"job": job, "savepoint_dir": root.url, "savepoints": rows})
        return
    if not rows:
        out.print(f"no savepoints of job '{job}' in {root.url}")
        return
    table = Table(title=f"savepoints of {job} in {root.url}")
    for column in ("type", "reason", "batch", "size", "age", "state"):
        table.add_column(column, overflow="fold")
    table.add_column("pointer", no_wrap=True)  # whole, to copy and paste
    for record in records:
        table.add_row(record.type.value, record.reason or "", "" if record.batch_id is None else str(record.batch_id),
                      "" if record.bytes is None else _human_size(record.bytes), _human_age(record.created_at),
                      record.state.value, record.pointer)
    out.print(table)


@app.command()
@_command
def show(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    as_json: JsonFlag = False,
) -> None:
    """Show a savepoint's manifest."""
    location, manifest = core.resolve_pointer(pointer)
    if as_json:
        _emit(True, {"pointer": location.url, "manifest": manifest.model_dump(mode="json")})
        return
    summary = core.SavepointInfo(pointer=location.url, manifest=manifest).summary()
    for key, value in summary.items():
        out.print(f"{key:26} {value}")
    out.print(f"{'checkpoint':26} {manifest.checkpoint}")
    out.print(f"{'state store':26} {manifest.state_store.model_dump()}")


@app.command()
@_command
def verify(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    as_json: JsonFlag = False,
) -> None:
    """Check every file of a savepoint against the sizes and checksums in its manifest."""
    location, manifest = verify_savepoint(pointer)
    _emit(as_json, {"pointer": location.url, "ok": True, "files": len(manifest.files), "bytes": manifest.total_bytes},
          f"[green]ok[/]: {location.url}: {len(manifest.files)} files, {_human_size(manifest.total_bytes)} verified")


@app.command()
@_command
def restore(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    to: Annotated[str, typer.Option("--to", help="A new, empty checkpoint location.")],
    new_query_id: Annotated[bool, typer.Option(help="Give the restored query a new id (a fork).")] = False,
    sink_path: Annotated[
        str | None, typer.Option(help="The job's file sink output path: refuse if it is past the savepoint.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Restore a savepoint into a new checkpoint location (the savepoint is not changed)."""
    result = core.restore_savepoint(pointer, to, new_query_id=new_query_id, sink_path=sink_path)
    confs = " ".join(f"--conf {k}={v}" for k, v in result.spark_conf_to_set.items())
    _emit(as_json, result.model_dump(mode="json"),
          f"[green]restored[/] batch {result.batch_id} into {result.checkpoint} (query {result.query_id})\n"
          f"  start the query with checkpointLocation={result.checkpoint} and {confs}")


@app.command()
@_command
def dispose(
    pointer: Annotated[str, typer.Argument(help="A savepoint directory or its _metadata file.")],
    savepoint_dir: DirOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete a savepoint (only a complete savepoint inside the savepoint directory)."""
    info = core.dispose_savepoint(pointer, savepoint_dir=savepoint_dir)
    _emit(as_json, {"disposed": info.pointer, "savepoint_id": info.manifest.savepoint_id},
          f"disposed {info.pointer}")


@app.command()
@_command
def status(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    savepoint_dir: DirOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show whether the job's recorded run is alive, its application id and its last committed batch."""
    from airflow_savepoints.core.models import validate_job_name
    from airflow_savepoints.jobs.launcher import job_status, read_run

    job_folder = Store(resolve_savepoint_dir(savepoint_dir)).child(validate_job_name(job))
    state = job_status(job, job_folder).model_dump(mode="json")
    run = read_run(job_folder)
    state.update(checkpoint=run.checkpoint if run else None, log_file=run.log_file if run else None)
    if run is None:
        text = f"job {job}: no run recorded in {job_folder.url} (start it with restore_from_savepoint)"
    else:
        at = state["last_progress_at"] or "never"
        text = (f"job {job}: {'[green]running[/]' if state['running'] else '[red]not running[/]'} "
                f"(pid {state['pid']}, application {state['application_id'] or 'unknown'})\n"
                f"  checkpoint {state['checkpoint']}\n  last committed batch {state['last_committed_batch']} at {at}\n"
                f"  log {state['log_file']}")
    _emit(as_json, state, text)


@app.command()
@_command
def retain(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    savepoint_dir: DirOption = None,
    max_periodic: Annotated[int | None, typer.Option(help="Periodic savepoints to keep (default: [savepoints] "
                                                          "max_periodic_savepoints, else 10).")] = None,
    max_age: Annotated[str | None, typer.Option(help="Dispose periodic savepoints older than this (7d, 12h; "
                                                     "'none': no limit; default: [savepoints] max_savepoint_age, else 7d).")] = None,
    orphan_timeout: Annotated[str | None, typer.Option(help="Remove locations without _metadata older than this "
                                                            "(default: [savepoints] orphan_timeout, else 1h).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Apply the retention policy to a job's savepoints (manual and stop savepoints are always kept)."""
    from airflow_savepoints.core.retention import RetentionPolicy
    from airflow_savepoints.core.retention import retain as run_retention

    policy = RetentionPolicy.resolve(max_periodic, max_age, orphan_timeout)
    report = run_retention(Store(resolve_savepoint_dir(savepoint_dir)), job, policy, dry_run=dry_run)
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
            err.print(f"[yellow]{problem['savepoint_id']}[/]: {problem['error']}: {problem['message']}")
    if report.failed:
        raise typer.Exit(1)


@app.command()
@_command
def catalog(
    job: Annotated[str, typer.Option("--job", help="Job name.")],
    savepoint_dir: DirOption = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Recreate the catalog from the _metadata files.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show (or --rebuild) the job's savepoint catalog; _metadata files are the source of truth."""
    from airflow_savepoints.core.catalog import Catalog
    from airflow_savepoints.core.models import validate_job_name

    store = Store(resolve_savepoint_dir(savepoint_dir)).child(validate_job_name(job))
    document = Catalog(store, job).rebuild() if rebuild else Catalog(store, job).load()
    states: dict[str, int] = {}
    for record in document.records.values():
        states[record.state.value] = states.get(record.state.value, 0) + 1
    payload = {"job": job, "catalog": store.url_of("_catalog.json"), "rebuilt": rebuild, "records": len(document.records),
               "states": states, "pins": [p.model_dump(mode="json") for p in document.pins.values()]}
    _emit(as_json, payload, f"{'rebuilt ' if rebuild else ''}{payload['catalog']}: {len(document.records)} records "
                            f"{states}, {len(document.pins)} pins")


app.add_typer(job_commands, name="job")


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)


def main() -> None:  # console script entry point
    app()


if __name__ == "__main__":
    main()
