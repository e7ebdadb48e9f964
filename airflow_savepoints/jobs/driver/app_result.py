"""What a job's one-off Spark application (the rescale, the inspection) leaves for its caller: ``result.json``
in a folder the caller gave, read back by :func:`airflow_savepoints.jobs.workflows.rescale.read_result`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from airflow_savepoints.core.names import CHECK_RESULT_FILE as RESULT_FILE
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs.description import trust
from airflow_savepoints.storage import Store


def app_secret(spark: Any) -> str:
    """The secret the caller gave this application (its environment, else the redacted conf); empty: none."""
    return os.environ.get(trust.APP_SECRET_ENV) or spark.conf.get(trust.APP_SECRET_CONF, "")


def run_and_report(spark: Any, result_folder: str, work: Callable[[], dict[str, Any]],
                   unexpected: Callable[[Exception], SavepointError]) -> int:
    """``work()``'s result (its ``outcome`` and figures), or ``{"outcome": "failed", "error": ...}`` for a typed
    error (``unexpected(exc)`` for any other), with the application's id and Spark version, written to
    ``result_folder``, sealed with the caller's secret (:func:`app_secret`); Spark stopped. The exit status: 0
    unless failed."""
    secret = app_secret(spark)
    facts = {"application_id": spark.sparkContext.applicationId, "spark_version": spark.version}
    try:
        result = work()
    except SavepointError as exc:
        result = {"outcome": "failed", "error": exc.to_dict()}
    except Exception as exc:  # noqa: BLE001 - anything else is reported with its words, as the caller's error type
        result = {"outcome": "failed", "error": unexpected(exc).to_dict()}
    finally:
        stopped = _stop_spark_side(spark)
    result = {**result, **facts, "finished_at": datetime.now(UTC).isoformat()}
    if secret:
        result = trust.seal(result, secret)
    Store(result_folder).write_bytes_atomic(RESULT_FILE, json.dumps(result, indent=1).encode())
    if stopped:
        spark.stop()
    return 1 if result["outcome"] == "failed" else 0


def _stop_spark_side(spark: Any) -> bool:
    """Stop the JVM's SparkContext (its jobs, executors and state stores: nothing of Spark writes after it), and
    say whether PySpark's own stop is still to come: its accumulator server ends on its next poll (up to 0.5 s),
    which the result need not wait for. If that stop fails, the whole ``spark.stop()`` is done now instead."""
    try:
        spark.sparkContext._jsc.stop()
    except Exception:  # noqa: BLE001 - a gateway in trouble: PySpark's stop handles it
        spark.stop()
        return False
    return True
