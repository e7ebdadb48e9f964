"""Pydantic models: the savepoint manifest (``_metadata``) and what the services return."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
)

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.names import MANIFEST_FILE
from airflow_savepoints.errors import InvalidInputError, InvalidJobNameError
from airflow_savepoints.sinks import SinkReport

# A progress callback of a savepoint, restore or verify: on_event(event, data), e.g. ("file_done", {path, bytes})
Notify = Callable[[str, dict[str, Any]], None]

MANIFEST_FORMAT = "airflow-savepoints/savepoint"
MANIFEST_VERSION = 2  # the newest this release reads and writes: 2 when a file names its own checksum kind
PLAIN_MANIFEST_VERSION = 1  # written when every file is CRC32C, so that earlier releases read it
CHECKSUM_ALGORITHM = "crc32c"

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")  # \Z: "$" would accept a trailing newline


def validate_job_name(job: str) -> str:
    """A job name is one folder name: letters, digits, '.', '_', '-'; not empty, no '/', not '..'."""
    if not isinstance(job, str) or not JOB_NAME.match(job) or ".." in job:
        raise InvalidJobNameError(
            f"invalid job name {job!r}",
            "use 1-128 characters from A-Z a-z 0-9 . _ - , starting with a letter or digit, without '..' or '/'",
        )
    return job


class Request(BaseModel):
    """What a caller asks of a service, given as the service's keyword arguments."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", frozen=True)

    @classmethod
    def of(cls, service: str, **fields: Any) -> Any:
        """The request from ``service``'s keyword arguments: an unknown one is a TypeError (as for any
        function), a bad value an :class:`InvalidInputError` naming the field."""
        unknown = sorted(set(fields) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"{service}() got an unexpected keyword argument {unknown[0]!r}")
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise invalid_input(exc) from None


def invalid_input(exc: ValidationError) -> InvalidInputError:
    """A request's validation error as the :class:`InvalidInputError` that names its first bad field and value."""
    first = exc.errors()[0]
    field = ".".join(str(x) for x in first.get("loc", ()))
    return InvalidInputError(f"invalid {field}: {first.get('msg')} (got {first.get('input')!r})", f"pass a valid {field}")


class SavepointType(StrEnum):
    MANUAL = "manual"
    PERIODIC = "periodic"
    STOP = "stop"
    RETAINED_CHECKPOINT = "retained_checkpoint"


