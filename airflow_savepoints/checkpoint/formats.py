"""Parsers for the files of a Spark Structured Streaming checkpoint.

Formats are those of Spark 3.5 and 4.x (see docs/savepoint-format.md and the checkpoint spec):
``metadata``, ``offsets/N`` (v1 and v2), ``commits/N`` (v1-v3), file-source logs, operator metadata
v2 (transformWithState), RocksDB snapshot zips and Spark's ``.crc`` checksum sidecars.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_savepoints.errors import CheckpointError

BATCH_FILE = re.compile(r"^(\d+)$")
COMPACT_FILE = re.compile(r"^(\d+)\.compact$")
# A state store's version files: ``<version>`` then, by store and checkpoint format (they exclude each other)
STATE_FILE_SUFFIXES = {
    "hdfs": r"(?:\.[^.]+)?\.(delta|snapshot|metadata)",  # HDFS kind
    "rocksdb_v1": r"\.(zip|changelog)",  # RocksDB kind
    "rocksdb_v2": r"_([0-9A-Za-z-]+)\.(zip|changelog)",  # unique id, RocksDB kind
}
# All in one pattern: version, HDFS kind, RocksDB v1 kind, v2 unique id, v2 kind
STATE_FILE = re.compile(r"^(\d+)(?:" + "|".join(STATE_FILE_SUFFIXES.values()) + ")$")
METADATA_FILE = "metadata"  # a checkpoint's identity (the query id), in its root
SPARK_SIDECAR_SUFFIX = ".crc"


def is_transient_path(path: str) -> bool:
    """Whether any part of ``path`` is a temp file (``.x.<uuid>.tmp``) or Hadoop's hidden ``.x.crc``
    file (or a folder named so): never part of a savepoint."""
    return not visible_paths((path,))


def visible_paths(paths: Iterable[str]) -> list[str]:
    """``paths`` without the transient ones (``is_transient_path``), in one loop: a listing has thousands."""
    return [p for p in paths if "/." not in "/" + p and ".tmp/" not in p + "/"]  # no part starts with "." or ends ".tmp"


def visible_in_folder(paths: Iterable[str], start: int) -> list[str]:
    """``paths`` of one visible folder (each file's name begins at ``start``) that ``visible_paths`` keeps:
    the name alone decides, so it is the only part looked at."""
    return [p for p in paths if p[start] != "." and not p.endswith(".tmp")]


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{what} is not UTF-8 text", "the checkpoint may be damaged") from exc


def _json(line: str, what: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[" * 200000
        raise CheckpointError(f"{what} holds invalid JSON: {line[:80]!r}", "the checkpoint may be damaged") from exc


def parse_stream_metadata(data: bytes) -> str:
    """The query id from the checkpoint's ``metadata`` file."""
    text = _text(data, "metadata").strip()
    first = text.splitlines()[0] if text else ""
    value = _json(first, "metadata") if first else None
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        raise CheckpointError("the checkpoint's 'metadata' file has no query id", "the checkpoint may be damaged")
    return value["id"]


@dataclass
class OffsetEntry:
    """``offsets/N``: log version, batch metadata and one offset per source (None = no offset yet)."""

    version: int
    metadata: dict[str, Any]
    # source key ("0", "1", … for v1; the source name for v2) -> offset JSON (None for "-")
    sources: dict[str, Any] = field(default_factory=dict)

    @property
    def conf(self) -> dict[str, str]:
        return dict(self.metadata.get("conf") or {})


def _log_version(first_line: str, what: str) -> int:
    match = re.fullmatch(r"v(\d+)", first_line.strip())
    if not match:
        raise CheckpointError(f"{what} does not start with a version line (got {first_line[:20]!r})",
                              "the checkpoint may be damaged")
    return int(match.group(1))


def parse_offsets(data: bytes, what: str = "offsets") -> OffsetEntry:
    lines = _text(data, what).split("\n")
    if len(lines) < 2:
        raise CheckpointError(f"{what} is truncated", "the checkpoint may be damaged")
    version = _log_version(lines[0], what)
    metadata = _json(lines[1], what) if lines[1].strip() else {}
    sources: dict[str, Any] = {}
    for index, line in enumerate(x for x in lines[2:] if x.strip()):
        if version >= 2:
            key, _, value = line.partition(":")
            sources[key] = None if value.strip() == "-" else _json(value, what)
        else:
            sources[str(index)] = None if line.strip() == "-" else _json(line, what)
    return OffsetEntry(version=version, metadata=metadata if isinstance(metadata, dict) else {}, sources=sources)


@dataclass
class CommitEntry:
    version: int
    state_unique_ids: dict[str, list[list[str]]] = field(default_factory=dict)


def parse_commit(data: bytes, what: str = "commits") -> CommitEntry:
    lines = _text(data, what).split("\n")
    version = _log_version(lines[0], what)
    body = _json(lines[1], what) if len(lines) > 1 and lines[1].strip() else {}
    ids = body.get("stateUniqueIds") if isinstance(body, dict) else None
    return CommitEntry(version=version, state_unique_ids=ids or {})


def file_source_log_offset(offset: Any) -> int | None:
    """The file-source log batch id in a source offset (``{"logOffset": L}``), else None."""
    if isinstance(offset, dict) and isinstance(offset.get("logOffset"), int):
        return offset["logOffset"]
    return None


def kafka_source_offsets(offset: Any) -> dict[str, dict[int, int]] | None:
    """A Kafka source's offsets (``{"topic": {"0": 42, ...}, ...}``) as topic -> partition -> offset, else None."""
    if not isinstance(offset, dict) or not offset:
        return None
    found: dict[str, dict[int, int]] = {}
    for topic, partitions in offset.items():
        if not isinstance(partitions, dict) or not partitions or not all(
                isinstance(p, str) and p.isdigit() and isinstance(o, int) and not isinstance(o, bool)
                for p, o in partitions.items()):
            return None
        found[topic] = {int(p): o for p, o in partitions.items()}
    return found


def merged_kafka_offsets(sources: dict[str, Any]) -> dict[str, dict[int, int]]:
    """The Kafka offsets of a query's sources (source key -> offset JSON) as topic -> partition -> offset; the
    lowest where two sources read one topic."""
    merged: dict[str, dict[int, int]] = {}
    for _, offset in sorted(sources.items()):
        for topic, partitions in (kafka_source_offsets(offset) or {}).items():
            known = merged.setdefault(topic, {})
            for partition, value in partitions.items():
                known[partition] = min(value, known.get(partition, value))
    return merged


def parse_operator_metadata_v2(data: bytes, what: str) -> dict[str, Any]:
    lines = _text(data, what).split("\n", 1)
    if _log_version(lines[0], what) != 2 or len(lines) < 2:
        raise CheckpointError(f"{what} is not operator metadata v2", "the checkpoint may be damaged")
    return _json(lines[1].strip(), what)


def schema_file_paths(op_metadata_v2: dict[str, Any]) -> list[str]:
    paths: list[str] = []
    for store in op_metadata_v2.get("stateStoreInfo") or []:
        paths.extend(store.get("stateSchemaFilePaths") or [])
    return paths


def rewrite_schema_file_paths(data: bytes, new_state_root: str, op: str, what: str) -> bytes:
    """Point every ``stateSchemaFilePaths`` entry at ``<new_state_root>/<op>/_stateSchema/...``."""
    lines = _text(data, what).split("\n", 1)
    body = parse_operator_metadata_v2(data, what)
    for store in body.get("stateStoreInfo") or []:
        rewritten = []
        for old in store.get("stateSchemaFilePaths") or []:
            marker = f"/{op}/_stateSchema/"
            if marker not in old:
                raise CheckpointError(f"{what}: unexpected schema file path {old!r}", "please report this checkpoint")
            rewritten.append(new_state_root.rstrip("/") + marker + old.split(marker, 1)[1])
        store["stateSchemaFilePaths"] = rewritten
    return (lines[0] + "\n" + json.dumps(body, separators=(",", ":"))).encode("utf-8")


@dataclass
class RocksDBSnapshot:
    """Immutable files (relative to the store folder) a RocksDB snapshot zip refers to, with sizes."""

    files: dict[str, int]


def parse_rocksdb_zip(data: bytes, what: str) -> RocksDBSnapshot:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            raw = archive.read("metadata")
    except (zipfile.BadZipFile, KeyError) as exc:
        raise CheckpointError(f"{what} is not a RocksDB snapshot zip with a 'metadata' entry",
                              "it may have been replaced while it was read") from exc
    lines = _text(raw, what).split("\n", 1)
    body = _json(lines[1] if len(lines) > 1 else lines[0], what)
    files: dict[str, int] = {}
    for entry in body.get("sstFiles") or []:
        name = entry.get("dfsSstFileName") or entry.get("dfsFileName")
        if name:
            files[f"SSTs/{name}"] = int(entry.get("sizeBytes", -1))
    for entry in body.get("logFiles") or []:
        name = entry.get("dfsLogFileName") or entry.get("dfsFileName")
        if name:
            files[f"logs/{name}"] = int(entry.get("sizeBytes", -1))
    return RocksDBSnapshot(files=files)


@dataclass
class SparkChecksum:
    value: int  # unsigned CRC32C
    main_file_size: int


def parse_spark_sidecar(data: bytes, what: str) -> SparkChecksum:
    body = _json(_text(data, what).strip(), what)
    if not isinstance(body, dict) or str(body.get("algorithm", "")).upper() != "CRC32C":
        raise CheckpointError(f"{what} is not a Spark CRC32C checksum file", "the checkpoint may be damaged")
    return SparkChecksum(value=int(body["value"]) & 0xFFFFFFFF, main_file_size=int(body.get("mainFileSize", -1)))


def state_file_version(path: str) -> int | None:
    """The state version a store's file belongs to (``state/0/1/7.zip`` -> 7; its Spark ``.crc`` sidecar
    too); None for SSTs, logs, schema and metadata files."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(SPARK_SIDECAR_SUFFIX):
        name = name[: -len(SPARK_SIDECAR_SUFFIX)]
    match = STATE_FILE.match(name)
    return int(match.group(1)) if match else None


def state_partitions(paths: Iterable[str], version: int | None = None) -> dict[str, int]:
    """Each stateful operator's number of state partitions: the partition folders under ``state/<op>/``
    (only those holding a file of state ``version``, when given)."""
    found: dict[str, set[str]] = {}
    state = [p for p in visible_paths(paths) if p.startswith("state/")]
    if version is not None:
        state = [p for p in state if state_file_version(p) == version]
    for folder in {p.rpartition("/")[0] for p in state}:  # hundreds of files, a few folders
        parts = folder.split("/")
        if len(parts) >= 3 and parts[1].isdigit() and parts[2].isdigit():
            found.setdefault(parts[1], set()).add(parts[2])
    return {op: len(found[op]) for op in sorted(found, key=int)}
