"""Count the payload bytes that pass through this process to and from S3, per operation and key.

Hooks botocore's own events on an s3fs filesystem's client: request bodies sent (PutObject,
UploadPart, ...) and object bodies received (GetObject's ContentLength). Nothing is faked: the
requests still go to the real (moto) server.
"""

from __future__ import annotations

import threading
from collections import defaultdict


def _body_size(body) -> int:
    if body is None:
        return 0
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    if hasattr(body, "getbuffer"):
        return body.getbuffer().nbytes
    if hasattr(body, "seek") and hasattr(body, "tell"):
        here = body.tell()
        end = body.seek(0, 2)
        body.seek(here)
        return end - here
    return len(body) if hasattr(body, "__len__") else 0


class PayloadCounter:
    """``sent[key]``/``received[key]``: payload bytes per object key; ``operations``: calls by name."""

    def __init__(self, fs):
        fs.connect()
        self._events = fs.s3.meta.events
        self._lock = threading.Lock()
        self.sent: dict[str, int] = defaultdict(int)
        self.received: dict[str, int] = defaultdict(int)
        self.operations: dict[str, int] = defaultdict(int)
        self._events.register("before-parameter-build.s3", self._before)
        self._events.register("after-call.s3", self._after)

    def _before(self, params, model, context=None, **_):
        key = f"{params.get('Bucket', '')}/{params.get('Key', '')}"
        if isinstance(context, dict):
            context["payload_key"] = key  # the same dict reaches after-call as ``context``
        with self._lock:
            self.operations[model.name] += 1
            self.sent[key] += _body_size(params.get("Body"))

    def _after(self, parsed, model, context=None, **_):
        if model.name == "GetObject":
            with self._lock:
                key = (context or {}).get("payload_key") or model.name
                self.received[key] += int(parsed.get("ContentLength") or 0)

    def reset(self) -> None:
        with self._lock:
            self.sent.clear()
            self.received.clear()
            self.operations.clear()

    def total_sent(self, under: str = "") -> int:
        return sum(n for k, n in self.sent.items() if k.startswith(under))

    def total_received(self) -> int:
        return sum(self.received.values())

    def close(self) -> None:
        self._events.unregister("before-parameter-build.s3", self._before)
        self._events.unregister("after-call.s3", self._after)
