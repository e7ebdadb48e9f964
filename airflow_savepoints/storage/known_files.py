"""The files of known names read from shared storage, and how much of each is ever read.

Anyone who may write the savepoint folder can put a folder, a FIFO, a link to ``/dev/zero`` or
``"[" * 200000`` where one of these files belongs. :meth:`Store.read_known` reads a file of a kind
below only if it is a regular file (locally: opened without following a link, without blocking on
a FIFO, checked with ``fstat``; an object store: no key prefix in its place) no larger than its
cap (read at most cap + 1 bytes), and :func:`parse_json` parses JSON with a depth guard. Each
fault is a typed error naming the file (``errors.UnsafeFileError``).
"""

from __future__ import annotations

import json
from typing import Any

from airflow_savepoints.errors import MalformedFileError

MiB = 1024 * 1024

# kind -> the largest file of that kind ever read (bytes). Generous: a real file is far smaller.
CAPS: dict[str, int] = {
    "manifest": 256 * MiB,  # _metadata: every file of a savepoint (a few hundred bytes each)
    "catalog": 256 * MiB,  # _catalog.json: one record per savepoint of the job
    "lease": 1 * MiB,  # _inflight.json, _lease.json, _catalog.lock, _restore.lease, <lease>.break
    "run_file": 1 * MiB,  # _run.json, _watchdog.json, the control folder's files (heartbeat.json, ...)
    "check_result": 16 * MiB,  # _check/<id>/result.json, _rescale/<id>/result.json
    "state_summary": 64 * MiB,  # _state_summaries/<id>.json
    "spark_metadata": 1 * MiB,  # a checkpoint's ``metadata`` (the query id)
    "spark_log": 256 * MiB,  # offsets/N, commits/N, operator metadata, state schemas, .crc sidecars
    "spark_source_log": 1024 * MiB,  # sources/<i>/<N>[.compact]: a compacted file-source log lists every file
}


def cap_of(kind: str) -> int:
    """The cap of ``kind`` (a KeyError names an unknown kind: a bug)."""
    return CAPS[kind]


def parse_json(data: bytes | str, where: str) -> Any:
    """``data`` parsed as JSON; not UTF-8, not JSON or nested deeper than the parser's guard (the
    interpreter's recursion limit, about 1,000 levels: ``"[" * 200000`` stops there) is a
    :class:`MalformedFileError` naming ``where``, never a RecursionError."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    except UnicodeDecodeError as exc:
        raise MalformedFileError(f"{where} is not valid JSON: not UTF-8 text", "the file is damaged or foreign: remove or "
                                 "replace it") from exc
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise MalformedFileError(f"{where} nests JSON deeper than any file of ours",
                                 "the file is damaged or forged: remove or replace it") from exc
    except ValueError as exc:
        raise MalformedFileError(f"{where} is not valid JSON: {exc}", "the file is damaged or foreign: remove or "
                                 "replace it") from exc
