"""Before a restore: are the input files the restored query will read still there?

A file source (Spark's FileStreamSource) records in ``sources/<i>/`` which input files each of its
log batches holds, and each ``offsets/<b>`` names the log batch (``logOffset``) a query batch read up
to. Everything up to the ``logOffset`` of the savepoint's committed batch N is consumed. A savepoint
that includes ``offsets/N+1`` also holds the log entries up to that batch's ``logOffset``: the
restored query re-runs N+1 and reads exactly those files, so they must still exist (Spark fails on a
missing one, or silently skips it with ``spark.sql.files.ignoreMissingFiles``). Files that appear in
the input folder later are not in any log and are not checked.

A Kafka source records per topic and partition the offset a batch read up to: the restored query
starts reading at the offsets of the savepoint's committed batch N (the manifest's
``source_offsets``). Each must lie between the partition's earliest and newest offsets now; records
before the earliest were deleted (retention, ``deleteRecords``), an offset past the newest means the
topic was made again. Spark fails on either (``failOnDataLoss``) or, with ``failOnDataLoss=false``,
skips them. The check asks the brokers with kafka-python (the ``kafka`` extra), no Spark needed.
"""

from __future__ import annotations

import logging
import posixpath
from collections import defaultdict
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core.models import SavepointManifest
from airflow_savepoints.errors import InputCheckFailedError, KafkaOffsetsGoneError, MalformedFileError, MissingInputError
from airflow_savepoints.storage import Store
from airflow_savepoints.storage.known_files import parse_json

SHOWN = 10
log = logging.getLogger(__name__)


def pending_input_files(location: Store, manifest: SavepointManifest) -> list[str]:
    """URIs of the input files the savepoint's file-source logs list past its committed batch."""
    paths = {e.path for e in manifest.files}
    if not manifest.includes_next_offsets or f"offsets/{manifest.batch_id + 1}" not in paths:
        return []
    committed = formats.parse_offsets(location.read_known(f"offsets/{manifest.batch_id}", "spark_log"))
    planned = formats.parse_offsets(location.read_known(f"offsets/{manifest.batch_id + 1}", "spark_log"))
    pending: list[str] = []
    for source, offset in sorted(planned.sources.items()):
        last = formats.file_source_log_offset(offset)
        if last is None:
            continue
        done = formats.file_source_log_offset(committed.sources.get(source))
        after = -1 if done is None else done
        pending += logged_input_files(location, paths, f"sources/{source}", after, last)
    return sorted(set(pending))


def logged_input_files(location: Store, paths: set[str], folder: str, after: int, last: int) -> list[str]:
    """The ``path`` of every entry with ``after < batchId <= last`` in the log files the savepoint holds."""
    found: list[str] = []
    for path in sorted(p for p in paths if p.startswith(folder + "/") and p.count("/") == 2):
        name = path.rsplit("/", 1)[-1]
        match = formats.BATCH_FILE.match(name) or formats.COMPACT_FILE.match(name)
        if not match or int(match.group(1)) <= after:
            continue  # a log file up to the committed batch lists only consumed files
        where = location.url_of(path)
        for number, line in enumerate(location.read_known(path, "spark_source_log").decode("utf-8", "replace")
                                      .splitlines()[1:], start=2):
            entry = parse_json(line, f"{where} line {number}") if line.strip().startswith("{") else {}
            if not isinstance(entry, dict):
                raise MalformedFileError(f"{where} line {number} is not a JSON object",
                                         "the savepoint's file-source log is damaged; use another savepoint")
            batch = entry.get("batchId")
            if isinstance(entry.get("path"), str) and isinstance(batch, int) and after < batch <= last:
                found.append(entry["path"])
    return found


