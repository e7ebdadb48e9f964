"""The sink kinds, one class each (see the package's description)."""


from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.sinks import KINDS, QUERY_ID
from airflow_savepoints.sinks.delta_log import DeltaLog, DeltaLogError, Snapshot
from airflow_savepoints.storage import Store

OnRerun = Literal["skipped", "written_again", "unknown"]


class SinkReport(BaseModel):
    """What a restore tells of the sink: the batches the restored run runs again and what the sink does with them."""

    kind: str  # a kind of KINDS, or "unknown" when none was given
    rerun: list[int] | None = None  # [first, last] batch the restored run runs again, None: none known
    on_rerun: OnRerun = "unknown"
    recorded_batch: int | None = None  # the highest batch the sink recorded for the savepoint's query id
    detail: str = ""


class Sink:
    """A sink kind: its location (``path``, ``storage_options``), what it recorded and what a re-run does."""

    kind: ClassVar[str] = "other"
    on_rerun: ClassVar[OnRerun] = "unknown"
    needs_path: ClassVar[bool] = False

    def __init__(self, path: str | None = None, storage_options: dict[str, Any] | None = None, app_id: str | None = None):
        if self.needs_path and not path:
            raise InvalidInputError(f"a {self.kind} sink needs its path",
                                    "pass the sink's location (--sink-path, sink_path=)")
        self.path, self.storage_options, self.app_id = path, storage_options, app_id

    @property
    def store(self) -> Store:
        assert self.path
        return Store(self.path, self.storage_options)

    def recorded_batch(self, query_id: str) -> int | None:
        """The highest batch id the sink recorded for ``query_id``; None when it records nothing."""
        return None

    def describe(self) -> str:
        return self.kind + (f" sink at {self.path}" if self.path else " sink")


class FileSink(Sink):
    """Spark's file sink: ``<path>/_spark_metadata/<batch>`` (and ``<batch>.compact``); a logged batch is skipped."""

    kind, on_rerun, needs_path = "file", "skipped", True

    def recorded_batch(self, query_id: str) -> int | None:
        return file_sink_latest_batch(self.store)


class DeltaSink(Sink):
    """A Delta table written by ``format("delta")`` (appId = the query id), or by ``foreachBatch`` with
    ``txnAppId``/``txnVersion`` (``app_id``); a batch id at or below the txn version is skipped."""

    kind, on_rerun, needs_path = "delta", "skipped", True

    def __init__(self, path: str | None = None, storage_options: dict[str, Any] | None = None, app_id: str | None = None):
        super().__init__(path, storage_options, app_id)
        self._log: DeltaLog | None = None
        self._snapshot: Snapshot | None = None

    @property
    def log(self) -> DeltaLog:
        if self._log is None:
            self._log = DeltaLog(self.store)
        return self._log

    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = self.log.snapshot()
        return self._snapshot

    def app_id_for(self, query_id: str) -> str:
        return query_id if self.app_id in (None, QUERY_ID) else self.app_id

    @property
    def follows_query_id(self) -> bool:
        """A new query id gives the restored run a new appId (``reprocess``)."""
        return self.app_id in (None, QUERY_ID)

    def recorded_batch(self, query_id: str) -> int | None:
        if not self.log.exists():
            return None  # the table is not there yet: nothing recorded
        return self.snapshot().txns.get(self.app_id_for(query_id))

    def rows_still_there(self, query_id: str, first: int, last: int) -> tuple[bool | None, str]:
        """Whether the rows batches ``first..last`` wrote are still in the table: True (some file they added is live,
        or was rewritten by OPTIMIZE), False (every one was removed by a data change: a RESTORE, a delete), None
        (not known: a commit of theirs is no longer in the log). With a sentence saying why."""
        snapshot, app_id = self.snapshot(), self.app_id_for(query_id)
        commits = self.log.txn_commits(app_id, first, last, snapshot.version)
        unknown = [b for b, c in commits.items() if c is None]
        if unknown:
            return None, (f"the table's log no longer holds the commit of batch {unknown[0]} (log cleanup), so whether "
                          "its rows are still in the table cannot be checked")
        for batch, commit in commits.items():
            assert commit is not None
            for path in commit.added:
                if path in snapshot.live:
                    return True, f"batch {batch}'s rows (commit {commit.version}, file {path}) are still in the table"
                how = self.log.removal_of(path, commit.version, snapshot.version)
                if how is None:
                    return None, f"how batch {batch}'s file {path} left the table is no longer in its log"
                if how is False:
                    return True, (f"batch {batch}'s file {path} was rewritten without a data change (OPTIMIZE): "
                                  "its rows are still in the table")
        return False, (f"the rows of batches {first}..{last} are no longer in the table (table version "
                       f"{snapshot.version}): every file their commits added was removed by a data change")


