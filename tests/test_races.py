"""Spark replacing or purging files during a copy: detected, retried on a fresh plan, or a clear failure.

The faults are injected through the trigger's own progress hook, right after planning: the same
moment Spark's maintenance or a task retry would replace (rename over) or purge a planned file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_savepoints.core import list_savepoints, restore_savepoint, take_savepoint
from airflow_savepoints.errors import SavepointRetriesExhaustedError
from airflow_savepoints.storage import Store
from tests.conftest import job_folder_entries, planned_state_files


def replace_by_rename(path: Path) -> None:
    """What Spark's createAtomic(overwrite) does: same bytes, written to a temp file, renamed over."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(path.read_bytes())
    os.replace(tmp, path)


def test_a_replaced_file_is_detected_and_the_copy_retried(checkpoint, tmp_path):
    victim = checkpoint / planned_state_files(checkpoint)[-1]  # a file the savepoint must copy
    faults = []

    def replace_once(event, data):
        if event == "planned" and not faults:
            replace_by_rename(victim)
            faults.append(data["attempt"])

    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), on_event=replace_once)
    assert faults == [1] and info.manifest.attempts == 2
    job_dir = tmp_path / "sp" / "job"
    assert job_folder_entries(job_dir) == [info.manifest.savepoint_id]
    restore_savepoint(info.pointer, str(tmp_path / "restored"))


def test_files_vanishing_on_every_attempt_fail_clearly_and_leave_nothing(checkpoint, tmp_path):
    before = {p: p.read_bytes() for p in checkpoint.rglob("*") if p.is_file()}
    purged: list[tuple[Path, Path]] = []

    def purge_a_planned_file(event, data):
        if event == "planned":
            victim = sorted(checkpoint.glob("sources/0/*"))[-1]
            kept = tmp_path / f"purged-{data['attempt']}"
            victim.rename(kept)  # Spark's purge, but kept aside to put back below
            purged.append((victim, kept))

    with pytest.raises(SavepointRetriesExhaustedError) as failure:
        take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), max_attempts=3,
                       on_event=purge_a_planned_file)
    assert "in 3 attempts" in failure.value.message and failure.value.hint
    assert list_savepoints(Store(str(tmp_path / "sp")), "job") == []
    job_dir = tmp_path / "sp" / "job"
    assert job_folder_entries(job_dir) == []  # no incomplete location, no lease
    for original, kept in reversed(purged):
        kept.rename(original)
    assert {p: p.read_bytes() for p in checkpoint.rglob("*") if p.is_file()} == before  # only read
