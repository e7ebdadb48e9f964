"""A fault-injecting HTTP proxy between an S3 client (s3fs) and a real S3 server (moto's).

Point ``endpoint_url`` at :attr:`FaultProxy.url`. Every request is forwarded to the upstream
server as is; :class:`Rule` objects decide, on a schedule, which requests instead

* get an S3 error response (``error``: 503 ``SlowDown``, 500 ``InternalError``, ... with S3's XML
  body) without reaching the server, or
* reach the server, whose response is then cut off: the status line, the headers and half the
  body are sent and the connection is closed (``drop``; a response without a body is cut off
  before its status line, after the server acted on the request).

Requests and injected faults are counted (per rule, per method, per S3 request kind: LIST, GET,
HEAD, PUT, COPY, ...) and logged, and so are the object payload bytes through the proxy (request
bodies of uploads, response bodies of object reads). ``latency`` adds that many seconds to every
request (a far-away service); ``keep_alive`` reuses one upstream connection per client connection.
``add_headers`` adds response headers an emulator does not send (:class:`AzureCrc64`, ``--azure-crc64``).

Run on its own (own process, so its work does not share a benchmark's interpreter)::

    python -m tests.support.fault_proxy --upstream http://127.0.0.1:PORT --latency 0.02 --port-file F

It writes its URL to F; ``GET /__proxy__/counts`` returns the counts as JSON, ``GET /__proxy__/log``
the request log, the payload log and each request's (arrived, answered, kind) on the proxy's clock,
and ``POST /__proxy__/reset`` clears them (none is forwarded nor counted).

The proxy forwards any HTTP service. Request kinds are S3's unless ``service`` (``--service``) says
``gcs`` (the GCS JSON API, as fake-gcs-server serves it) or ``azure`` (Azure Blob, as Azurite serves
it): see :func:`gcs_request_kind` and :func:`azure_request_kind`. Faults are answered with S3's XML
error body whatever the service.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "proxy-connection"}
ERROR_STATUS = {"SlowDown": 503, "ServiceUnavailable": 503, "InternalError": 500}
CONTROL = "/__proxy__/"


def s3_request_kind(method: str, target: str, headers) -> str:
    """What an S3 request does, from its method, path and query, and headers (for counting)."""
    path, _, query = target.partition("?")
    params = {part.split("=", 1)[0] for part in query.split("&") if part}
    bucket_only = path.strip("/").count("/") == 0
    copy = any(name.lower() == "x-amz-copy-source" for name in headers.keys())
    if method == "GET":
        return "LIST" if bucket_only and not params & {"location", "versioning", "acl"} else "GET"
    if method == "PUT" and "partNumber" in params:
        return "UPLOAD_PART_COPY" if copy else "UPLOAD_PART"
    if method == "PUT":
        return "COPY" if copy else ("CREATE_BUCKET" if bucket_only else "PUT")
    if method == "POST":
        return "DELETE_MANY" if "delete" in params else ("CREATE_MULTIPART" if "uploads" in params else
                                                         "COMPLETE_MULTIPART" if "uploadId" in params else "POST")
    return method


def gcs_request_kind(method: str, target: str, headers) -> str:
    """What a GCS JSON API request does (fake-gcs-server or GCS), named like the S3 kinds where they match:
    a ``rewriteTo``/``copyTo`` is COPY, an upload PUT (UPLOAD_START and UPLOAD_PART for a resumable
    one), a download (``alt=media``) GET, an object listing LIST, an object's metadata STAT."""
    path, _, query = target.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=True))
    if "/rewriteTo/" in path or "/copyTo/" in path:
        return "COPY"
    if path.endswith("/compose"):
        return "COMPOSE"
    if path.startswith("/batch/"):
        return "BATCH"
    if path.startswith("/upload/"):
        if method == "POST":
            return "UPLOAD_START" if params.get("uploadType") == "resumable" else "PUT"
        return "UPLOAD_PART" if method == "PUT" else method
    objects = re.search(r"/b/[^/]+/o(/.*)?$", path)
    if objects is None:  # buckets: /storage/v1/b, /storage/v1/b/<bucket>
        return {"GET": "STAT_BUCKET" if re.search(r"/b/[^/]+$", path) else "LIST_BUCKETS",
                "POST": "CREATE_BUCKET", "DELETE": "DELETE_BUCKET"}.get(method, method)
    if objects.group(1) is None:  # /b/<bucket>/o: a listing (GET) or an upload without /upload (POST)
        return "LIST" if method == "GET" else ("PUT" if method == "POST" else method)
    if method == "GET":
        return "GET" if params.get("alt") == "media" or path.startswith("/download/") else "STAT"
    return {"PATCH": "PATCH", "PUT": "PATCH", "DELETE": "DELETE"}.get(method, method)