class ForeachBatchSink(DeltaSink):
    """``foreachBatch``: at least once, unless ``app_id`` says it writes Delta with ``txnAppId``/``txnVersion``."""

    kind, needs_path = "foreach_batch", False

    def __init__(self, path: str | None = None, storage_options: dict[str, Any] | None = None, app_id: str | None = None):
        Sink.__init__(self, path, storage_options, app_id)
        if app_id and not path:
            raise InvalidInputError("a foreach_batch sink with an app id needs the path of the Delta table it writes",
                                    "pass --sink-path with --sink-app-id (sink_path= with sink_app_id=)")
        self._log, self._snapshot = None, None

    @property
    def transactional(self) -> bool:
        return bool(self.app_id)

    @property
    def on_rerun(self) -> OnRerun:  # type: ignore[override]
        return "skipped" if self.transactional else "written_again"

    @property
    def follows_query_id(self) -> bool:
        return self.app_id == QUERY_ID

    def recorded_batch(self, query_id: str) -> int | None:
        return super().recorded_batch(query_id) if self.transactional else None


class KafkaSink(Sink):
    kind, on_rerun = "kafka", "written_again"


class ForeachSink(Sink):
    kind, on_rerun = "foreach", "written_again"


class OtherSink(Sink):
    kind, on_rerun = "other", "unknown"


_CLASSES: dict[str, type[Sink]] = {c.kind: c for c in (FileSink, DeltaSink, ForeachBatchSink, KafkaSink, ForeachSink, OtherSink)}


def sink_for(kind: str | None, path: str | None = None, storage_options: dict[str, Any] | None = None,
             app_id: str | None = None) -> Sink | None:
    """The sink of ``kind`` at ``path``; None when neither is given. A path with no kind is a file sink, or a
    Delta table when it holds a ``_delta_log``."""
    if kind is None:
        if not path:
            return None
        kind = "delta" if Store(path, storage_options).isdir("_delta_log") else "file"
    if kind not in _CLASSES:
        raise InvalidInputError(f"unknown sink kind {kind!r}", "use one of " + ", ".join(KINDS))
    if app_id and kind not in ("delta", "foreach_batch"):
        raise InvalidInputError(f"a {kind} sink has no app id", "--sink-app-id (sink_app_id=) is for delta and foreach_batch sinks")
    return _CLASSES[kind](path, storage_options, app_id)


def file_sink_latest_batch(sink: Store) -> int | None:
    """The newest batch id recorded in a file sink's ``_spark_metadata`` log, if any."""
    latest = None
    for path in sink.list_files("_spark_metadata"):
        name = path.split("/")[-1]
        match = formats.BATCH_FILE.match(name) or formats.COMPACT_FILE.match(name)
        if match and "/" not in path:
            latest = max(latest if latest is not None else -1, int(match.group(1)))
    return latest


__all__ = ["KINDS", "QUERY_ID", "DeltaLog", "DeltaLogError", "DeltaSink", "FileSink", "ForeachBatchSink", "ForeachSink",
           "KafkaSink", "OnRerun", "OtherSink", "Sink", "SinkReport", "file_sink_latest_batch", "sink_for"]
