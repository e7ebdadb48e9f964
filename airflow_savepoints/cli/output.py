"""How every command answers: one JSON document with ``--json``, else text; a failure as a coded error.

Exit status: 0 done, 1 an error (its message and how to fix it), 2 a usage error."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import typer

from airflow_savepoints.errors import InterruptedBySignalError, SavepointError, UnexpectedError


class LazyConsole:
    """A rich ``Console`` made on first use: a command that answers in JSON never imports rich (its import is
    a tenth of a command's start). ``rich`` is the console itself, for what must be given one (a progress bar)."""

    def __init__(self, **options: Any) -> None:
        self._options = options

    @functools.cached_property
    def rich(self):  # noqa: ANN201 - rich.console.Console, imported here
        from rich.console import Console

        return Console(**self._options)

    def __getattr__(self, name: str) -> Any:  # what the proxy does not have: the console's
        return getattr(self.rich, name)


def escape(text: str) -> str:
    """rich's markup escape (rich imported when text is printed)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


err = LazyConsole(stderr=True, highlight=False)
out = LazyConsole(highlight=False, width=None if sys.stdout.isatty() else 160)  # pipes and CI logs: no truncation


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def print_state_summary(summary: Any) -> None:
    """A state summary (``inspect``, ``job inspect``) as a table of operators and stores, then the sampled rows;
    what Spark's sources could not show, on stderr."""
    from rich.table import Table

    table = Table(title=f"state of {summary.savepoint_id} (batch {summary.batch_id}, {summary.job})")
    for column in ("operator", "name", "store", "rows", "per partition", "skew", "size", "schema"):
        table.add_column(column, overflow="fold")
    for op in summary.operators:
        table.add_row(str(op.operator_id), op.name or "unknown", "", "" if op.rows is None else str(op.rows),
                      "", "" if op.skew is None else f"{op.skew:.2f}", human_size(op.bytes), "")
        for store in op.stores:
            shown = " ".join(f"{k}: {v}" for k, v in store.schema_.items())
            table.add_row("", "", escape(store.state_var or store.kind or store.store) if store.store == "default"
                          else escape(store.store), "" if store.rows is None else str(store.rows),
                          " ".join(map(str, store.rows_per_partition)), "", "" if store.bytes is None else human_size(store.bytes),
                          f"[red]{escape(store.error)}[/]" if store.error else escape(shown))
    out.print(table)
    for op in summary.operators:
        for store in op.stores:
            for row in store.samples:
                out.print(f"{op.operator_id}/{escape(store.state_var or store.store)}: {escape(json.dumps(row, default=str))}")
    for limit in summary.limits:
        err.print(f"[yellow]cannot show:[/] {escape(limit)}")


def emit(as_json: bool, payload: Any, text: str | None = None) -> None:
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    elif text is not None:
        out.print(text)


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt: no ``except Exception`` swallows it
    """SIGTERM (or SIGINT) arrived: raised in the main thread, so every ``finally`` and ``except BaseException``
    on the way out runs (a restore empties its target and gives back its claim)."""


_SIGNALLED: list[str] = []  # the signal that stopped the command: whatever error it surfaces as, it is reported


def _on_signal(signum: int, frame: Any) -> None:
    for each in (signal.SIGTERM, signal.SIGINT):  # a second signal does not cut the clean-up short
        signal.signal(each, signal.SIG_IGN)
    _SIGNALLED.append(signal.Signals(signum).name)
    raise Terminated(signal.Signals(signum).name)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGINT raise ``Terminated`` in the main thread while a command runs (Python's default for
    SIGTERM ends the process at once, with no clean-up)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {each: signal.signal(each, _on_signal) for each in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def command(fn):
    """Run a command; a SavepointError becomes a clear message and exit status 1, and so does SIGTERM or
    SIGINT once the command has cleaned up (code ``interrupted``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = kwargs.get("as_json", False)
        try:
            with _signals_raise():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except (Exception, KeyboardInterrupt, Terminated) as caught:  # noqa: BLE001 - every failure leaves as a coded error
            if isinstance(caught, KeyboardInterrupt | Terminated) or _SIGNALLED:
                name = _SIGNALLED[0] if _SIGNALLED else "SIGINT"  # pyspark's own SIGINT handler raises KeyboardInterrupt
                exc: SavepointError = InterruptedBySignalError(
                    f"interrupted by {name}; what this command had written was removed (a restore leaves its target "
                    "empty, a savepoint its location discarded)", "run the command again")
            else:
                exc = caught if isinstance(caught, SavepointError) else UnexpectedError.wrap(caught)
            if os.environ.get("AIRFLOW_SAVEPOINTS_DEBUG") and exc is not caught:
                err.print_exception()
            if as_json:
                sys.stdout.write(json.dumps({"error": exc.to_dict()}, indent=2) + "\n")
            else:
                err.print(f"[bold red]error:[/] {escape(exc.message)}")  # escape: "[spark]" is not markup
                if exc.hint:
                    err.print(f"[yellow]how to fix:[/] {escape(exc.hint)}")
            raise typer.Exit(1) from None

    return wrapper
