"""How every command answers: one JSON document with ``--json``, else text; a failure as a coded error.

Exit status: 0 done, 1 an error (its message and how to fix it), 2 a usage error."""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from airflow_savepoints.errors import SavepointError, UnexpectedError

err = Console(stderr=True, highlight=False)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)  # pipes and CI logs: no truncation


def emit(as_json: bool, payload: Any, text: str | None = None) -> None:
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    elif text is not None:
        out.print(text)


def command(fn):
    """Run a command; a SavepointError becomes a clear message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as caught:  # noqa: BLE001 - every failure leaves as a coded error, never a raw traceback
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
