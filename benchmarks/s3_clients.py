"""The S3 client on the copy hot path, side by side: ``python benchmarks/s3_clients.py [--files 800] [--latency 0.02] [--json F]``.

Issue 43 item 1 asks whether a cheaper client than s3fs (botocore's request pipeline) should carry a
savepoint's server-side copies. Every client here copies the same planned files of the medium
synthetic checkpoint (benchmarks/object_store.py: RocksDB layout, 800 files) on moto's S3 server,
behind the counting proxy that adds ``latency`` to each request, at our default parallelism:

* ``ours``: the product's copy (``copy_many``: thread pool, s3fs ``CopyObject`` with
  ``CopySourceIfMatch`` = the listed ETag and ``ChecksumAlgorithm=CRC32C``, the copy's CRC32C kept);
* ``aiobotocore gather``: the same request (same guard, same checksum) issued as coroutines on s3fs's
  own event loop, no thread pool: what the thread hop and fsspec's sync wrapper cost;
* ``obstore``: ``obstore.copy_async`` (Rust's object_store) gathered at the same concurrency. Its copy
  takes no source precondition and returns nothing (no ETag, no checksum): it cannot keep the ETag
  guard nor the CRC32C of the copy, so it is measured as the floor of a cheaper client, not a
  candidate as it stands. Skipped when obstore is not importable (``pip install obstore``);
* ``s5cmd`` at the same worker count (``make bench`` installs it into .tools/peers).

Figures per client: wall seconds, CPU seconds of the copying process (user + system, all its threads;
s5cmd's from its own rusage), requests counted at the proxy, CPU milliseconds per request, and the
ratio of each wall time to s5cmd's in this same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.object_store import (  # noqa: E402
    KEYS,
    PEER_ENV,
    Moto,
    Proxy,
    _s5cmd_savepoint,
    keep_only_planned,
    log,
    our_parallelism,
    peer_tools,
    write_checkpoint,
)


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _measured(proxy: Proxy, step, who: int = resource.RUSAGE_SELF) -> dict:
    proxy.reset()
    cpu, start = _cpu(who), time.perf_counter()
    step()
    wall, cpu = time.perf_counter() - start, _cpu(who) - cpu
    counts = proxy.counts()
    requests = counts["requests"]
    return {"seconds": round(wall, 3), "cpu_s": round(cpu, 3), "requests": requests,
            "requests_by_kind": counts["by_kind"], "cpu_ms_per_request": round(1000 * cpu / max(requests, 1), 3)}


def ours(src, dst, planned: list[str], parallelism: int) -> None:
    from airflow_savepoints.core.copier import CopyOptions, copy_many

    stats = src.stat_files(planned)  # the listed ETags the guard sends (not counted: listed before)
    return lambda: copy_many(src, dst, planned, CopyOptions(parallelism=parallelism), stats=stats)


def gathered(src, dst, planned: list[str], parallelism: int):
    """The product's request, as coroutines on s3fs's loop (one thread, no pool)."""
    from fsspec.asyn import sync

    stats = src.stat_files(planned)
    fs, bucket = dst.fs, dst.path_of("").split("/", 1)[0]
    src_prefix, dst_prefix = src.path_of("").split("/", 1)[1], dst.path_of("").split("/", 1)[1]

    async def run() -> None:
        gate = asyncio.Semaphore(parallelism)

        async def one(rel: str) -> None:
            async with gate:
                out = await fs._call_s3("copy_object", Bucket=bucket, Key=f"{dst_prefix}/{rel}",
                                        CopySource={"Bucket": bucket, "Key": f"{src_prefix}/{rel}"},
                                        CopySourceIfMatch=stats[rel].etag, ChecksumAlgorithm="CRC32C")
                assert out["CopyObjectResult"].get("ChecksumCRC32C"), rel

        await asyncio.gather(*(one(rel) for rel in planned))

    return lambda: sync(fs.loop, run)


def obstore_copies(endpoint: str, bucket: str, planned: list[str], parallelism: int, target: str):
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=endpoint, access_key_id=KEYS["key"], secret_access_key=KEYS["secret"],
                    region="us-east-1", virtual_hosted_style_request=False, client_options={"allow_http": True})

    async def run() -> None:
        gate = asyncio.Semaphore(parallelism)

        async def one(rel: str) -> None:
            async with gate:
                await obstore.copy_async(store, f"checkpoint/{rel}", f"{target}/{rel}")

        await asyncio.gather(*(one(rel) for rel in planned))

    return lambda: asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=800)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=2, help="each client this many times; the best is reported")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from airflow_savepoints.storage import Store

    work = Path(tempfile.mkdtemp(prefix="s3-clients-"))
    moto, proxy = Moto(), None
    try:
        local = work / "checkpoint"
        write_checkpoint(local, args.files)
        keep_only_planned(local)
        bucket = "clients"
        direct = Store(f"s3://{bucket}", {"endpoint_url": moto.url, **KEYS})
        direct.fs.mkdir(bucket)
        direct.fs.put(str(local) + "/", f"{bucket}/checkpoint", recursive=True)
        planned = sorted(p.removeprefix(f"{bucket}/checkpoint/") for p in direct.fs.find(f"{bucket}/checkpoint"))
        proxy = Proxy(moto.url, args.latency, work)
        options = {"endpoint_url": proxy.url, **KEYS, "skip_instance_cache": True}
        parallelism = our_parallelism()
        src = Store(f"s3://{bucket}/checkpoint", options)
        clients = {
            "ours": lambda n: ours(src, Store(f"s3://{bucket}/ours-{n}", options), planned, parallelism),
            "aiobotocore gather": lambda n: gathered(src, Store(f"s3://{bucket}/gather-{n}", options), planned, parallelism),
        }
        try:
            import obstore  # noqa: F401

            clients["obstore"] = lambda n: obstore_copies(proxy.url, bucket, planned, parallelism, f"obstore-{n}")
        except ImportError:
            log("obstore is not importable: skipped")
        tool = peer_tools()["s5cmd"]
        results: dict[str, dict] = {}
        for name, make in clients.items():
            runs = []
            for n in range(args.rounds):
                log(f"{name}: round {n + 1}")
                runs.append(_measured(proxy, make(n)))
            results[name] = min(runs, key=lambda r: r["seconds"]) | {"rounds": runs}
        if tool:
            runs = []
            for n in range(args.rounds):
                log(f"s5cmd: round {n + 1}")
                command = _s5cmd_savepoint(tool, proxy.url, planned, f"{bucket}/checkpoint", f"{bucket}/s5cmd-{n}",
                                           parallelism, work)
                runs.append(_measured(proxy, lambda c=command: subprocess.run(
                    c, env={**PEER_ENV, "PATH": "/usr/bin:/bin"}, check=True, stdout=subprocess.DEVNULL),
                    resource.RUSAGE_CHILDREN))
            results["s5cmd"] = min(runs, key=lambda r: r["seconds"]) | {"rounds": runs}
        else:
            log("s5cmd is not installed (make bench installs it): no peer")
        peer = results.get("s5cmd", {}).get("seconds")
        for figures in results.values():
            figures["vs_s5cmd"] = round(figures["seconds"] / peer, 2) if peer else None
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        report = {"files": len(planned), "latency_ms": args.latency * 1000, "parallelism": parallelism,
                  "loadavg": load, "clients": results}
        print(f"{len(planned)} server-side copies at {args.latency * 1000:.0f} ms per request, parallelism {parallelism}, load {load}")
        print(f"{'client':<20}{'wall s':>8}{'CPU s':>8}{'requests':>10}{'CPU ms/req':>12}{'x s5cmd':>9}")
        for name, f in results.items():
            print(f"{name:<20}{f['seconds']:>8.2f}{f['cpu_s']:>8.2f}{f['requests']:>10}{f['cpu_ms_per_request']:>12.2f}"
                  f"{f['vs_s5cmd'] if f['vs_s5cmd'] is not None else '-':>9}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        if proxy is not None:
            proxy.stop()
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