def azure_request_kind(method: str, target: str, headers) -> str:
    """What an Azure Blob request does (Azurite or Azure; path-style ``/<account>/<container>/<blob>``
    or ``/<container>/<blob>``), named like the S3 kinds: Copy Blob COPY, Put Blob PUT, Put Block
    UPLOAD_PART, Put Block List COMPLETE_MULTIPART, a container listing LIST, Get Blob GET, Get Blob
    Properties HEAD."""
    _, _, query = target.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=True))
    comp, container = params.get("comp"), params.get("restype") == "container"
    names = {name.lower() for name in headers.keys()}
    if method == "PUT":
        if "x-ms-copy-source" in names:
            return "UPLOAD_PART_COPY" if comp == "block" else "COPY"
        if comp == "block":
            return "UPLOAD_PART"
        if comp == "blocklist":
            return "COMPLETE_MULTIPART"
        if container and comp is None:
            return "CREATE_BUCKET"
        return f"PUT_{comp.upper()}" if comp else "PUT"
    if method == "GET":
        if comp == "list":
            return "LIST" if container else "LIST_BUCKETS"
        if container or comp:
            return f"STAT_{'BUCKET' if container else comp.upper()}"
        return "GET"
    if method == "POST" and comp == "batch":
        return "DELETE_MANY"
    if method == "DELETE" and container:
        return "DELETE_BUCKET"
    return method


REQUEST_KINDS = {"s3": s3_request_kind, "gcs": gcs_request_kind, "azure": azure_request_kind}


def path_object_name(target: str, body: bytes = b"") -> str:
    """The object a path-style request names: its path without the leading ``/``, unquoted (S3:
    ``bucket/key``; Azurite: ``account/container/blob``)."""
    return unquote(target.partition("?")[0].lstrip("/"))


def gcs_object_name(target: str, body: bytes = b"") -> str | None:
    """``bucket/key`` of the object a GCS JSON API request reads or writes (a copy: its destination; a
    multipart upload: the name in its metadata part), or None (listings, buckets)."""
    path, _, query = target.partition("?")
    objects = re.findall(r"/b/([^/]+)/o/([^/]+)", path)
    if objects:
        bucket, key = objects[-1]
        return f"{unquote(bucket)}/{unquote(key)}"
    bucket = re.search(r"/b/([^/]+)/o$", path)
    if bucket is None:
        return None
    params = dict(parse_qsl(query, keep_blank_values=True))
    named = params.get("name") or (_json_name(body) if body else None)
    return f"{unquote(bucket.group(1))}/{named}" if named else None


def _json_name(body: bytes) -> str | None:
    found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body[:8192])
    return json.loads(b'"' + found.group(1) + b'"') if found else None


OBJECT_NAMES = {"s3": path_object_name, "gcs": gcs_object_name, "azure": path_object_name}


def body_bytes(body: bytes, headers) -> int:
    return len(body)


def gcs_upload_bytes(body: bytes, headers) -> int:
    """The object bytes of a GCS upload: a multipart upload's media part (its last part, without its
    headers), else the whole body."""
    found = re.search(r'boundary="?([^";]+)"?', headers.get("Content-Type") or "")
    parts = body.split(b"--" + found.group(1).encode()) if found else []
    if len(parts) < 4:  # the preamble, the metadata, the media, the closing "--"
        return len(body)
    media = parts[-2]
    head = re.match(rb"(?s)\r?\n?.*?\r?\n\r?\n", media)
    data = media[head.end():] if head else media
    return len(data) - (2 if data.endswith(b"\r\n") else 1 if data.endswith(b"\n") else 0)


UPLOAD_BYTES = {"s3": body_bytes, "gcs": gcs_upload_bytes, "azure": body_bytes}


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


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # many clients connect at once (s5cmd opens hundreds)


