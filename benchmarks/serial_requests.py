"""The serial requests of a savepoint and of a restore on S3, GCS and Azure (issue 32 item 2).

A small checkpoint in Spark's RocksDB layout (benchmarks/object_store.py's generator, ``--partitions``
partitions) lies on moto's S3 server, fake-gcs-server and Azurite (tests/support/emulators.py), each
behind the counting proxy (tests/support/fault_proxy.py, in this process) with ``--latency`` seconds
added to every request. A savepoint for a new job is taken through it, then restored to local disk and
into the store (a new checkpoint location in the same bucket), and the proxy's timeline (each request's
arrival and answer) is read: the longest chain of requests that ran one after another before the first
copy and after the last one (a copy: a server-side copy for the savepoint and the restore in the store,
a download of a file of the savepoint for the restore to local disk), each named. Below ~50 ms the
emulators' own answer times make a chain vary by one between runs.

    PYTHONPATH=$PWD python benchmarks/serial_requests.py [--latency 0.02] [--skip gcs,azure] [--json F]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import posixpath
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qsl, unquote

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import object_store as bench  # noqa: E402
from tests.support import emulators as em  # noqa: E402
from tests.support.fault_proxy import AzureCrc64, FaultProxy  # noqa: E402

Entry = tuple[float, float, str, str, str | None]  # the proxy's timeline: arrived, answered, kind, target, object
SERVICES = ("s3", "gcs", "azure")
BUCKET = "serial"


def label(entry: Entry) -> str:
    """A request as the tables name it: its kind and the object's last path part (a listing: its prefix)."""
    _, _, kind, target, name = entry
    if kind == "LIST":
        prefix = dict(parse_qsl(target.partition("?")[2])).get("prefix", "")
        return f"LIST {unquote(prefix).rstrip('/') or '(root)'}"
    return f"{kind} {posixpath.basename((name or unquote(target.partition('?')[0])).rstrip('/'))}"


def serial_chain(entries: list[Entry]) -> list[Entry]:
    """The longest chain of ``entries`` each of which arrived after the one before it was answered."""
    ordered = sorted(entries)
    best: list[list[Entry]] = []
    for i, entry in enumerate(ordered):
        before = [best[j] for j in range(i) if ordered[j][1] <= entry[0]]
        best.append([*max(before, key=len, default=[]), entry])
    return max(best, key=len, default=[])


def serial_around(timeline: list[Entry], is_copy: Callable[[Entry], bool]) -> dict:
    """The serial chains before the first copy and after the last one (a request wholly inside either side)."""
    copies = [e for e in timeline if is_copy(e)]
    first, last = min(e[0] for e in copies), max(e[1] for e in copies)
    before = serial_chain([e for e in timeline if e[1] <= first])
    after = serial_chain([e for e in timeline if e[0] >= last])
    start = min(e[0] for e in timeline)
    return {"requests": len(timeline), "copies": len(copies),
            "before_first_copy": [label(e) for e in before], "after_last_copy": [label(e) for e in after],
            "timeline": [(round((e[0] - start) * 1000), round((e[1] - start) * 1000), label(e)) for e in sorted(timeline)
                         if not is_copy(e)]}


@contextlib.contextmanager
def service(name: str, latency: float) -> Iterator[tuple[dict, FaultProxy, object]]:
    """The emulator (or moto) of ``name``, a bucket on it, and the proxy before it: (storage options, proxy, fs)."""
    import fsspec

    if name == "s3":
        import os

        from moto.server import ThreadedMotoServer

        from tests.conftest import atomic_conditional_puts

        atomic_conditional_puts()
        for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                           ("AWS_DEFAULT_REGION", "us-east-1")):
            os.environ.setdefault(key, value)
        port = em.free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        url, stop = f"http://127.0.0.1:{port}", server.stop
        options = lambda endpoint: {"endpoint_url": endpoint}  # noqa: E731
    else:
        missing = em.missing_gcs() if name == "gcs" else em.missing_azurite()
        if missing:
            raise SystemExit(f"{name}: {missing}")
        emulator = em.start_fake_gcs() if name == "gcs" else em.start_azurite()
        url, stop = emulator.url, emulator.stop
        options = em.gcs_options if name == "gcs" else \
            (lambda endpoint: {"connection_string": em.azurite_connection_string(endpoint)})
    proxy = FaultProxy(url, latency=latency, service=name)
    if name == "azure":
        proxy.add_headers = AzureCrc64(url)  # Azure's CRC64 of a synchronous copy, which Azurite does not send
    proxy.start()
    try:
        direct = fsspec.filesystem({"s3": "s3", "gcs": "gcs", "azure": "abfs"}[name], skip_instance_cache=True,
                                   **options(url))
        direct.mkdir(BUCKET)
        yield {**options(proxy.url), "skip_instance_cache": True}, proxy, direct
    finally:
        proxy.stop()
        stop()


