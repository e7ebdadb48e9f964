"""Plan the minimal set of checkpoint files that restores committed micro-batch N.

The planner works from ONE listing of the live checkpoint (path -> size and version token) plus a
reader for the handful of small files whose content decides the plan (``metadata``, ``offsets/N``,
``commits/N``, operator metadata, RocksDB snapshot zips). It never lists twice, so the plan is
consistent with that one listing (on a local disk the listing reads names; the planned files are
stat'ed together once the plan is known, those it reads when it adds them: a file gone by then is
a race, as if unlisted); the copier later checks the files did not change.

Rules (docs/savepoint-format.md explains each one):

* N is the newest batch with both ``offsets/N`` and ``commits/N``.
* Always: ``metadata``, the newest ``offsets/<b>`` with b < N, ``offsets/N``, ``commits/N``.
* If ``offsets/N+1`` exists (batch N+1 is planned but not committed), it is included, so that a
  restore re-runs N+1 with the same offsets, exactly as Spark's own crash recovery does.
* Each file source's log up to the offset recorded for it (the two newest compact files <= L, then
  L's tail: Spark derives the log's compact interval from the two newest);
  other sources' folders whole.
* State version V = N+1 for every operator, partition and store: HDFS snapshot + deltas; RocksDB
  zip + changelogs + the SSTs/logs the zip lists (checkpoint format v1 and v2); per-store schema
  files, operator metadata, transformWithState metadata v2 and the schema files it names; Spark
  ``.crc`` sidecars of selected files. Never temp files or Hadoop's hidden ``.crc`` files.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter, methodcaller
from typing import Any, NamedTuple

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.errors import (
    CheckpointError,
    CheckpointRaceError,
    NoCommittedBatchError,
    NotACheckpointError,
)
from airflow_savepoints.storage import FileStat

Reader = Callable[[str], bytes]

# Copy order: sources first (Spark purges old file-source logs soonest), then state, then the
# offset/commit logs, and the checkpoint's ``metadata`` file last.
GROUP_SOURCES, GROUP_STATE, GROUP_LOGS, GROUP_METADATA = 0, 1, 2, 3
METADATA = formats.METADATA_FILE


class PlannedFile(NamedTuple):  # one per planned file: a tuple is made in a fraction of a frozen dataclass's time
    """A file the plan takes, as the listing gave it."""

    path: str
    size: int
    version: str
    group: int
    sidecar_of: str | None = None  # for Spark .crc sidecars: the main file they check
    expected_size: int | None = None  # a size the checkpoint itself promises (RocksDB zip metadata)


@dataclass
class CheckpointPlan:
    """What to copy for batch ``batch_id`` and what the checkpoint says about itself."""

    batch_id: int
    query_id: str
    includes_next_offsets: bool
    includes_next_state: bool
    files: list[PlannedFile]
    offset_log_version: int
    commit_log_version: int
    checkpoint_format_version: int
    state_store_provider: str | None
    changelog_checkpointing: bool | None
    source_offsets: dict[str, Any]
    spark_conf: dict[str, str] = field(default_factory=dict)
    operators: list[str] = field(default_factory=list)
    snapshots: dict[str, dict[str, int]] = field(default_factory=dict)  # RocksDB zip -> the files it lists

    @property
    def total_bytes(self) -> int:
        return sum([f.size for f in self.files])


# A snapshot zip's listed version token and the files it lists (store-relative path -> size, -1 unknown)
KnownSnapshot = tuple[str, dict[str, int]]


class _PlanInputs:
    """Reads the files whose content decides the plan. A RocksDB snapshot zip whose listed version
    is one the caller already knows the content of (a previous savepoint's manifest) is not read
    again; every zip's file list is kept for the new manifest."""

    def __init__(self, read: Reader, listing: Mapping[str, FileStat], known: Mapping[str, KnownSnapshot],
                 pending: Mapping[str, Future[bytes]] | None = None):
        self.read, self.listing, self.known = read, listing, known
        self.snapshots: dict[str, dict[str, int]] = {}
        self.pending: dict[str, Future[bytes]] = dict(pending or {})  # reads already under way
        self.gathering = False  # a read not under way raises _ReadFirst (see _StatePlanner.plan)

    def __call__(self, path: str) -> bytes:
        future = self.pending.pop(path, None)
        if future is not None:
            return future.result()
        if self.gathering:
            raise _ReadFirst(path)
        return self.read(path)

    def prefetch(self, paths: list[str], parallelism: int) -> None:
        """Read ``paths`` together, ``parallelism`` at a time (one request each on an object store), when reads
        may run in parallel; returns once all are read (a failed read fails where the plan reads it)."""
        wanted = [p for p in dict.fromkeys(paths) if p not in self.pending]
        if parallelism > 1 and len(wanted) > 1:
            self.read_together(wanted, parallelism)

    def read_together(self, paths: list[str], parallelism: int) -> None:
        """Read ``paths``, ``parallelism`` at a time, and keep what each read gave (its error too) for the
        plan to take; one path is read in this thread."""
        if len(paths) == 1:
            future: Future[bytes] = Future()
            try:
                future.set_result(self.read(paths[0]))
            except Exception as exc:  # noqa: BLE001 - raised where the plan reads it
                future.set_exception(exc)
            self.pending[paths[0]] = future
            return
        with ThreadPoolExecutor(max_workers=min(parallelism, len(paths)), thread_name_prefix="plan") as pool:
            self.pending.update({p: pool.submit(self.read, p) for p in paths})

    def snapshot(self, zip_path: str) -> dict[str, int]:
        """The files ``zip_path`` lists: known, or read once (a store planned again takes what it read before)."""
        if (files := self.snapshots.get(zip_path)) is not None:
            return files
        known = self.known.get(zip_path)
        if known is not None and known[0] == self.listing[zip_path].version:
            files = dict(known[1])
        else:
            files = formats.parse_rocksdb_zip(self(zip_path), zip_path).files
        self.snapshots[zip_path] = files
        return files


class _ReadFirst(BaseException):  # noqa: N818 - a signal, not an error: no ``except Exception`` may take it
    """Planning a store needs ``path``'s content, which is not read yet."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


class _VisibleFiles(Mapping[str, FileStat]):
    """The listing without temp files and hidden ``.crc`` files; stats are looked up only when
    asked for (a lazy local listing then stats only what the plan needs, all at once). ``folders``:
    the files directly in each folder, indexed once (the planner looks up folders, never scans every
    name); taken from the listing's own ``folders`` where it kept them (a local scan does)."""

    def __init__(self, listing: Mapping[str, FileStat]):
        self._listing = listing
        self._confirm = getattr(listing, "confirm", listing.get)  # a local listing's entry as stat'ed, not expected
        listed_folders: dict[str, list[str]] | None = getattr(listing, "folders", None)
        self.folders: dict[str, list[str]] = {}
        folders = self.folders
        if listed_folders is not None:
            for folder, paths in listed_folders.items():
                if folder and formats.is_transient_path(folder):
                    continue
                visible = formats.visible_in_folder(paths, len(folder) + 1 if folder else 0)
                if visible:
                    folders[folder] = visible
            self._paths = self.names = dict.fromkeys(chain.from_iterable(folders.values()))
            return
        self._paths = self.names = dict.fromkeys(formats.visible_paths(listing))  # names: ``in`` without a call
        for path in self._paths:
            folder = path.rpartition("/")[0]
            files = folders.get(folder)
            if files is None:
                folders[folder] = [path]
            else:
                files.append(path)

    def stats_of(self, paths: Iterable[str]) -> list[FileStat | None]:
        """The listed entry of each of ``paths`` (all visible), None for a file gone since it was listed."""
        stats_of = getattr(self._listing, "stats_of", None)
        return stats_of(paths) if stats_of is not None else list(map(self._listing.get, paths))

    def confirm(self, path: str) -> FileStat | None:
        """The listed entry of ``path`` as measured (``LazyLocalListing.confirm``), for a file read next."""
        return self._confirm(path) if path in self._paths else None

    def __getitem__(self, path: str) -> FileStat:
        if path not in self._paths:
            raise KeyError(path)
        return self._listing[path]

    def get(self, path: str, default: FileStat | None = None) -> FileStat | None:  # type: ignore[override]
        """``Mapping.get`` without its try/except (asked once per planned file)."""
        return self._listing.get(path, default) if path in self._paths else default

    def __contains__(self, path: object) -> bool:
        return path in self._paths

    def __iter__(self):
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


def _int_names(listing: _VisibleFiles, folder: str) -> dict[int, str]:
    """Batch-numbered files directly in ``folder`` (``offsets/12`` -> {12: "offsets/12"})."""
    found: dict[int, str] = {}
    start = len(folder) + 1
    for path in listing.folders.get(folder, ()):
        name = path[start:]
        if formats.BATCH_FILE.match(name):
            found[int(name)] = path
    return found


# A planned path's group, the main file of a Spark sidecar and the size the checkpoint promises: its
# ``PlannedFile`` once every planned file is stat'ed (``_planned_files``)
_Pending = tuple[int, "str | None", "int | None"]


def _collector(listing: _VisibleFiles, into: dict[str, _Pending], purpose: str):
    """An ``add(path, group)`` that records a listed file in ``into``; an unlisted file is a race. Its stat
    is taken with all the others (``_planned_files``: a file gone by then is a race too), or ``now``, for
    a file the planner reads next."""

    names, confirm = listing.names, listing.confirm

    def add(path: str, group: int, expected_size: int | None = None, *, now: bool = False) -> None:
        if path not in names or (now and confirm(path) is None):
            raise CheckpointRaceError(f"{purpose}: '{path}' is not there")
        into[path] = (group, None, expected_size)

    return add


def _planned_files(listing: _VisibleFiles, planned: dict[str, _Pending], purpose: str, where: str) -> list[PlannedFile]:
    """Every planned file with its listed size and version, in copy order; one gone since the listing is a race."""
    files = []
    for (path, (group, sidecar_of, expected_size)), stat in zip(planned.items(), listing.stats_of(planned), strict=True):
        if stat is None:
            raise CheckpointRaceError(f"{where}: '{path}' vanished while planning" if sidecar_of is not None
                                      else f"{purpose}: '{path}' is not there")
        files.append(PlannedFile(path, stat.size, stat.version, group, sidecar_of, expected_size))
    files.sort(key=attrgetter("group", "path"))
    return files


def plan_checkpoint(listing: Mapping[str, FileStat], read: Reader, *, where: str = "the checkpoint",
                    parallelism: int = 1, known_snapshots: Mapping[str, KnownSnapshot] | None = None,
                    pending: Mapping[str, Future[bytes]] | None = None) -> CheckpointPlan:
    """Plan the savepoint of the newest committed batch of the checkpoint described by ``listing``.

    The RocksDB snapshot zips the state stores need are read ``parallelism`` at a time: on an object store
    those reads (one request each) dominate planning; the planning itself is one thread's.
    ``known_snapshots``: zips whose content is known for a version token; one still listed with that
    token is not read. ``pending``: reads the caller started already (by path). With ``parallelism``
    above 1, the metadata and the batch's logs are read together."""
    listing = _VisibleFiles(listing)
    read = _PlanInputs(read, listing, known_snapshots or {}, pending)
    offsets, commits = _int_names(listing, "offsets"), _int_names(listing, "commits")
    n = _newest_committed(listing, offsets, commits, where)
    read.prefetch([METADATA, *_batch_logs(offsets, commits, n)], parallelism)
    planned: dict[str, _Pending] = {}
    purpose = f"{where}: needed for batch {n}"
    add = _collector(listing, planned, purpose)

    query_id = formats.parse_stream_metadata(read(METADATA))
    add(METADATA, GROUP_METADATA)
    add(offsets[n], GROUP_LOGS, now=True)
    add(commits[n], GROUP_LOGS, now=True)
    earlier = [b for b in offsets if b < n]
    if earlier:
        add(offsets[max(earlier)], GROUP_LOGS)
    elif n > 0:
        raise CheckpointError(
            f"{where}: offsets/{n - 1} is gone, so Spark could not restart batch {n}",
            "the checkpoint was purged too far (minBatchesToRetain); it cannot be saved as a savepoint",
        )
    offset_n = formats.parse_offsets(read(offsets[n]), f"offsets/{n}")
    commit_n = formats.parse_commit(read(commits[n]), f"commits/{n}")
    next_batch = n + 1 if (n + 1) in offsets else None
    offsets_for_sources = offset_n
    if next_batch is not None:
        add(offsets[next_batch], GROUP_LOGS, now=True)
        offsets_for_sources = formats.parse_offsets(read(offsets[next_batch]), f"offsets/{next_batch}")

    _plan_sources(listing, offsets_for_sources, add, where)
    ckpt_format = 2 if commit_n.state_unique_ids else 1
    state = _StatePlanner(listing, read, commit_n, where, parallelism)
    operators = state.plan(n + 1, add)
    next_state = False
    if next_batch is not None and operators and ckpt_format == 1:
        next_state = _plan_next_state(listing, state, n + 2, planned, where)
    _add_sidecars(listing, planned)
    return CheckpointPlan(
        batch_id=n, query_id=query_id, includes_next_offsets=next_batch is not None, includes_next_state=next_state,
        files=_planned_files(listing, planned, purpose, where),
        offset_log_version=offset_n.version, commit_log_version=commit_n.version, checkpoint_format_version=ckpt_format,
        state_store_provider=offset_n.conf.get("spark.sql.streaming.stateStore.providerClass"),
        changelog_checkpointing=any(map(methodcaller("endswith", ".changelog"), planned)) if operators else None,
        source_offsets=offset_n.sources, spark_conf=offset_n.conf, operators=operators,
        snapshots={p: read.snapshots[p] for p in sorted(read.snapshots) if p in planned},
    )


def _batch_logs(offsets: dict[int, str], commits: dict[int, str], n: int) -> list[str]:
    """The logs a plan of batch ``n`` reads first: its offsets and commit, and the next batch's offsets if listed."""
    return [offsets[n], commits[n], *([offsets[n + 1]] if (n + 1) in offsets else [])]


class FirstReads:
    """A head start for the reads a plan begins with (``_batch_logs`` of the newest committed batch), while the
    checkpoint is still being listed: called with each page of a listing in key order (``Store.list_files_lazily``'s
    ``on_page``), it starts them with ``start`` once a page reaches past every ``offsets/`` name, and keeps
    them in ``started`` (by path) for the plan's ``pending``. The plan decides from the whole listing and reads
    what it needs that was not started; a listing out of key order at worst starts reads the plan does not take."""

    def __init__(self, start: Callable[[str], Future[bytes]]):
        self.start = start
        self.started: dict[str, Future[bytes]] = {}
        self._logs: dict[str, FileStat] = {}
        self._done = False

    def __call__(self, page: Mapping[str, FileStat]) -> None:
        if self._done or not page:
            return
        self._logs.update((p, s) for p, s in page.items() if p.startswith(("offsets/", "commits/")))
        if max(page) < "offsets0":  # "offsets/..." < "offsets0": later pages may list more of them
            return
        self._done = True
        logs = _VisibleFiles(self._logs)
        offsets, commits = _int_names(logs, "offsets"), _int_names(logs, "commits")
        if committed := set(offsets) & set(commits):
            self.started = {path: self.start(path) for path in _batch_logs(offsets, commits, max(committed))}


def _newest_committed(listing: Mapping[str, FileStat], offsets: dict[int, str], commits: dict[int, str],
                      where: str) -> int:
    """N: the newest batch with both ``offsets/N`` and ``commits/N``, in a checkpoint that has its ``metadata``."""
    if METADATA not in listing and not offsets:
        raise NotACheckpointError(
            f"{where} is not a Spark streaming checkpoint: it has no 'metadata' file and no 'offsets/' folder",
            "point at the query's checkpointLocation (the folder holding metadata, offsets/, commits/)",
        )
    committed = sorted(set(offsets) & set(commits))
    if not committed:
        raise NoCommittedBatchError(
            f"{where} has no committed micro-batch yet (no batch with both offsets/N and commits/N)",
            "wait until the query has committed its first batch, then try again",
        )
    if METADATA not in listing:
        raise CheckpointError(
            f"{where} has offsets and commits but no 'metadata' file (the query id)",
            "a checkpoint without it cannot be restarted with its identity; restore it from a savepoint instead",
        )
    return committed[-1]


def _add_sidecars(listing: _VisibleFiles, planned: dict[str, _Pending]) -> None:
    """Spark's own checksum sidecars travel only together with their main file."""
    names = listing.names
    for path in list(planned):
        sidecar = path + formats.SPARK_SIDECAR_SUFFIX
        if sidecar in names and sidecar not in planned:
            planned[sidecar] = (planned[path][0], path, None)


def _plan_next_state(listing, state: _StatePlanner, version: int, planned: dict[str, _Pending], where) -> bool:
    """Add state version N+2 if EVERY store has it complete (batch N+1's tasks all finished).

    Then a restore behaves exactly like Spark's crash recovery even when the sink had already
    committed N+1: Spark re-runs N+1, a file sink skips it, and batch N+2 finds its state. If any
    store lacks version N+2, nothing of it is taken (the sink cannot have committed N+1 then).
    """
    extra: dict[str, _Pending] = {}
    add = _collector(listing, extra, f"{where}: state version {version}")
    try:
        state.plan(version, add)
    except (CheckpointRaceError, CheckpointError):
        return False
    if None in listing.stats_of(extra):  # a file of it gone since the listing
        return False
    for path, file in extra.items():
        planned.setdefault(path, file)
    return True


# --- sources ---------------------------------------------------------------------------------------
def _plan_sources(listing: _VisibleFiles, offset_entry: formats.OffsetEntry, add, where: str) -> None:
    by_source: dict[str, list[str]] = defaultdict(list)
    for folder, paths in listing.folders.items():
        if folder.startswith("sources/"):
            by_source[folder.split("/")[1]].extend(paths)
    for source, paths in sorted(by_source.items()):
        log_offset = formats.file_source_log_offset(offset_entry.sources.get(source))
        if source in offset_entry.sources and offset_entry.sources[source] is None:
            continue  # the source has no offset yet: nothing of its log is committed
        if log_offset is None:
            for path in paths:  # Kafka, rate and unknown sources: the folder whole (tiny)
                add(path, GROUP_SOURCES)
            continue
        _plan_file_source_log(listing, f"sources/{source}", log_offset, add, where)


def _plan_file_source_log(listing: _VisibleFiles, folder: str, last: int, add, where: str) -> None:
    plain = _int_names(listing, folder)
    compact: dict[int, str] = {}
    for path in listing.folders.get(folder, ()):
        match = formats.COMPACT_FILE.match(path[len(folder) + 1 :])
        if match:
            compact[int(match.group(1))] = path
    bases = sorted(c for c in compact if c <= last)
    start = 0
    for base in bases[-2:]:  # Spark takes the interval from the two newest; from one alone it guesses
        add(compact[base], GROUP_SOURCES)
        start = base + 1
    missing = [b for b in range(start, last + 1) if b not in plain]
    if missing:
        raise CheckpointRaceError(
            f"{where}: file-source log {folder} lacks entries {missing[:5]} needed up to {last}"
        )
    for batch in range(start, last + 1):
        add(plain[batch], GROUP_SOURCES)


# --- state -----------------------------------------------------------------------------------------
_STORE_CONTENT = ("_metadata", "SSTs", "logs")


def _store_folders(op_folders: list[str], op_folder: str, files_in: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Group an operator's partition folders by store folder (``state/0/1`` or ``state/0/1/left-…``): each
    store's files that ``_plan_store`` looks at, those directly in it and its ``_metadata/`` (its schema);
    its ``SSTs/`` and ``logs/`` come with the snapshots that list them."""
    stores: dict[str, list[str]] = defaultdict(list)
    start = len(op_folder) + 1
    for folder in op_folders:
        rest = folder[start:].split("/") if folder != op_folder else []
        if not rest or not rest[0].isdigit():
            continue
        default_store = len(rest) == 1 or rest[1] in _STORE_CONTENT
        store = "/".join([op_folder, rest[0]] if default_store else [op_folder, rest[0], rest[1]])
        inside, files = rest[1 if default_store else 2 :], stores[store]  # the folder, relative to its store
        if not inside or inside[0] == "_metadata":
            files.extend(files_in[folder])
    return stores


class _StatePlanner:
    """Plans every operator's state for one version; with ``parallelism`` above 1, the snapshot zips the
    stores need are read that many at a time (``_plan_gathering_reads``)."""

    def __init__(self, listing: _VisibleFiles, read: _PlanInputs, commit: formats.CommitEntry, where: str,
                 parallelism: int):
        self.listing, self.read, self.commit, self.where = listing, read, commit, where
        self.parallelism = max(1, parallelism)
        by_operator: dict[str, list[str]] = defaultdict(list)  # operator -> its folders holding files
        for folder in listing.folders:
            if folder.startswith("state/"):
                op = folder.split("/", 2)[1]
                if op.isdigit():
                    by_operator[op].append(folder)
        self.stores = {op: sorted(_store_folders(folders, f"state/{op}", listing.folders).items())
                       for op, folders in sorted(by_operator.items())}

    def plan(self, version: int, add) -> list[str]:
        """Add what restores state ``version`` of every operator; returns the operators."""
        stores: list[tuple[str, list[str], set[str]]] = []
        for op, op_stores in self.stores.items():
            _plan_operator_metadata(self.listing, self.read, op, f"state/{op}", version, add, self.where)
            unique_ids = self.commit.state_unique_ids.get(op)
            for store, files in op_stores:
                stores.append((store, files, _committed_ids(unique_ids, store.split("/")[2])))

        if self.parallelism <= 1:
            for store, files, ids in stores:
                _plan_store(self.listing, self.read, store, files, version, ids, add, self.where)
        else:
            self._plan_gathering_reads(stores, version, add)
        return list(self.stores)

    def _plan_gathering_reads(self, stores: list[tuple[str, list[str], set[str]]], version: int, add) -> None:
        """Plan every store in this thread; the zips they need that are not known are read together
        (``parallelism`` at a time), then the stores that needed them are planned again, until none needs a
        read. Planning itself is Python on the listing: threads would only add their start-up (milliseconds
        each on a busy interpreter) to it. The first failure in store order is raised, as when planned one
        after another (``add`` only records paths, so planning a store twice adds the same entries)."""
        read = self.read
        waiting = list(enumerate(stores))
        first_failure: tuple[int, BaseException] | None = None
        while waiting:
            again: list[tuple[int, tuple[str, list[str], set[str]], str]] = []  # (index, store, the path it needs)
            read.gathering = True
            try:
                for index, job in waiting:
                    if first_failure is not None and index > first_failure[0]:
                        break  # an earlier store failed: nothing after it is planned
                    try:
                        _plan_store(self.listing, read, job[0], job[1], version, job[2], add, self.where)
                    except _ReadFirst as first:
                        again.append((index, job, first.path))
                    except Exception as exc:  # noqa: BLE001 - raised below, once every earlier store is planned
                        first_failure = (index, exc)
            finally:
                read.gathering = False
            if first_failure is not None:
                again = [entry for entry in again if entry[0] < first_failure[0]]
            if again:
                read.read_together(list(dict.fromkeys(path for _, _, path in again)), self.parallelism)
            waiting = [(index, job) for index, job, _ in again]
        if first_failure is not None:
            raise first_failure[1]


def _committed_ids(unique_ids, partition: str) -> set[str]:
    """The unique ids commits/N records for ``partition`` of an operator (format v2), else none."""
    if unique_ids is None:
        return set()
    try:
        return set(unique_ids[int(partition)])
    except (IndexError, ValueError, TypeError):
        return set()


def _plan_operator_metadata(listing, read, op, op_folder, version, add, where) -> None:
    v1 = f"{op_folder}/_metadata/metadata"
    if v1 in listing:
        add(v1, GROUP_STATE)
    v2_folder = f"{op_folder}/_metadata/v2"
    v2 = _int_names(listing, v2_folder)
    usable = [b for b in v2 if b <= version]
    if not usable:
        return
    chosen = v2[max(usable)]
    add(chosen, GROUP_STATE, now=True)
    body = formats.parse_operator_metadata_v2(read(chosen), chosen)
    marker = f"/{op}/_stateSchema/"
    for uri in formats.schema_file_paths(body):
        if marker not in uri:
            raise CheckpointError(f"{where}: {chosen} names an unexpected schema file {uri!r}",
                                  "please report this checkpoint layout")
        add(f"{op_folder}/_stateSchema/" + uri.split(marker, 1)[1], GROUP_STATE)


# ``<digits>.<kind>``, the usual names, classified as ``formats.STATE_FILE`` would: kind -> HDFS kind, RocksDB v1 kind
_PLAIN_KINDS = {"delta": "delta", "snapshot": "snapshot", "metadata": "metadata", "zip": None, "changelog": None}
_ROCKS_KINDS = {"zip": "zip", "changelog": "changelog"}


def _plan_store(listing, read, store: str, files: list[str], version: int, ids: set[str], add, where) -> None:
    hdfs: dict[int, dict[str, list[str]]] = {}  # version -> kind -> paths (plain dicts: a store has dozens of names)
    rocks_v1: dict[int, dict[str, str]] = {}  # version -> kind -> path
    rocks_v2: dict[int, dict[str, dict[str, str]]] = {}  # version -> kind -> unique id -> path
    start, match = len(store) + 1, formats.STATE_FILE.match
    for path in files:
        name = path[start:]
        stem, _, kind = name.rpartition(".")
        if kind in _PLAIN_KINDS and stem.isdigit() and stem.isascii():  # "7.delta", "7.zip": the pattern's answer
            v, hdfs_kind, v1_kind, unique_id, v2_kind = stem, _PLAIN_KINDS[kind], _ROCKS_KINDS.get(kind), None, None
        elif name.startswith("_metadata/"):
            add(path, GROUP_STATE)  # per-store schema
            continue
        elif "/" in name or name.endswith(formats.SPARK_SIDECAR_SUFFIX) or (m := match(name)) is None:
            continue
        else:
            v, hdfs_kind, v1_kind, unique_id, v2_kind = m.groups()
        if hdfs_kind:
            kinds = hdfs.setdefault(int(v), {})
            if hdfs_kind in kinds:
                kinds[hdfs_kind].append(path)
            else:
                kinds[hdfs_kind] = [path]
        elif v1_kind:
            rocks_v1.setdefault(int(v), {})[v1_kind] = path
        else:
            rocks_v2.setdefault(int(v), {}).setdefault(v2_kind, {})[unique_id] = path
    if rocks_v2 and ids:
        _plan_rocksdb_v2(listing, read, store, rocks_v2, version, ids, add, where)
    elif rocks_v1 or rocks_v2:
        flat = rocks_v1 or {v: {k: next(iter(d.values())) for k, d in kinds.items()} for v, kinds in rocks_v2.items()}
        _plan_rocksdb_v1(listing, read, store, flat, version, add, where)
    elif hdfs:
        _plan_hdfs(store, hdfs, version, add, where)
    # a store folder with no version files at all holds only schema files (already added)


def _plan_hdfs(store, files: dict[int, dict[str, list[str]]], version: int, add, where) -> None:
    snapshots = sorted((v for v in files if "snapshot" in files[v] and v <= version), reverse=True)
    for base in [*snapshots, 0]:
        deltas = range(base + 1, version + 1)
        if all("delta" in files.get(v, {}) for v in deltas):
            if base:
                for path in files[base]["snapshot"]:
                    add(path, GROUP_STATE)
            for v in deltas:
                for path in files[v]["delta"] + files[v].get("metadata", []):
                    add(path, GROUP_STATE)
            return
    raise CheckpointRaceError(f"{where}: state store {store} cannot load version {version} "
                              f"(no snapshot with a complete chain of deltas)")


def _add_rocksdb_snapshot(listing, read, store, zip_path, add) -> None:
    add(zip_path, GROUP_STATE, now=True)
    prefix = store + "/"
    for rel, size in read.snapshot(zip_path).items():
        add(prefix + rel, GROUP_STATE, size if size >= 0 else None)


def _plan_rocksdb_v1(listing, read, store, files: dict[int, dict[str, str]], version, add, where) -> None:
    zips = sorted((v for v in files if "zip" in files[v] and v <= version), reverse=True)
    for base in zips:
        chain = range(base + 1, version + 1)
        if all("changelog" in files.get(v, {}) for v in chain):
            _add_rocksdb_snapshot(listing, read, store, files[base]["zip"], add)
            for v in chain:
                add(files[v]["changelog"], GROUP_STATE)
            return
    chain = range(1, version + 1)
    if all("changelog" in files.get(v, {}) for v in chain):  # changelogs from the start, no snapshot yet
        for v in chain:
            add(files[v]["changelog"], GROUP_STATE)
        return
    raise CheckpointRaceError(f"{where}: RocksDB store {store} cannot load version {version} "
                              f"(no snapshot zip with a complete chain of changelogs)")


def _plan_rocksdb_v2(listing, read, store, files, version, ids: set[str], add, where) -> None:
    """Checkpoint format v2: follow the committed unique id of version V back to its snapshot.

    Conservative: from V down, every changelog and zip of each version is taken (a few small extra
    files at most), so the lineage is always covered. The walk stops at a version whose files all
    belong to ONE attempt that has a zip: the lineage passes through it. A zip of an abandoned task
    attempt (another unique id at the same version) is not a stop: the lineage may go further back.
    """
    at_v = files.get(version, {})
    committed = [uid for uid in ids if uid in at_v.get("zip", {}) or uid in at_v.get("changelog", {})]
    if not committed:
        raise CheckpointRaceError(f"{where}: RocksDB store {store} has no file for committed version "
                                  f"{version} with unique id {sorted(ids)}")
    uid = committed[0]
    if uid in at_v.get("zip", {}):
        _add_rocksdb_snapshot(listing, read, store, at_v["zip"][uid], add)
        if uid in at_v.get("changelog", {}):
            add(at_v["changelog"][uid], GROUP_STATE)
        return
    add(at_v["changelog"][uid], GROUP_STATE)
    v = version - 1
    zips_taken = False
    while v >= 1:
        kinds = files.get(v, {})
        for path in kinds.get("changelog", {}).values():
            add(path, GROUP_STATE)
        for path in kinds.get("zip", {}).values():
            _add_rocksdb_snapshot(listing, read, store, path, add)
        if kinds.get("zip") and len(set(kinds.get("zip", {})) | set(kinds.get("changelog", {}))) == 1:
            return
        zips_taken = zips_taken or bool(kinds.get("zip"))
        if not kinds and zips_taken:
            return  # purged below a version whose zips were all taken: one of them starts the lineage
        if not kinds:
            raise CheckpointRaceError(f"{where}: RocksDB store {store} lacks version {v} of the lineage "
                                      f"of version {version}")
        v -= 1
    # lineage reaches back to version 1 with changelogs only: nothing more to take
