"""What a savepoint's state holds, per stateful operator, and where that summary is kept.

:mod:`airflow_savepoints.core.state_reader` computes a :class:`StateSummary` with Spark; this module
(no Spark, no Airflow) holds its model and its record beside the savepoint: a completed savepoint is
never modified, so the summary is ``<dir>/<job>/_state_summaries/<savepoint id>.json``, outside the
savepoint's folder. Disposing the savepoint (``dispose.dispose_location``, ``discard_incomplete``)
removes it, and retention removes any whose savepoint is gone.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from airflow_savepoints.core.manifest import SAVEPOINT_NAME
from airflow_savepoints.core.models import SavepointManifest
from airflow_savepoints.core.names import STATE_SUMMARIES_FOLDER
from airflow_savepoints.errors import InvalidInputError, UnsafeFileError
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

SUMMARY_SUFFIX = ".json"


class StoreState(BaseModel):
    """One state store of an operator (a column family): ``default``, a join's four stores, or one
    transformWithState variable (``state_var``; its timers as ``timers``)."""

    store: str
    state_var: str | None = None
    kind: str | None = None  # a transformWithState variable's type (ValueState, ListState, MapState) or "timers"
    schema_: dict[str, str] = Field(default_factory=dict, alias="schema")  # column -> Spark type (key, value, ...)
    rows: int | None = None
    rows_per_partition: list[int] = Field(default_factory=list)
    bytes: int | None = None  # the files of this store's folders, where the layout has one per store (HDFS joins)
    counted: bool = True  # whether its rows make up the operator's rows (a join's keyToNumValues stores do not)
    samples: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None  # why Spark could not read it (its own message)

    model_config = {"populate_by_name": True}


class OperatorState(BaseModel):
    """One stateful operator of the savepoint, as Spark's ``state-metadata`` and ``statestore`` read it."""

    operator_id: int
    name: str | None = None  # None: the checkpoint has no operator metadata (written before Spark 4.0)
    partitions: int
    files: int = 0
    bytes: int = 0  # the manifest's file sizes under state/<operator id>/
    rows: int | None = None  # None when no counted store could be read
    rows_per_partition: list[int] = Field(default_factory=list)
    skew: float | None = None  # the largest partition's rows over the mean (1.0 = even)
    properties: dict[str, Any] = Field(default_factory=dict)  # Spark's operatorProperties (transformWithState)
    stores: list[StoreState] = Field(default_factory=list)


class StateSummary(BaseModel):
    """A savepoint's state: what ``airflow-savepoints inspect`` prints and InspectSavepointOperator records."""

    pointer: str
    savepoint_id: str
    job: str
    batch_id: int
    savepoint_spark_version: str | None = None
    reader_spark_version: str | None = None
    read_from: str  # where Spark read it: the savepoint itself, or a local copy of a remote one
    operators: list[OperatorState] = Field(default_factory=list)
    total_rows: int | None = None
    limits: list[str] = Field(default_factory=list)  # what Spark's sources could not show for this savepoint
    inspected_at: str | None = None

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def without_samples(self) -> StateSummary:
        copy = self.model_copy(deep=True)
        for operator in copy.operators:
            for store in operator.stores:
                store.samples = []
        return copy


def skew(rows_per_partition: list[int]) -> float | None:
    """The largest partition over the mean (1.0: even; None without rows)."""
    total = sum(rows_per_partition)
    if not rows_per_partition or total == 0:
        return None
    return round(max(rows_per_partition) / (total / len(rows_per_partition)), 3)


def state_files(manifest: SavepointManifest) -> dict[str, dict[str, Any]]:
    """Per operator id (as its folder name): partitions, files and bytes, and bytes per store folder,
    from the manifest's ``state/<op>/<partition>/[<store>/]`` files (no read of the savepoint)."""
    operators: dict[str, dict[str, Any]] = {}
    for entry in manifest.files:
        parts = entry.path.split("/")
        if len(parts) < 3 or parts[0] != "state":
            continue
        found = operators.setdefault(parts[1], {"operator": parts[1], "partitions": set(), "files": 0, "bytes": 0,
                                                "store_bytes": {}})
        if parts[2].isdigit():
            found["partitions"].add(parts[2])
            if len(parts) >= 5 and not parts[3].startswith("_") and parts[3] != "SSTs":  # state/op/p/<store>/file
                found["store_bytes"][parts[3]] = found["store_bytes"].get(parts[3], 0) + entry.size
        found["files"] += 1
        found["bytes"] += entry.size
    return {key: {**op, "partitions": len(op["partitions"])}
            for key, op in sorted(operators.items(), key=lambda item: (len(item[0]), item[0]))}


# ---- the record beside the savepoint -----------------------------------------------------------

def summary_path(savepoint_id: str) -> str:
    """The summary's path relative to the job folder (the savepoint id checked to be a folder name)."""
    if not SAVEPOINT_NAME.match(savepoint_id):
        raise ValueError(f"not a savepoint id: {savepoint_id!r}")
    return f"{STATE_SUMMARIES_FOLDER}/{savepoint_id}{SUMMARY_SUFFIX}"


def record_summary(job_folder: Store, summary: StateSummary) -> str:
    """Write ``summary`` (without sample rows: they are data) beside its savepoint; returns its URL."""
    path = summary_path(summary.savepoint_id)
    job_folder.make_parents([path])
    job_folder.write_bytes_atomic(path, summary.without_samples().model_dump_json(by_alias=True).encode())
    return job_folder.url_of(path)


def record_beside(summary: StateSummary, storage_options: dict[str, Any] | None = None) -> str:
    """Record ``summary`` in its savepoint's job folder (``<dir>/<job>/savepoint-…`` only); returns its URL."""
    location = Store(summary.pointer, storage_options)
    if not SAVEPOINT_NAME.match(location.name) or location.parent().name != summary.job:
        raise InvalidInputError(
            f"{summary.pointer} is not laid out as <dir>/<job>/savepoint-<id>-<random>: there is no job folder to "
            "record its state summary in",
            "inspect a savepoint in its savepoint directory (airflow-savepoints inspect prints the summary instead)")
    return record_summary(location.parent(), summary)


def read_summary(job_folder: Store, savepoint_id: str) -> StateSummary | None:
    """The recorded summary of ``savepoint_id``; None when there is none (or it does not read)."""
    try:
        return StateSummary.model_validate_json(job_folder.read_known(summary_path(savepoint_id), "state_summary"))
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:  # a FIFO never ties up a console worker: it is not opened for reading
        log.warning("%s; ignored", exc)
        return None
    except ValidationError as exc:
        log.warning("state summary %s does not read (%s); ignored", job_folder.url_of(summary_path(savepoint_id)), exc)
        return None


def remove_summary(job_folder: Store, savepoint_id: str) -> None:
    """Remove the savepoint's summary, if it has one (part of disposing the savepoint)."""
    path = summary_path(savepoint_id)
    if job_folder.exists(path):
        job_folder.remove_file(path)


def remove_stray_summaries(job_folder: Store, folders: set[str]) -> list[str]:
    """Remove summaries whose savepoint folder is not among ``folders`` (a disposal raced the record);
    one listing (empty when there are none)."""
    stray = [name for name in job_folder.listdir(STATE_SUMMARIES_FOLDER)
             if name.endswith(SUMMARY_SUFFIX) and SAVEPOINT_NAME.match(name[:-len(SUMMARY_SUFFIX)])
             and name[:-len(SUMMARY_SUFFIX)] not in folders]
    for name in stray:
        job_folder.remove_file(f"{STATE_SUMMARIES_FOLDER}/{name}")
    return stray
