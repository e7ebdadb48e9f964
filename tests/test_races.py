"""Spark replacing or purging files during a copy: detected, retried on a fresh plan, or a clear failure.

The faults are injected through the trigger's own progress hook, right after planning: the same
moment Spark's maintenance or a task retry would replace (rename over) or purge a planned file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_savepoints.core import list_savepoints, restore_savepoint, take_savepoint, verify_savepoint
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


def test_a_linked_file_replaced_after_the_copy_keeps_the_planned_bytes_without_a_retry(checkpoint, tmp_path):
    """A link holds the inode it got, which the copy proved is the planned version: Spark replacing
    the name afterwards changes nothing in the savepoint, so no re-check (and no retry) is needed."""
    victim_rel = planned_state_files(checkpoint)[-1]
    victim = checkpoint / victim_rel
    planned_bytes, planned_inode = victim.read_bytes(), victim.stat().st_ino
    replaced = []

    def replace_once_linked(event, data):  # the product's own hook: the victim is reported copied (linked)
        if event == "file_done" and data["path"] == victim_rel and not replaced:
            victim.unlink()  # Spark's purge and rewrite of the name: another inode, other bytes
            victim.write_bytes(b"rewritten after the savepoint linked it")
            replaced.append(data["path"])

    info = take_savepoint(str(checkpoint), "job", savepoint_dir=str(tmp_path / "sp"), on_event=replace_once_linked)
    assert replaced == [victim_rel]
    kept = Path(info.pointer) / victim_rel
    assert info.manifest.attempts == 1
    assert kept.read_bytes() == planned_bytes and kept.stat().st_ino == planned_inode
    verify_savepoint(info.pointer)


@pytest.mark.s3
def test_an_object_rewritten_during_a_streamed_copy_from_s3_is_detected_and_the_copy_retried(s3, checkpoint, tmp_path,
                                                                                            monkeypatch):
    """A streamed read of an object store records no version (a replacement mid-read could mix two
    objects' bytes): after the copy, such files are listed again, and a rewritten one means a retry."""
    from airflow_savepoints.core import copier

    source = Store(f"s3://{s3}/checkpoint")
    source.fs.put(str(checkpoint), source.root, recursive=True)
    victim_rel = planned_state_files(checkpoint)[-1]
    real_stream, rewritten = copier._stream, []

    def stream_then_rewrite(src, src_rel, dst, dst_rel, *algorithm):
        copied = real_stream(src, src_rel, dst, dst_rel, *algorithm)
        if src_rel == victim_rel and not rewritten:
            time.sleep(1.1)  # S3's LastModified has one-second steps
            src.fs.pipe_file(src.path_of(src_rel), (checkpoint / victim_rel).read_bytes())  # same bytes, new object
            rewritten.append(src_rel)
        return copied

    monkeypatch.setattr(copier, "_stream", stream_then_rewrite)
    info = take_savepoint(source.url, "job", savepoint_dir=f"s3://{s3}/savepoints", copy_mode="stream")
    assert rewritten == [victim_rel] and info.manifest.attempts == 2
    verify_savepoint(info.pointer)
    restore_savepoint(info.pointer, str(tmp_path / "restored"))
    assert (tmp_path / "restored" / victim_rel).read_bytes() == (checkpoint / victim_rel).read_bytes()
