"""Input that keeps arriving while a test acts on a running demo job."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import airflow_savepoints.demo.app as demo


class Feeder:
    """Input arriving while an upgrade runs (a file every ``every`` seconds), as a live stream's would:
    a new version is healthy only once it commits a batch past the stop batch."""

    def __init__(self, folder: Path, sent: set[int], next_index: int, every: float = 2.0) -> None:
        self.folder, self.sent, self.index, self.every = folder, sent, next_index, every
        self._done = threading.Event()
        self._paused = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        while not self._done.wait(self.every):
            if self._paused.is_set():
                continue
            self.sent.update(demo.write_events(self.folder, self.index))
            self.index += 1

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def wait_for_sink(output: Path, expected: list[int], timeout: float = 180) -> list[int]:
    """The event ids the demo job's file sink committed, once they equal ``expected`` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while (got := demo.committed_event_ids(output)) != expected and time.monotonic() < deadline:
        time.sleep(1)
    return got
