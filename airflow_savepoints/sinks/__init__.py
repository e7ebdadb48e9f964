"""What a streaming query's sink does with batches a restore makes it run again.

A restore of a savepoint at batch N into a query that already ran to batch M re-runs N+1..M with the
savepoint's query id. Each sink kind answers two things: the highest batch it has recorded for that
query id (:meth:`Sink.recorded_batch`; None when it records nothing) and what a re-run batch does in it
(:attr:`Sink.on_rerun`: ``skipped``, ``written_again`` or ``unknown``). :func:`sink_for` gives the class for
a kind, with the sink's location read through :class:`~airflow_savepoints.storage.Store` (so every store works).

- ``file``: the ``_spark_metadata`` log; a logged batch id is skipped.
- ``delta``: the table's ``txn`` action for appId = query id (``sinks/delta_log.py``); skipped.
- ``foreach_batch``: at least once, unless it writes Delta with ``txnAppId``/``txnVersion`` (``app_id``: that
  appId, or ``query_id`` when it passes the query id): then like ``delta``, under that appId.
- ``kafka``, ``foreach``: record nothing; written again.
- ``other`` (declared) or none: unknown.
"""

from __future__ import annotations

from airflow_savepoints._lazy import lazy_names

KINDS = ("file", "delta", "kafka", "foreach", "foreach_batch", "other")
QUERY_ID = "query_id"  # a foreach_batch app_id meaning: its txnAppId is the query id

_MODULE_OF = {
    **dict.fromkeys(("SinkReport", "Sink", "FileSink", "DeltaSink", "ForeachBatchSink", "KafkaSink", "ForeachSink",
                     "OtherSink", "OnRerun", "sink_for", "file_sink_latest_batch"), "kinds"),
    **dict.fromkeys(("DeltaLog", "DeltaLogError", "Snapshot"), "delta_log"),
}
__all__ = ["KINDS", "QUERY_ID", *_MODULE_OF]
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
