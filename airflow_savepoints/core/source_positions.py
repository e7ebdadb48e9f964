"""A savepoint's source positions: where each source stood at the savepoint's committed batch N.

They come from the manifest (``offsets/N`` as the savepoint recorded it), so no Spark is needed.
``offsets/N`` holds each source's end position of batch N, the first record not yet processed, so
restarting a rewritten query from them (without the old state) reads exactly what came after N:

- Kafka: ``{"topic": {"0": 123}}``, the exact JSON form of the Kafka source's ``startingOffsets``
  option (inclusive: reading starts at offset 123 of partition 0);
- a file source: the files its log lists up to N (``sources/<i>/``, held by the savepoint); Spark's
  file source has no starting-position option (``modifiedAfter`` is refused for streams), so a
  restart reads an input that leaves these files out;
- any other source: its offset JSON as Spark logged it (its own format).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.input_check import logged_input_files
from airflow_savepoints.core.manifest import resolve_savepoint
from airflow_savepoints.storage import Store


class SourcePosition(BaseModel):
    source: str  # the source's key in the offsets log: its index ("0", "1", ...) or, for named sources, its name
    kind: str  # kafka | file | other | none
    offset: Any = None  # the offset JSON Spark logged for batch N
    starting_offsets: str | None = None  # Kafka: the value for .option("startingOffsets", ...)
    log_offset: int | None = None  # a file source's log batch
    files: list[str] = Field(default_factory=list)  # a file source's files processed up to batch N


class SourcePositions(BaseModel):
    pointer: str
    savepoint_id: str
    job: str
    query_id: str
    batch_id: int
    sources: list[SourcePosition]

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def is_kafka_offset(offset: Any) -> bool:
    """A Kafka source offset: ``{topic: {partition: offset}}`` with digit partitions and integer offsets."""
    return isinstance(offset, dict) and bool(offset) and all(
        isinstance(parts, dict) and parts and all(str(p).lstrip("-").isdigit() and isinstance(o, int) for p, o in parts.items())
        for parts in offset.values())


def kafka_starting_offsets(offset: dict[str, dict[str, int]]) -> str:
    """The ``startingOffsets`` JSON of a Kafka offset: topics sorted, partitions in numeric order."""
    return json.dumps({topic: {str(p): parts[p] for p in sorted(parts, key=int)} for topic, parts in sorted(offset.items())},
                      separators=(",", ":"))


def position_of(location: Store, paths: set[str], source: str, offset: Any) -> SourcePosition:
    if offset is None:
        return SourcePosition(source=source, kind="none")  # the source had no data yet at batch N
    log_offset = formats.file_source_log_offset(offset)
    if log_offset is not None:
        files = sorted(set(logged_input_files(location, paths, f"sources/{source}", -1, log_offset)))
        return SourcePosition(source=source, kind="file", offset=offset, log_offset=log_offset, files=files)
    if is_kafka_offset(offset):
        return SourcePosition(source=source, kind="kafka", offset=offset, starting_offsets=kafka_starting_offsets(offset))
    return SourcePosition(source=source, kind="other", offset=offset)


def source_positions(pointer: str, storage_options: dict[str, Any] | None = None) -> SourcePositions:
    """Each source's committed position at the savepoint's batch (see the module's docstring)."""
    location, manifest = resolve_savepoint(pointer, storage_options)
    paths = {e.path for e in manifest.files}
    sources = [position_of(location, paths, key, offset)
               for key, offset in sorted(manifest.source_offsets.items(), key=lambda kv: (not kv[0].isdigit(), len(kv[0]), kv[0]))]
    return SourcePositions(pointer=location.url, savepoint_id=manifest.savepoint_id, job=manifest.job,
                           query_id=manifest.query_id, batch_id=manifest.batch_id, sources=sources)
