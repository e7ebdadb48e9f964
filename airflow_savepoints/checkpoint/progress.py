"""A live checkpoint's progress: its newest committed batch and when it was committed."""

from __future__ import annotations

from datetime import UTC, datetime

from airflow_savepoints.storage import Store


def checkpoint_progress(checkpoint: Store) -> tuple[int | None, datetime | None]:
    """The newest committed batch of a checkpoint and when its commit file was written."""
    listing = checkpoint.list_files("commits")
    batches = {int(p): p for p in listing if p.isdigit()}
    if not batches:
        return None, None
    newest = max(batches)
    try:
        info = checkpoint.fs.info(checkpoint.path_of(f"commits/{newest}"))
    except FileNotFoundError:
        return newest, None
    mtime = info.get("mtime") or info.get("LastModified")
    if isinstance(mtime, (int, float)):
        mtime = datetime.fromtimestamp(mtime, UTC)
    return newest, mtime
