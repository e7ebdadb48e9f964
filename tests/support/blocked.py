"""The CLI in a Python process where one module cannot be imported, as on a host without it."""

from __future__ import annotations

import sys


def cli_without(module: str, *args: str) -> list[str]:
    """The command line of ``airflow-savepoints ARGS`` run with ``import MODULE`` failing (``ModuleNotFoundError``)."""
    script = f"import sys; sys.modules[{module!r}] = None\nfrom airflow_savepoints.cli.main import main; main()"
    return [sys.executable, "-c", script, *args]
