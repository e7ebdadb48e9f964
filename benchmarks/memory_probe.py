"""Peak resident memory while one file is copied: ``python benchmarks/memory_probe.py SRC DST MODE``.

Copies ``SRC/big`` into the folder DST with ``copy_file(mode=MODE)`` and prints one JSON line:
``baseline`` and ``peak`` resident bytes (``/proc/self/statm``, sampled every 2 ms), the copied
``size`` and the ``method`` used. Used by benchmarks/run.py and tests/test_fast_copy.py.
"""

import json
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_savepoints.core.copier import copy_file  # noqa: E402
from airflow_savepoints.storage import Store  # noqa: E402


def rss() -> int:
    """Resident set size now, anonymous and file-backed pages alike."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(src: str, dst: str, mode: str) -> None:
    baseline, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            done.wait(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    copied = copy_file(Store(src), "big", Store(dst), mode=mode)
    done.set()
    sampler.join()
    print(json.dumps({"baseline": baseline, "peak": max(peak[0], rss()), "size": copied.size, "method": copied.method}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