def measure(name: str, latency: float, partitions: int, work: Path) -> dict:
    """A savepoint for a new job and its restore to local disk on ``name``, their serial chains."""
    from airflow_savepoints.core import restore_savepoint, take_savepoint
    from airflow_savepoints.core.restore import CHECKPOINT_METADATA, MANIFEST_FILE, _rewritable
    from airflow_savepoints.storage import Store

    scheme = {"s3": "s3", "gcs": "gs", "azure": "abfs"}[name]
    bench.PARTITIONS = partitions
    local = work / f"checkpoint-{name}"
    bench.write_checkpoint(local, partitions * 10)
    bench.keep_only_planned(local)
    with service(name, latency) as (options, proxy, direct):
        direct.put(str(local) + "/", f"{BUCKET}/checkpoint", recursive=True)  # straight to the store: not counted
        proxy.settled_timeline()
        proxy.reset()
        info = take_savepoint(Store(f"{scheme}://{BUCKET}/checkpoint", options), "serial", parallelism=4,
                              savepoint_dir=Store(f"{scheme}://{BUCKET}/savepoints", options), incremental=False)
        savepoint = proxy.settled_timeline()
        proxy.reset()
        restore_savepoint(info.pointer, str(work / f"restored-{name}"), parallelism=4, storage_options=options)
        restore = proxy.settled_timeline()
        proxy.reset()
        restore_savepoint(info.pointer, f"{scheme}://{BUCKET}/restored", parallelism=4, storage_options=options,
                          target_storage_options=options)
        in_store = proxy.settled_timeline()
    location = info.pointer.split("://", 1)[1].rstrip("/")
    body = {f"{location}/{e.path}" for e in info.manifest.files
            if e.path not in (CHECKPOINT_METADATA, MANIFEST_FILE) and not _rewritable(e.path)}
    account = f"{em.AZURITE_ACCOUNT}/" if name == "azure" else ""
    return {"service": name, "latency": latency, "files": len(info.manifest.files),
            "savepoint": serial_around(savepoint, lambda e: e[2] in ("COPY", "UPLOAD_PART_COPY")),
            "restore": serial_around(restore, lambda e: e[2] == "GET" and (e[4] or "").removeprefix(account) in body),
            "restore in store": serial_around(in_store, lambda e: e[2] in ("COPY", "UPLOAD_PART_COPY"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.02, help="seconds the proxy adds to every request")
    parser.add_argument("--partitions", type=int, default=6, help="state partitions of the checkpoint")
    parser.add_argument("--skip", default="", help="services to leave out (comma-separated: s3,gcs,azure)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--timeline", action="store_true", help="print every request but the copies (ms from the first)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs each request
    work, results = Path(tempfile.mkdtemp(prefix="serial-requests-")), []
    try:
        for name in (s for s in SERVICES if s not in args.skip.split(",")):
            result = measure(name, args.latency, args.partitions, work)
            results.append(result)
            for step in ("savepoint", "restore", "restore in store"):
                figures = result[step]
                print(f"{name} {step}: {figures['requests']} requests, {figures['copies']} copies")
                for side in ("before_first_copy", "after_last_copy"):
                    print(f"  {side}: {len(figures[side])}: {', '.join(figures[side])}")
                if args.timeline:
                    print("\n".join(f"    {start:6d} {end:6d} {what}" for start, end, what in figures["timeline"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