class FaultProxy:
    """A threaded forwarding proxy on 127.0.0.1 with a fault schedule (see the module docstring)."""

    def __init__(self, upstream: str, *, latency: float = 0.0, keep_alive: bool = False, service: str = "s3"):
        parts = urlsplit(upstream)
        self.request_kind = REQUEST_KINDS[service]  # how requests are told apart for counting (S3 by default)
        self.object_name = OBJECT_NAMES[service]
        self.upload_bytes = UPLOAD_BYTES[service]  # the object bytes in an upload's body
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.latency, self.keep_alive = latency, keep_alive
        self._upstream_connections = threading.local()
        self.rules: list[Rule] = []
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # by method
        self.kinds: Counter[str] = Counter()  # by S3 request kind (s3_request_kind)
        self.payload_bytes: Counter[str] = Counter()  # "sent" (uploads) and "received" (object reads)
        self.faults: Counter[str] = Counter()  # by "<action>:<code or drop> <method>"
        self.log: list[tuple[str, str, int | str]] = []  # (method, target, status or fault)
        # ("sent" or "received", target, payload bytes, the object's name: see OBJECT_NAMES)
        self.payload_log: list[tuple[str, str, int, str | None]] = []
        self.request_log: list[tuple[str, str, str | None]] = []  # (kind, target, object name) as requests arrive
        # (arrived, answered, kind, target, object name): monotonic seconds, the added latency and delays included
        self.timeline: list[tuple[float, float, str, str, str | None]] = []
        # (method, target, request headers, status) -> headers added to the response: what an emulator lacks
        self.add_headers: Callable[[str, str, Any, int], dict[str, str]] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as s3fs expects
            # TCP_NODELAY: a response body written after its headers is sent at once, not held by Nagle
            # until the client's delayed ACK of the headers (~40 ms added to every response with a body)
            disable_nagle_algorithm = True

            def log_message(self, format, *args):  # noqa: A002 - quiet
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

        self.server = _Server(("127.0.0.1", 0), Handler)
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
            self.kinds.clear()
            self.payload_bytes.clear()
            self.faults.clear()
            self.log.clear()
            self.payload_log.clear()
            self.request_log.clear()
            self.timeline.clear()

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())

    def settled_timeline(self, timeout: float = 10.0) -> list:
        """``timeline`` once every request that arrived is in it (a request is noted just after its answer)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                timeline, arrived = list(self.timeline), len(self.request_log)
            if len(timeline) >= arrived or time.monotonic() > deadline:
                return timeline
            time.sleep(0.02)

    def counts(self) -> dict:
        """The counts as plain JSON-able data."""
        with self.lock:
            return {"requests": self.total_requests, "by_method": dict(self.requests), "by_kind": dict(self.kinds),
                    "payload_bytes": dict(self.payload_bytes), "faults": dict(self.faults)}

    def figures(self) -> str:
        return (f"{self.total_requests} requests ({dict(sorted(self.requests.items()))}), "
                f"{self.total_faults} faults injected ({dict(sorted(self.faults.items()))})")

    # --- serving ------------------------------------------------------------------------------------
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        method, target = handler.command, handler.path
        body = _read_body(handler)
        if target.startswith(CONTROL):
            self._control(handler, target[len(CONTROL):])
            return
        kind, arrived = self.request_kind(method, target, handler.headers), time.monotonic()
        with self.lock:
            self.requests[method] += 1
            self.kinds[kind] += 1
            self.request_log.append((kind, target, self.object_name(target, body)))
            if kind in ("PUT", "UPLOAD_PART"):
                size = self.upload_bytes(body, handler.headers)
                self.payload_bytes["sent"] += size
                self.payload_log.append(("sent", target, size, self.object_name(target, body)))
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
            self._note(method, target, f"error {fault.code}", (arrived, kind, body))
            return
        if fault is not None and fault.action == "delay":
            time.sleep(fault.seconds)
            fault = None
        if self.latency:
            time.sleep(self.latency)
        status, reason, headers, data = self._forward(method, target, handler, body)
        if kind == "GET" and 200 <= status < 300:
            with self.lock:
                self.payload_bytes["received"] += len(data)
                self.payload_log.append(("received", target, len(data), self.object_name(target)))
        if fault is not None:  # drop: the server acted; the client sees the response cut off
            self._note(method, target, "drop", (arrived, kind, body))
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
        added = self.add_headers(method, target, handler.headers, status) if self.add_headers else {}
        for name, value in [*headers, *added.items()]:
            lower = name.lower()
            if lower in HOP_BY_HOP or (lower == "content-length" and method != "HEAD"):
                continue
            handler.send_header(name, value)
        if method != "HEAD":
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(data)
        self._note(method, target, status, (arrived, kind, body))

    def _note(self, method: str, target: str, outcome: int | str, request: tuple[float, str, bytes]) -> None:
        arrived, kind, body = request
        answered = time.monotonic()
        with self.lock:
            self.log.append((method, target, outcome))
            self.timeline.append((arrived, answered, kind, target, self.object_name(target, body)))

    def _control(self, handler: BaseHTTPRequestHandler, command: str) -> None:
        if command == "reset":
            self.reset()
        if command == "log":  # the request log (method, target, status), the requests by kind, the payloads
            with self.lock:
                payload = json.dumps({"log": self.log, "requests": self.request_log, "payload": self.payload_log,
                                      "timeline": [(arrived, answered, kind) for arrived, answered, kind, *_ in self.timeline]
                                      }).encode()
        else:
            payload = json.dumps(self.counts()).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _forward(self, method: str, target: str, handler: BaseHTTPRequestHandler, body: bytes):
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        if self.keep_alive:
            connection = getattr(self._upstream_connections, "connection", None)
            if connection is not None:
                try:
                    return _exchange(connection, method, target, body, headers)
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    connection.close()  # the server closed the idle connection before reading: send again
            connection = self._upstream_connections.connection = http.client.HTTPConnection(*self.upstream, timeout=60)
            return _exchange(connection, method, target, body, headers)
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            return _exchange(connection, method, target, body, headers)
        finally:
            connection.close()


def _exchange(connection: http.client.HTTPConnection, method: str, target: str, body: bytes, headers: dict):
    connection.request(method, target, body=body, headers=headers)
    response = connection.getresponse()
    data = response.read()
    return response.status, response.reason, response.getheaders(), data


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


class AzureCrc64:
    """What Azurite lacks (Azure/Azurite#444): Azure's ``x-ms-content-crc64`` on a synchronous copy
    (Copy Blob From URL), the CRC64 of the copy as Azurite stored it, read straight from Azurite (not
    through the proxy, so not counted). ``wrong``: answer a value off by one, a fault. Use as
    :attr:`FaultProxy.add_headers`."""

    def __init__(self, azurite_url: str, wrong: bool = False):
        from azure.storage.extensions import checksums

        from tests.support.emulators import azurite_blob_service

        self.service = azurite_blob_service(azurite_url)
        self.crc64, self.wrong, self.answered = checksums.crc64, wrong, 0

    def __call__(self, method: str, target: str, headers, status: int) -> dict[str, str]:
        if method != "PUT" or status != 202 or "x-ms-copy-source" not in headers \
                or str(headers.get("x-ms-requires-sync", "")).lower() != "true":
            return {}
        _account, container, blob = unquote(target.partition("?")[0]).lstrip("/").split("/", 2)
        value = self.crc64.compute(self.service.get_blob_client(container, blob).download_blob().readall(), 0)
        self.answered += 1
        value = (value + self.wrong) % (1 << 64)
        return {"x-ms-content-crc64": base64.b64encode(value.to_bytes(8, "little")).decode()}


def main() -> None:
    parser = argparse.ArgumentParser(description="a counting, delaying HTTP proxy in front of an object store")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--service", choices=sorted(REQUEST_KINDS), default="s3",
                        help="whose requests to tell apart by kind (default: s3)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    parser.add_argument("--port-file", required=True, help="where to write the proxy's URL once it listens")
    parser.add_argument("--azure-crc64", action="store_true",
                        help="add Azure's x-ms-content-crc64 to synchronous copies (Azurite does not send it)")
    args = parser.parse_args()
    proxy = FaultProxy(args.upstream, latency=args.latency, keep_alive=True, service=args.service)
    if args.azure_crc64:
        proxy.add_headers = AzureCrc64(args.upstream)
    with open(args.port_file + ".tmp", "w") as out:
        out.write(proxy.url)
    os.replace(args.port_file + ".tmp", args.port_file)
    proxy.server.serve_forever()


def _cut(connection: socket.socket) -> None:
    """Close the client's connection at once (what a crashed server or a network failure looks like)."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


if __name__ == "__main__":
    main()