class FileEntry(BaseModel):
    """One file of the savepoint, relative to its directory."""

    model_config = ConfigDict(frozen=True)

    path: str
    size: int = Field(ge=0)
    checksum: str  # hex checksum of the file's bytes, by checksum_algorithm (checksum_source says who computed it)
    checksum_algorithm: Literal["crc32c", "crc64"] | None = None  # None: the manifest's (crc32c); crc64: Azure's
    # Provenance (absent in manifests written before 0.x; readers that do not know them ignore them):
    method: str | None = None  # link | server_copy | stream: how the file got here
    checksum_source: str | None = None  # read | store | previous (docs/savepoint-format.md)
    source_version: str | None = None  # the checkpoint file's version token when it was copied
    reused_from: str | None = None  # the savepoint whose file and checksum were reused

    @property
    def algorithm(self) -> str:
        return self.checksum_algorithm or CHECKSUM_ALGORITHM

    @model_serializer(mode="wrap")
    def _without_default_algorithm(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A CRC32C file is written as before (no ``checksum_algorithm`` key)."""
        data = handler(self)
        if self.checksum_algorithm is None:
            data.pop("checksum_algorithm", None)
        return data


class StateStoreSettings(BaseModel):
    """State-store settings a restarting query must match; Spark does not persist all of them."""

    provider: str | None = None
    checkpoint_format_version: int = 1
    changelog_checkpointing: bool | None = None
    operators: list[str] = Field(default_factory=list)
    # operator id -> its number of state partitions (absent in manifests written before 0.x: read from ``files``)
    partitions: dict[str, int] = Field(default_factory=dict)


class SavepointManifest(BaseModel):
    """The ``_metadata`` file: written last, so its presence is what makes a savepoint complete."""

    model_config = ConfigDict(extra="allow")

    format: Literal["airflow-savepoints/savepoint"] = MANIFEST_FORMAT
    format_version: int = PLAIN_MANIFEST_VERSION  # MANIFEST_VERSION when a file names its own checksum kind
    savepoint_id: str
    job: str
    query_id: str
    batch_id: int = Field(ge=0)
    includes_next_offsets: bool = False
    includes_next_state: bool = False  # state version N+2 (complete) came with offsets/N+1
    type: SavepointType
    reason: str | None = None
    request_id: str | None = None
    created_at: datetime
    tool_version: str
    spark_version: str | None = None
    job_version: dict[str, Any] | None = None  # the job's version (application, args, Spark conf, hash); optional
    checkpoint: str  # the live checkpoint it was taken from (a URL, never with credentials)
    retired_checkpoint: bool = False  # taken on purpose of a checkpoint its job had left: never a restore default
    offset_log_version: int = 1
    commit_log_version: int = 1
    state_store: StateStoreSettings = Field(default_factory=StateStoreSettings)
    source_offsets: dict[str, Any] = Field(default_factory=dict)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    checksum_algorithm: Literal["crc32c"] = CHECKSUM_ALGORITHM  # each file's, unless it names its own
    files: list[FileEntry]
    total_bytes: int = Field(ge=0)
    attempts: int = 1
    secondary: str | None = None  # a secondary copy written in the same pass (restore prefers it when intact)
    # RocksDB snapshot zips -> the files each lists (path relative to its store folder, size or -1): the next
    # incremental savepoint plans from these instead of reading an unchanged zip again
    snapshot_files: dict[str, dict[str, int]] = Field(default_factory=dict)

    @field_validator("job")
    @classmethod
    def _job_name(cls, value: str) -> str:
        return validate_job_name(value)

    @field_serializer("files")
    def _files_as_written(self, files: list[FileEntry]) -> list[dict[str, Any]]:
        """Each entry as ``FileEntry`` writes it (a CRC32C file without a ``checksum_algorithm`` key), in one
        loop: the entry's own serializer would be a Python call per file."""
        written = []
        for entry in files:
            fields = dict(entry.__dict__)
            if fields["checksum_algorithm"] is None:
                del fields["checksum_algorithm"]
            written.append(fields)
        return written

    @field_validator("files")
    @classmethod
    def _distinct_plain_files(cls, value: list[FileEntry]) -> list[FileEntry]:
        """Each file once, never the manifest itself (a forged or damaged manifest is refused)."""
        paths = [entry.path for entry in value]
        if len(set(paths)) == len(paths) and MANIFEST_FILE not in paths:  # as a rule: no loop over the entries
            return value
        seen: set[str] = set()
        for entry in value:
            if entry.path in seen:
                raise ValueError(f"file {entry.path!r} is listed twice")
            if entry.path == MANIFEST_FILE:
                raise ValueError(f"{MANIFEST_FILE} lists itself among the files")
            seen.add(entry.path)
        return value

    @property
    def job_version_hash(self) -> str | None:
        """The ``hash`` of ``job_version``, if the manifest records one."""
        value = (self.job_version or {}).get("hash")
        return value if isinstance(value, str) and value else None

    def state_partitions(self) -> dict[str, int]:
        """Each stateful operator's partition count: as recorded, else counted from the files (older manifests)."""
        return dict(self.state_store.partitions) or formats.state_partitions(e.path for e in self.files)

    def age_seconds(self, now: datetime | None = None) -> float:
        return ((now or datetime.now(UTC)) - self.created_at).total_seconds()


class SavepointSummary(BaseModel):
    """One savepoint in plain JSON: what the CLI prints, operators push to XCom and the API returns.

    Built from a completed savepoint's manifest or from a catalog record; a key the source does
    not know is None (a manifest no ``conflict``; a record not completed, or written by an earlier
    release, no ``includes_next_offsets``)."""

    pointer: str
    savepoint_id: str
    job: str
    query_id: str | None = None
    batch_id: int | None = None
    includes_next_offsets: bool | None = None
    type: SavepointType
    state: str
    reason: str | None = None
    request_id: str | None = None
    created_at: datetime
    files: int | None = None
    bytes: int | None = None
    spark_version: str | None = None
    checkpoint_format_version: int | None = None
    conflict: str | None = None  # identity sources disagree: kept, never restored or disposed
    job_version_hash: str | None = None  # the short hash of the job's version it was taken of, when known

    @classmethod
    def of_manifest(cls, pointer: str, manifest: SavepointManifest) -> SavepointSummary:
        m = manifest
        return cls(pointer=pointer, savepoint_id=m.savepoint_id, job=m.job, query_id=m.query_id, batch_id=m.batch_id,
                   includes_next_offsets=m.includes_next_offsets, type=m.type, state="completed", reason=m.reason,
                   request_id=m.request_id, created_at=m.created_at, files=len(m.files), bytes=m.total_bytes,
                   spark_version=m.spark_version, checkpoint_format_version=m.state_store.checkpoint_format_version,
                   job_version_hash=m.job_version_hash)

    @field_serializer("created_at")
    def _iso(self, value: datetime) -> str:
        return value.isoformat()  # "+00:00", as every release wrote it (pydantic would write "Z")

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class SavepointInfo(BaseModel):
    """A completed savepoint as the services return it: where it is and its manifest."""

    pointer: str
    manifest: SavepointManifest

    def summary(self) -> dict[str, Any]:
        """The JSON the CLI prints and operators push to XCom (no credentials, plain types)."""
        return SavepointSummary.of_manifest(self.pointer, self.manifest).as_json()


class RestoreResult(BaseModel):
    pointer: str
    checkpoint: str
    batch_id: int
    query_id: str
    new_query_id: bool
    files: int
    bytes: int
    rewritten: list[str] = Field(default_factory=list)
    restored_from: str | None = None  # the secondary copy when it was used, else the savepoint itself
    state_store: StateStoreSettings
    spark_conf_to_set: dict[str, str] = Field(default_factory=dict)
    # a restore with state_partitions: each operator's partition count in the savepoint and in the restored checkpoint
    partitions_before: dict[str, int] = Field(default_factory=dict)
    partitions_after: dict[str, int] = Field(default_factory=dict)
    rescaled: bool = False  # Spark rewrote the state into the asked partition count (False: none asked, or already so)
    repartition_batch_id: int | None = None  # the batch Spark's repartition wrote; the query continues after it
    dropped_trailing_batch: int | None = None  # the savepoint's planned, uncommitted batch left out of the copy
    sink: SinkReport = Field(default_factory=lambda: SinkReport(kind="unknown"))  # what the sink sees of the re-run batches
