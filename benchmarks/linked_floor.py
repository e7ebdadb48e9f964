"""The floors of a second (linked, incremental) local savepoint: ours against plain Python loops on the same files.

Run from the repository, on the folder a kept local benchmark left (its ``hdfs/checkpoint``,
``rocksdb/checkpoint`` and ``sp/`` savepoint root)::

    python benchmarks/run.py --size-gb 1.1 --partitions 40 --skip cli,s3,live,memory,hashes,inspect,rescale --workdir W
    python benchmarks/linked_floor.py --workdir W [--runs 8] [--settle S]

Once, it keeps each job's oldest completed savepoint in ``W/linked-floor/first`` (links, no copies), and a
warm-up takes the second savepoint of both checkpoints from a linked copy of that root (its plan names the
files the floors work on: the same each run). Each run times, on a fresh linked copy of the root, ours (the
second savepoints) and three plain loops on the files they plan:

* ``links``: the folders and one ``link`` per file, nothing else (the link-only floor);
* ``safe``: every per-file check a savepoint keeps, with no planning: a ``stat`` of each live file, the link
  (a reused file from the previous savepoint), a ``stat`` of each reused inode against its recorded size,
  CRC32C of each new file read back, the manifest written with an ``fsync``;
* ``safe+``: ``safe`` plus the least bookkeeping a job needs: a walk of the checkpoint, the previous
  manifest parsed, a lease created and removed, the catalog written twice (each with an ``fsync``).

Seconds are wall time, and CPU (user and system, every thread of the process). The filesystem's state moves
them: after a ``cp -al`` or the removal of thousands of links, ``mkdir`` runs several times slower for a second
or two even past ``sync``. So the four steps take turns at each place in a run (ours once came first each time,
right after the ``cp -al``), each after a ``sync`` and ``--settle`` seconds (0 by default: a wait lets the machine
go idle, which slows every step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import crc32c  # noqa: E402

from airflow_savepoints.core import take_savepoint  # noqa: E402
from airflow_savepoints.core.catalog import Catalog  # noqa: E402
from airflow_savepoints.core.dispose import dispose_savepoint  # noqa: E402
from airflow_savepoints.storage import Store  # noqa: E402

KINDS = ("hdfs", "rocksdb")


def first_root(work: Path) -> Path:
    """Each job's oldest completed savepoint of the benchmark's root, linked (made once)."""
    first = work / "linked-floor" / "first"
    if first.exists():
        return first
    for kind in KINDS:
        shutil.copytree(work / "sp" / f"{kind}-link", first / f"{kind}-link", copy_function=os.link)
    for kind in KINDS:
        done = sorted(Catalog(Store(str(first / f"{kind}-link")), f"{kind}-link").completed(), key=lambda r: r.created_at)
        for record in done[1:]:
            dispose_savepoint(record.pointer, savepoint_dir=str(first))
    return first


def per_file_work(infos, root: Path, into: Path, checkpoints: dict[str, Path]):
    """(live file, the previous savepoint's copy or None, target, recorded size) per file, and each manifest."""
    jobs = []
    for info in infos:
        kind = info.manifest.job.split("-")[0]
        files = [(str(checkpoints[kind] / e.path), str(root / info.manifest.job / e.reused_from / e.path) if e.reused_from
                  else None, str(into / info.manifest.job / e.path), e.size) for e in info.manifest.files]
        jobs.append((files, info.manifest.model_dump_json(indent=1).encode()))
    return jobs


def _folders(jobs) -> list[str]:
    return sorted({os.path.dirname(target) for files, _ in jobs for _, _, target, _ in files})


def links_alone(jobs, checkpoints) -> None:
    for folder in _folders(jobs):
        os.makedirs(folder, exist_ok=True)
    for files, _ in jobs:
        for source, _, target, _ in files:
            os.link(source, target)


def safe(jobs, checkpoints) -> None:
    for folder in _folders(jobs):
        os.makedirs(folder, exist_ok=True)
    for files, manifest in jobs:
        for source, previous, target, size in files:
            os.stat(source)  # the plan: the live file, unchanged since the previous savepoint
            if previous is not None:
                os.link(previous, target)
                if os.stat(target).st_size != size:
                    raise SystemExit(f"{target}: not the recorded size")
            else:
                os.link(source, target)
                with open(target, "rb") as handle:
                    crc32c.crc32c(handle.read())
        with open(_job_folder(files) + "/_metadata.floor", "wb") as handle:
            handle.write(manifest)
            handle.flush()
            os.fsync(handle.fileno())


def _job_folder(files) -> str:
    """The job's folder below the floor's root (the files span metadata, offsets/ and more: their common folder)."""
    return os.path.commonpath([target for _, _, target, _ in files])


def safe_plus(jobs, checkpoints) -> None:
    for checkpoint in checkpoints.values():
        for _ in os.walk(checkpoint):
            pass
    for files, manifest in jobs:
        json.loads(manifest)
        job = _job_folder(files)
        os.makedirs(job, exist_ok=True)
        lease = os.path.join(job, "_lease.floor")
        fd = os.open(lease, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, b"{}")
        os.close(fd)
        for _ in range(2):
            with open(os.path.join(job, "_catalog.floor"), "wb") as handle:
                handle.write(manifest[:2000])
                handle.flush()
                os.fsync(handle.fileno())
        os.remove(lease)
    safe(jobs, checkpoints)


FLOORS = {"links": links_alone, "safe": safe, "safe+": safe_plus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a kept `benchmarks/run.py --workdir` of a local run")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--settle", type=float, default=0.0, help="seconds to wait after `sync` before each timed step")
    args = parser.parse_args()
    work = Path(args.workdir)
    checkpoints = {kind: work / kind / "checkpoint" for kind in KINDS}
    if not all(c.is_dir() for c in checkpoints.values()) or not (work / "sp").is_dir():
        parser.error(f"{work} holds no hdfs/checkpoint, rocksdb/checkpoint and sp/ (keep a local run's --workdir)")
    first = first_root(work)
    seconds: dict[str, list[float]] = {"ours": [], **{name: [] for name in FLOORS}}
    cpu: dict[str, list[float]] = {name: [] for name in seconds}  # user + system seconds, every thread

    def second_savepoints(root: Path) -> list:
        return [take_savepoint(str(checkpoints[kind]), f"{kind}-link", savepoint_dir=str(root), savepoint_type="periodic")
                for kind in KINDS]

    def settled() -> tuple[float, float]:
        """The clocks' start for a timed step (wall, CPU): after a `sync` and `--settle` seconds (see the module's docstring)."""
        os.sync()
        time.sleep(args.settle)
        return time.perf_counter(), time.process_time()

    def record(name: str, start: tuple[float, float]) -> None:
        seconds[name].append(time.perf_counter() - start[0])
        cpu[name].append(time.process_time() - start[1])

    warm_up = work / "linked-floor" / "root-warm-up"
    shutil.rmtree(warm_up, ignore_errors=True)
    subprocess.run(["cp", "-al", str(first), str(warm_up)], check=True)
    infos = second_savepoints(warm_up)  # the files each floor works on (the same plan every run)
    shutil.rmtree(warm_up)
    steps = ["ours", *FLOORS]
    for n in range(args.runs):
        root = work / "linked-floor" / f"root-{n}"
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["cp", "-al", str(first), str(root)], check=True)  # the first savepoints, the floors' too
        for name in steps[n % len(steps):] + steps[:n % len(steps)]:  # each step in each place in turn
            if name == "ours":
                start = settled()
                second_savepoints(root)
                record("ours", start)
                continue
            into = work / "linked-floor" / name
            shutil.rmtree(into, ignore_errors=True)
            jobs = per_file_work(infos, root, into, checkpoints)
            start = settled()
            FLOORS[name](jobs, checkpoints)
            record(name, start)
            shutil.rmtree(into)
        shutil.rmtree(root)
    files = [e for info in infos for e in info.manifest.files]
    fresh = [e for e in files if not e.reused_from]
    print(f"{len(files)} files, {len(files) - len(fresh)} reused, {len(fresh)} new ({sum(e.size for e in fresh) / 1e6:.1f} MB),"
          f" {args.runs} runs, load {os.getloadavg()[0]:.1f}")
    for name, values in seconds.items():
        values.sort()
        print(f"{name:6s} best {values[0] * 1000:7.1f} ms  median {values[len(values) // 2] * 1000:7.1f} ms"
              f"  best / links-only {values[0] / min(seconds['links']):.2f}"
              f"  CPU best {min(cpu[name]) * 1000:6.1f} ms ({min(cpu[name]) / len(files) * 1e6:5.1f} us a file)")
    print(f"ours / safe+ (best) {min(seconds['ours']) / min(seconds['safe+']):.2f}, CPU above safe+ (best)"
          f" {(min(cpu['ours']) - min(cpu['safe+'])) / len(files) * 1e6:.1f} us a file")


if __name__ == "__main__":
    main()
