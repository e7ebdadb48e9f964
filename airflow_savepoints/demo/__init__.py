"""A small stateful streaming job, a local end-to-end demo of savepoints, and the example DAGs' location."""

from __future__ import annotations

import shutil
from pathlib import Path

from airflow_savepoints.errors import InvalidInputError

PACKAGE = Path(__file__).resolve().parents[1]


def example_dags_folder() -> Path:
    """The example DAGs and jobs.yaml: in the wheel (package data), else the checkout's ``dags/``."""
    for folder in (PACKAGE / "example_dags", PACKAGE.parent / "dags"):
        if (folder / "jobs.yaml").is_file():
            return folder
    raise InvalidInputError(
        f"the example DAGs are neither in {PACKAGE / 'example_dags'} nor in {PACKAGE.parent / 'dags'}",
        "reinstall the package (pip install --force-reinstall airflow-savepoints) or run from a checkout",
    )


def install_example_dags(target: Path, *, overwrite: bool = False) -> list[Path]:
    """Copy the example DAGs and jobs.yaml into ``target`` (a dags folder); return the files written.

    An existing file is never replaced unless ``overwrite``: the error names the files and nothing is copied.
    """
    source = example_dags_folder()
    files = sorted(p for p in source.iterdir() if p.is_file() and p.suffix in (".py", ".yaml"))
    target = Path(target).expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise InvalidInputError(f"{target} is a file, not a folder", "give the path of your DAGs folder")
    clashes = [target / p.name for p in files if (target / p.name).exists()]
    if clashes and not overwrite:
        raise InvalidInputError(
            f"{len(clashes)} files already exist in {target}: {', '.join(p.name for p in clashes)}",
            "pass --overwrite to replace them, or pick another folder",
        )
    target.mkdir(parents=True, exist_ok=True)
    for p in files:
        shutil.copyfile(p, target / p.name)
    return [target / p.name for p in files]
