"""A Delta table's transaction log, read without Spark: the snapshot and the commits a restore needs.

The log is ``<table>/_delta_log``: JSON commits ``<version:020>.json`` (one action a line) and parquet
checkpoints (``<v>.checkpoint.parquet``, or multi-part ``<v>.checkpoint.<i:010>.<n:010>.parquet``), the
newest named by ``_last_checkpoint``. The snapshot is the newest checkpoint plus the commits after it.
What a restore asks of it: the transaction version Delta recorded for an appId (its streaming sink
uses the query id and skips every batch id at or below it), the commit that recorded each txn version,
and whether the files those commits added are still in the table (a table RESTORE removes them,
``dataChange`` true; OPTIMIZE rewrites them, ``dataChange`` false: the rows are still there).
pyarrow reads the checkpoints (the ``[delta]`` extra).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

from airflow_savepoints.errors import InvalidInputError, MissingBackendError, StorageError
from airflow_savepoints.storage import Store

LOG = "_delta_log"
COMMIT = re.compile(r"^(\d{20})\.json$")
CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")


class DeltaLogError(StorageError):
    """The table's log cannot be read to the end (a gap in the commits, no checkpoint we can read)."""

    code = "delta_log_unreadable"


@dataclass
class Commit:
    """One JSON commit: the txn versions it recorded, the files it added, the files it removed (path: dataChange)."""

    version: int
    txns: dict[str, int] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    removed: dict[str, bool] = field(default_factory=dict)
    operation: str | None = None


@dataclass
class Snapshot:
    """The table at its newest version: every appId's txn version and the live files."""

    version: int
    txns: dict[str, int]
    live: set[str]
    checkpoint: int | None  # the checkpoint version it was built on (None: the commits from 0)