def missing_input_files(uris: list[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """The ``uris`` that do not exist now (one listing per folder)."""
    by_folder: dict[str, list[str]] = defaultdict(list)
    for uri in uris:
        by_folder[posixpath.dirname(uri)].append(uri)
    missing: list[str] = []
    for folder, members in sorted(by_folder.items()):
        store = Store(unquote(folder), storage_options)
        present = store.stat_files([unquote(posixpath.basename(u)) for u in members]) if store.isdir() else {}
        missing += [u for u in members if unquote(posixpath.basename(u)) not in present]
    return missing


def savepoint_kafka_offsets(manifest: SavepointManifest) -> dict[str, dict[int, int]]:
    """Where the restored query's Kafka sources start: topic -> partition -> offset (the lowest, if two
    sources read one topic)."""
    return formats.merged_kafka_offsets(manifest.source_offsets)


@dataclass(frozen=True)
class KafkaGap:
    """A partition whose records from ``offset`` on are no longer all in Kafka."""

    topic: str
    partition: int
    offset: int
    earliest: int | None = None  # None: the partition no longer exists
    latest: int | None = None

    def describe(self) -> str:
        where = f"topic {self.topic} partition {self.partition}"
        if self.earliest is None or self.latest is None:
            return f"{where} no longer exists (the savepoint resumes at offset {self.offset})"
        if self.offset < self.earliest:
            return (f"{where}: the savepoint resumes at offset {self.offset}, the earliest offset is now {self.earliest} "
                    f"({self.earliest - self.offset} record(s) deleted)")
        return (f"{where}: the savepoint resumes at offset {self.offset}, past the newest offset {self.latest} "
                "(was the topic deleted and made again?)")


def kafka_bounds(offsets: dict[str, dict[int, int]], bootstrap_servers: str, client_options: dict[str, Any] | None = None,
                 ) -> dict[tuple[str, int], tuple[int, int] | None]:
    """The (earliest, latest) offsets the brokers hold now of each partition of ``offsets`` (topic -> partition
    -> offset); None for a partition that no longer exists. Raises ImportError without kafka-python, and
    kafka-python's ``KafkaError``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False, **(client_options or {}))
    try:
        bounds: dict[tuple[str, int], tuple[int, int] | None] = {}
        for topic, partitions in sorted(offsets.items()):
            known = consumer.partitions_for_topic(topic) or set()
            present = [TopicPartition(topic, p) for p in sorted(partitions) if p in known]
            earliest = consumer.beginning_offsets(present) if present else {}
            latest = consumer.end_offsets(present) if present else {}
            for partition in sorted(partitions):
                tp = TopicPartition(topic, partition)
                bounds[(topic, partition)] = (earliest[tp], latest[tp]) if partition in known else None
        return bounds
    finally:
        consumer.close()


def kafka_gaps(offsets: dict[str, dict[int, int]], bootstrap_servers: str,
               client_options: dict[str, Any] | None = None) -> list[KafkaGap]:
    """The partitions of ``offsets`` whose records from that offset on are not all in Kafka now."""
    try:
        from kafka.errors import KafkaError
    except ImportError:
        raise InputCheckFailedError(
            "checking the savepoint's Kafka offsets needs kafka-python, which is not installed",
            "pip install 'airflow-savepoints[kafka]', or restore with skip_missing_input=True (--skip-missing-input) "
            "to start without the check; nothing was restored") from None
    try:
        bounds = kafka_bounds(offsets, bootstrap_servers, client_options)
        gaps: list[KafkaGap] = []
        for topic, partitions in sorted(offsets.items()):
            for partition, offset in sorted(partitions.items()):
                held = bounds[(topic, partition)]
                if held is None:
                    gaps.append(KafkaGap(topic, partition, offset))
                elif not held[0] <= offset <= held[1]:
                    gaps.append(KafkaGap(topic, partition, offset, *held))
        return gaps
    except KafkaError as exc:
        raise InputCheckFailedError(
            f"could not read the earliest offsets of the savepoint's Kafka topics from {bootstrap_servers}: {exc!r}",
            "check the bootstrap servers and the client options, or restore with skip_missing_input=True "
            "(--skip-missing-input) to start without the check; nothing was restored") from exc


def check_kafka_offsets(location: Store, manifest: SavepointManifest, bootstrap_servers: str | None,
                        client_options: dict[str, Any] | None = None) -> None:
    """Refuse a restore whose Kafka sources would start at records Kafka no longer has, naming each gap."""
    offsets = savepoint_kafka_offsets(manifest)
    if not offsets:
        return
    if not bootstrap_servers:
        log.warning("savepoint %s resumes Kafka topics %s; give kafka_bootstrap_servers to check their records are "
                    "still there", location.url, ", ".join(sorted(offsets)))
        return
    gaps = kafka_gaps(offsets, bootstrap_servers, client_options)
    if gaps:
        shown = "; ".join(g.describe() for g in gaps[:SHOWN]) + (f" (+{len(gaps) - SHOWN} more)" if len(gaps) > SHOWN else "")
        raise KafkaOffsetsGoneError(
            f"savepoint {location.url} resumes Kafka at offsets it no longer has: {shown}",
            "restore a newer savepoint, or accept the loss: restore with skip_missing_input=True (--skip-missing-input) "
            "and start the query with the Kafka option failOnDataLoss=false; nothing was restored",
        )


def check_input(location: Store, manifest: SavepointManifest, storage_options: dict[str, Any] | None,
                kafka_bootstrap_servers: str | None = None, kafka_options: dict[str, Any] | None = None) -> None:
    """Refuse a restore whose re-run batch would read input files that are gone, or Kafka records that were
    deleted, naming them."""
    check_kafka_offsets(location, manifest, kafka_bootstrap_servers, kafka_options)
    missing = missing_input_files(pending_input_files(location, manifest), storage_options)
    if missing:
        shown = ", ".join(missing[:SHOWN]) + (f" (+{len(missing) - SHOWN} more)" if len(missing) > SHOWN else "")
        raise MissingInputError(
            f"{len(missing)} input file(s) that batch {manifest.batch_id + 1} of savepoint {location.url} "
            f"will read again are gone: {shown}",
            "put the files back, or restore with skip_missing_input=True (--skip-missing-input) and start "
            "the query with spark.sql.files.ignoreMissingFiles=true (their rows are then lost); nothing was restored",
        )
