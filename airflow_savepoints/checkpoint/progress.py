"""A live checkpoint's progress: its newest committed batch, when it was committed, and where its Kafka sources
are."""

from __future__ import annotations

from datetime import UTC, datetime

from airflow_savepoints.checkpoint.formats import merged_kafka_offsets, parse_offsets
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


def committed_kafka_offsets(checkpoint: Store) -> tuple[int | None, dict[str, dict[int, int]]]:
    """The newest committed batch and the Kafka offsets it ended at (where the next batch starts): topic ->
    partition -> offset, {} when the query reads no Kafka topic."""
    batch, _ = checkpoint_progress(checkpoint)
    if batch is None:
        return None, {}
    entry = parse_offsets(checkpoint.read_bytes(f"offsets/{batch}"), f"{checkpoint.url_of(f'offsets/{batch}')}")
    return batch, merged_kafka_offsets(entry.sources)
