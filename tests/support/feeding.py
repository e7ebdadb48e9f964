"""Input that keeps arriving while a test acts on a running demo job."""

from __future__ import annotations

import time
from pathlib import Path

import airflow_savepoints.demo.app as demo
from airflow_savepoints.demo.app import Feeder

__all__ = ["Feeder", "wait_for_sink"]


def wait_for_sink(output: Path, expected: list[int], timeout: float = 180) -> list[int]:
    """The event ids the demo job's file sink committed, once they equal ``expected`` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while (got := demo.committed_event_ids(output)) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    return got
