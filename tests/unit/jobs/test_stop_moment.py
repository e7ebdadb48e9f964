"""When a cooperative stop may end a query that looks idle: not between two batches run back to back."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from airflow_savepoints.jobs.driver.control import _may_be_between_back_to_back_batches

INTERVAL_MS = 300
MARGIN_MS = 120


def progress_of_a_batch(started_ms: float, took_ms: int) -> dict:
    """The progress Spark reports for a batch: its trigger's start and duration."""
    stamp = datetime.fromtimestamp(started_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"timestamp": stamp, "durationMs": {"triggerExecution": took_ms}}


def interval_start(intervals_ago: int) -> float:
    now_ms = time.time() * 1000
    return (now_ms // INTERVAL_MS - intervals_ago) * INTERVAL_MS


def test_a_batch_that_overran_its_next_trigger_and_just_ended_means_the_next_starts_at_once():
    progress = progress_of_a_batch(interval_start(2) + 10, took_ms=2 * INTERVAL_MS)
    assert _may_be_between_back_to_back_batches(progress, INTERVAL_MS, MARGIN_MS)


def test_a_batch_that_ended_within_the_margin_of_its_next_trigger_counts_as_overrun():
    progress = progress_of_a_batch(interval_start(1) + 10, took_ms=INTERVAL_MS - 10 - MARGIN_MS + 5)
    assert _may_be_between_back_to_back_batches(progress, INTERVAL_MS, MARGIN_MS)


def test_a_batch_that_ended_well_before_its_next_trigger_leaves_a_real_wait():
    progress = progress_of_a_batch(interval_start(1) + 10, took_ms=50)
    assert not _may_be_between_back_to_back_batches(progress, INTERVAL_MS, MARGIN_MS)


def test_an_overrun_long_past_no_longer_counts():
    progress = progress_of_a_batch(interval_start(20) + 10, took_ms=2 * INTERVAL_MS)
    assert not _may_be_between_back_to_back_batches(progress, INTERVAL_MS, MARGIN_MS)


def test_a_query_with_no_batch_yet_is_not_between_batches():
    assert not _may_be_between_back_to_back_batches(None, INTERVAL_MS, MARGIN_MS)
