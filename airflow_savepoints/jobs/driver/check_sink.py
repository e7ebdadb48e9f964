"""An upgrade check's driver side: every streaming sink swapped for ``noop``, one batch, the result.

Imported by the in-job helper (:mod:`airflow_savepoints.jobs.driver.control`) when the driver runs
an upgrade check (:mod:`airflow_savepoints.jobs.workflows.check`)."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from typing import Any

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.core.names import CHECK_RESULT_FILE
from airflow_savepoints.core.spark_cause import spark_message
from airflow_savepoints.jobs.description.channel import CHECK_AFTER_CONF, CHECK_TIMEOUT_CONF, CHECKPOINT_CONF
from airflow_savepoints.jobs.description.trust import CHECK_SECRET_CONF, CHECK_SECRET_ENV, seal
from airflow_savepoints.storage import Store

_SWAPPED: set[str] = set()  # ids of the queries this driver started with the noop sink


def install_noop_sink() -> None:
    """From now on every ``writeStream.start()`` / ``toTable()`` of this driver writes to Spark's
    ``noop`` sink (a foreach, foreachBatch, file or table sink alike: ``format`` is the last word on
    the JVM writer), keeping its trigger, output mode and name. Its checkpoint location becomes the
    check's scratch copy (``spark.savepoints.checkpoint``) whatever the application passes, so a
    check never runs on the live checkpoint (a second query of the driver then finds the copy in use
    and fails)."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    if getattr(DataStreamWriter.start, "_savepoints_check", False):
        return
    original = DataStreamWriter.start

    def start(self, path=None, format=None, outputMode=None, partitionBy=None, queryName=None, **options):
        self.partitionBy()  # the noop sink takes no partitioning
        if scratch := self._spark.conf.get(CHECKPOINT_CONF, None):
            options["checkpointLocation"] = scratch
        query = original(self, None, "noop", outputMode, None, queryName, **options)
        _SWAPPED.add(str(query.id))
        return query

    def to_table(self, tableName, format=None, outputMode=None, partitionBy=None, queryName=None, **options):
        return start(self, None, None, outputMode, None, queryName, **options)

    start._savepoints_check = True
    DataStreamWriter.start = start
    DataStreamWriter.toTable = to_table


def run_check(query, spark, folder_url: str, poll: float = 0.5) -> dict[str, Any]:
    """In a check run, instead of waiting for ``query`` forever: wait until it commits a batch past
    the restored one, fails, or the check's timeout passes; stop it and write the outcome to
    ``result.json`` in the scratch folder, sealed with the check's secret (its environment, else its
    conf). Never raises for the query's failure: it is the result."""
    after = int(spark.conf.get(CHECK_AFTER_CONF, "-1"))
    deadline = time.monotonic() + float(spark.conf.get(CHECK_TIMEOUT_CONF, "300"))
    checkpoint = Store(spark.conf.get(CHECKPOINT_CONF))
    result: dict[str, Any] | None = None
    if str(query.id) not in _SWAPPED:
        result = {"outcome": "failed", "error": "the query was started before its sink could be swapped for noop: "
                  "import airflow_savepoints.jobs.driver.control (or call claim_run) before starting it"}
    while result is None:
        try:
            ended = query.awaitTermination(poll)
        except Exception as exc:  # noqa: BLE001 - the query's failure is what the check reports
            result = {"outcome": "failed", "error": spark_message(exc)}
            break
        batch, _ = checkpoint_progress(checkpoint)
        if batch is not None and batch > after:
            result = {"outcome": "passed", "batch_id": batch}
        elif ended:
            result = {"outcome": "failed", "error": "the query ended before it committed a batch"}
        elif time.monotonic() >= deadline:
            result = {"outcome": "no_batch", "error": f"no batch past {after} was committed in time"}
    query.stop()
    result = {**result, "query_id": str(query.id), "application_id": spark.sparkContext.applicationId,
              "spark_version": spark.version, "finished_at": datetime.now(UTC).isoformat()}
    secret = os.environ.get(CHECK_SECRET_ENV) or spark.conf.get(CHECK_SECRET_CONF, None)
    written = seal(result, secret) if secret else result  # the check counts only a sealed result
    Store(folder_url).write_bytes_atomic(CHECK_RESULT_FILE, json.dumps(written, indent=1).encode())
    return result
