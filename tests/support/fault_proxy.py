"""A fault-injecting HTTP proxy between an S3 client (s3fs) and a real S3 server (moto's).

Point ``endpoint_url`` at :attr:`FaultProxy.url`. Every request is forwarded to the upstream
server as is; :class:`Rule` objects decide, on a schedule, which requests instead

* get an S3 error response (``error``: 503 ``SlowDown``, 500 ``InternalError``, ... with S3's XML
  body) without reaching the server, or
* reach the server, whose response is then cut off: the status line, the headers and half the
  body are sent and the connection is closed (``drop``; a response without a body is cut off
  before its status line, after the server acted on the request).

Requests and injected faults are counted (per rule, per method) and logged.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "proxy-connection"}
ERROR_STATUS = {"SlowDown": 503, "ServiceUnavailable": 503, "InternalError": 500}


@dataclass
class Rule:
    """Which requests to fault and how.

    ``methods``: HTTP methods (None: all). ``path``: a regex searched in the request's path and
    query (None: all). ``every``: fault every Nth matching request (1: all of them). ``times``: at
    most this many faults (None: no limit). ``action``: ``error`` (answer ``code`` with its status
    instead of forwarding) or ``drop`` (forward, then cut the response off).
    """

    action: str = "error"
    code: str = "SlowDown"
    methods: set[str] | None = None
    path: str | None = None
    every: int = 1
    times: int | None = None
    seconds: float = 0.0
    matched: int = 0
    injected: int = 0
    _pattern: re.Pattern | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.action not in ("error", "drop", "delay"):
            raise ValueError(f"unknown action {self.action!r}")
        if self.every < 1:
            raise ValueError("every must be at least 1")
        self._pattern = re.compile(self.path) if self.path else None

    def decide(self, method: str, target: str) -> bool:
        """Whether this request gets the fault (counts the match; the caller holds the proxy's lock)."""
        if self.methods is not None and method not in self.methods:
            return False
        if self._pattern is not None and not self._pattern.search(target):
            return False
        self.matched += 1
        if self.times is not None and self.injected >= self.times:
            return False
        if self.matched % self.every:
            return False
        self.injected += 1
        return True


def error_body(code: str, target: str, number: int) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected fault #{number}: {code}</Message>"
        f"<Resource>{target}</Resource><RequestId>fault-{number}</RequestId></Error>"
    ).encode()


class FaultProxy:
    """A threaded forwarding proxy on 127.0.0.1 with a fault schedule (see the module docstring)."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rules: list[Rule] = []
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # by method
        self.faults: Counter[str] = Counter()  # by "<action>:<code or drop> <method>"
        self.log: list[tuple[str, str, int | str]] = []  # (method, target, status or fault)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as s3fs expects

            def log_message(self, format, *args):  # noqa: A002 - quiet
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)

    # --- control ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def set_rules(self, *rules: Rule) -> None:
        with self.lock:
            self.rules = list(rules)

    def reset(self) -> None:
        with self.lock:
            self.rules = []
            self.requests.clear()
            self.faults.clear()
            self.log.clear()

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())

    def figures(self) -> str:
        return (f"{self.total_requests} requests ({dict(sorted(self.requests.items()))}), "
                f"{self.total_faults} faults injected ({dict(sorted(self.faults.items()))})")

    # --- serving ------------------------------------------------------------------------------------
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        method, target = handler.command, handler.path
        body = _read_body(handler)
        with self.lock:
            self.requests[method] += 1
            number = self.total_requests
            fault = next((r for r in self.rules if r.decide(method, target)), None)
            if fault is not None:
                self.faults[f"{fault.action}:{fault.code if fault.action == 'error' else fault.action} {method}"] += 1
        if fault is not None and fault.action == "error":
            payload = b"" if method == "HEAD" else error_body(fault.code, target, number)
            handler.send_response(ERROR_STATUS.get(fault.code, 500))
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            self._note(method, target, f"error {fault.code}")
            return
        if fault is not None and fault.action == "delay":
            time.sleep(fault.seconds)
            fault = None
        status, reason, headers, data = self._forward(method, target, handler, body)
        if fault is not None:  # drop: the server acted; the client sees the response cut off
            self._note(method, target, "drop")
            handler.close_connection = True
            if len(data) > 1:
                handler.send_response(status, reason)
                for name, value in headers:
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        handler.send_header(name, value)
                handler.send_header("Content-Length", str(len(data)))
                handler.end_headers()
                handler.wfile.write(data[: len(data) // 2])
                handler.wfile.flush()
            _cut(handler.connection)
            return
        handler.send_response(status, reason)
        for name, value in headers:
            lower = name.lower()
            if lower in HOP_BY_HOP or (lower == "content-length" and method != "HEAD"):
                continue
            handler.send_header(name, value)
        if method != "HEAD":
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(data)
        self._note(method, target, status)

    def _note(self, method: str, target: str, outcome: int | str) -> None:
        with self.lock:
            self.log.append((method, target, outcome))

    def _forward(self, method: str, target: str, handler: BaseHTTPRequestHandler, body: bytes):
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            connection.close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _cut(connection: socket.socket) -> None:
    """Close the client's connection at once (what a crashed server or a network failure looks like)."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