class DeltaLog:
    """The log of the Delta table at ``table`` (a :class:`Store` at the table's root)."""

    def __init__(self, table: Store):
        self.table = table
        self.log = table.child(LOG)
        self._commits: dict[int, Commit] = {}
        self._listing: dict[str, Any] | None = None

    def exists(self) -> bool:
        return bool(self.listing())

    def listing(self) -> dict[str, Any]:
        if self._listing is None:
            self._listing = {p: s for p, s in self.log.list_files().items() if "/" not in p} if self.log.isdir() else {}
        return self._listing

    def commit_versions(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.listing() if (m := COMMIT.match(p)))

    def commit(self, version: int) -> Commit | None:
        """The JSON commit ``version``, or None when the log no longer holds it (log cleanup)."""
        if version not in self._commits:
            name = f"{version:020d}.json"
            if name not in self.listing():
                return None
            self._commits[version] = _parse_commit(version, self.log.read_bytes(name))
        return self._commits[version]

    def snapshot(self) -> Snapshot:
        """The newest version of the table: the newest readable checkpoint, then every commit after it."""
        versions = self.commit_versions()
        if not versions:
            raise DeltaLogError(f"{self.log.url} holds no commit: not a Delta table",
                                "give the path of the Delta table the query writes (the folder holding _delta_log)")
        latest = versions[-1]
        base, txns, live = self._checkpoint_state(latest)
        start = 0 if base is None else base + 1
        missing = sorted(set(range(start, latest + 1)) - set(versions))
        if missing:
            raise DeltaLogError(
                f"{self.log.url}: commit {missing[0]} is missing and no checkpoint covers it",
                "the table's log is incomplete; check the table with Spark (DESCRIBE HISTORY) before restoring")
        for version in range(start, latest + 1):
            commit = self.commit(version)
            assert commit is not None
            txns.update(commit.txns)
            for path in commit.removed:
                live.discard(path)
            live.update(commit.added)
        return Snapshot(version=latest, txns=txns, live=live, checkpoint=base)

    def _checkpoint_state(self, latest: int) -> tuple[int | None, dict[str, int], set[str]]:
        """The newest checkpoint at or below ``latest`` that is complete here: its version, txns and live files.
        ``_last_checkpoint`` names it; a listing finds one when that file is missing or names files not here."""
        listing = self.listing()
        parts: dict[int, dict[int, set[int]]] = {}
        for path in listing:
            if m := CHECKPOINT.match(path):
                total = int(m.group(3) or 1)
                parts.setdefault(int(m.group(1)), {}).setdefault(total, set()).add(int(m.group(2) or 1))
        candidates = sorted(((v, n) for v, by_total in parts.items() for n, got in by_total.items()
                             if len(got) == n and v <= latest), reverse=True)
        hinted = self._last_checkpoint()
        if hinted is not None:  # the writer's pointer first, if its files are all here
            candidates.sort(key=lambda vn: vn != (hinted.get("version"), hinted.get("parts") or 1))
        if not candidates:
            if 0 not in self.commit_versions():
                raise DeltaLogError(
                    f"{self.log.url}: no classic parquet checkpoint here, and commit 0 is gone",
                    "a table with only V2 (UUID-named) checkpoints is not read here; check it with Spark before restoring")
            return None, {}, set()
        version, total = candidates[0]
        names = [f"{version:020d}.checkpoint.parquet"] if total == 1 and f"{version:020d}.checkpoint.parquet" in listing \
            else [f"{version:020d}.checkpoint.{i:010d}.{total:010d}.parquet" for i in range(1, total + 1)]
        txns: dict[str, int] = {}
        live: set[str] = set()
        for name in names:
            for row in _read_checkpoint(self.log, name):
                if txn := row.get("txn"):
                    txns[txn["appId"]] = txn["version"]
                if (add := row.get("add")) and add.get("path"):
                    live.add(add["path"])
        return version, txns, live

    def _last_checkpoint(self) -> dict[str, Any] | None:
        if "_last_checkpoint" not in self.listing():
            return None
        try:
            return json.loads(self.log.read_bytes("_last_checkpoint"))
        except ValueError:
            return None

    def txn_commits(self, app_id: str, first: int, last: int, newest: int) -> dict[int, Commit | None]:
        """For txn versions ``first..last`` of ``app_id``: the commit that recorded each (None: not in the log
        any more), read from the newest commit back until ``first`` is found."""
        found: dict[int, Commit | None] = dict.fromkeys(range(first, last + 1))
        for version in range(newest, -1, -1):
            commit = self.commit(version)
            if commit is None:
                break
            txn = commit.txns.get(app_id)
            if txn is not None and first <= txn <= last:
                found[txn] = commit
            if txn is not None and txn <= first:
                break
        return found

    def removal_of(self, path: str, after: int, newest: int) -> bool | None:
        """How ``path`` left the table after commit ``after``: True a data change (RESTORE, DELETE, overwrite),
        False a rewrite of the same rows (OPTIMIZE), None not seen (the commit is no longer in the log)."""
        for version in range(after + 1, newest + 1):
            commit = self.commit(version)
            if commit is None:
                return None
            if path in commit.removed:
                return commit.removed[path]
        return None


def _parse_commit(version: int, data: bytes) -> Commit:
    commit = Commit(version)
    for line in data.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if txn := action.get("txn"):
            commit.txns[txn["appId"]] = int(txn["version"])
        elif add := action.get("add"):
            commit.added.append(add["path"])
        elif remove := action.get("remove"):
            commit.removed[remove["path"]] = bool(remove.get("dataChange", True))
        elif info := action.get("commitInfo"):
            commit.operation = info.get("operation")
    return commit


def _read_checkpoint(log: Store, name: str) -> list[dict[str, Any]]:
    """The txn and add.path columns of one parquet checkpoint file, as rows."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingBackendError("reading a Delta checkpoint needs pyarrow",
                                  "pip install 'airflow-savepoints[delta]'") from exc
    parquet = pq.ParquetFile(io.BytesIO(log.read_bytes(name)))
    present = set(parquet.schema_arrow.names)
    columns = [c for c in ("txn", "add.path") if c.split(".")[0] in present]
    if not columns:
        raise InvalidInputError(f"{log.url_of(name)} is not a Delta checkpoint (no txn or add column)",
                                "give the path of the Delta table the query writes")
    return parquet.read(columns=columns).to_pylist()
