"""A linked second savepoint against its links-only floor on a synthetic local checkpoint (no Spark needed).

``benchmarks/linked_floor.py`` measures the same on the checkpoints a local ``benchmarks/run.py --workdir`` run
built with Spark (minutes to build). This one writes the object-store benchmark's synthetic RocksDB checkpoint
(``benchmarks/object_store.write_checkpoint``: 200 partitions, a snapshot zip, its SSTs and changelogs each)
into ``--workdir``, takes a first savepoint, adds one batch (a changelog per partition), then times, in turn
each on a fresh ``cp -al`` of the first savepoint's root, ours (the second savepoint: linked, incremental) and the
links-only floor (the folders and one ``link`` per file it planned, into the job's folder there, in one loop
each) and the same floor split over threads as the savepoint splits its ``mkdir``s and ``link``s
(``links_threaded``: ``storage.backends.local.in_slices``, ``SYSCALL_THREADS`` of them), each after a
``sync``, each step at each place in the order of a run in turn. Wall and CPU
(user + system of the process taking it), best of ``--runs``::

    python benchmarks/linked_floor_synthetic.py --workdir W [--files 2000] [--runs 7] [--json-file F]
        [--compare OTHER_CHECKOUT]

Each savepoint is taken by a worker process of its own, started once (imports and one savepoint to warm
it), that takes one savepoint per request and reports its own CPU and wall time. ``--compare`` adds a
second worker running another checkout's code (e.g. the code before a change) on the same checkpoint, in
the same runs: before, after and the floor at the same load.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_savepoints.storage.backends.local import (  # noqa: E402
    MIN_FOLDERS_PER_THREAD,
    MIN_LINKS_PER_THREAD,
    SYSCALL_THREADS,
    in_slices,
)
from benchmarks.object_store import next_batch, write_checkpoint  # noqa: E402


def _makedirs(folders: list[str]) -> list:
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    return []


def _links(pairs: list[tuple[str, str]]) -> list:
    for source, target in pairs:
        os.link(source, target)
    return []

WORKER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from airflow_savepoints.core import take_savepoint
checkpoint = sys.argv[2]
for line in sys.stdin:
    root = line.strip()
    wall, cpu = time.perf_counter(), time.process_time()
    info = take_savepoint(checkpoint, "j", savepoint_dir=root, savepoint_type="periodic")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"wall": wall, "cpu": cpu, "files": len(info.manifest.files),
                      "reused": sum(e.checksum_source == "previous" for e in info.manifest.files),
                      "paths": [e.path for e in info.manifest.files] if root.endswith("warm-up") else None}), flush=True)
"""


class Worker:
    """A process taking savepoints of ``checkpoint`` with the code of ``tree``, one per root asked for."""

    def __init__(self, tree: Path, checkpoint: Path):
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.tree = tree
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, str(tree), str(checkpoint)], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def take(self, root: Path) -> dict:
        self.process.stdin.write(f"{root}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker of {self.tree} stopped")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json-file")
    parser.add_argument("--compare", help="another checkout whose code is timed beside this one's ('before')")
    args = parser.parse_args()
    work = Path(args.workdir)
    checkpoint, first = work / "checkpoint", work / "first"
    if not checkpoint.exists():
        from airflow_savepoints.core import take_savepoint

        newest = write_checkpoint(checkpoint, args.files)
        take_savepoint(str(checkpoint), "j", savepoint_dir=str(first), savepoint_type="periodic")
        next_batch(checkpoint, newest + 1)
    workers = {"ours": Worker(ROOT, checkpoint)}
    if args.compare:
        workers["before"] = Worker(Path(args.compare).resolve(), checkpoint)
    targets: list[str] = []
    for name, worker in workers.items():  # warm each: imports, and a first (full) savepoint in its process
        warm = work / f"{name}-warm-up"
        shutil.rmtree(warm, ignore_errors=True)
        subprocess.run(["cp", "-al", str(first), str(warm)], check=True)
        targets = worker.take(warm)["paths"] or targets  # the files the floor links: the second savepoint's
        shutil.rmtree(warm)
    steps = [*workers, "links", "links_threaded"]
    timings: dict[str, list[tuple[float, float]]] = {step: [] for step in steps}
    reused: dict[str, int] = {}
    for n in range(args.runs):
        root = work / f"root-{n}"
        for k, step in enumerate(steps[n % len(steps):] + steps[:n % len(steps)]):  # each step at each place in turn
            place = work / f"{root.name}-{k}"
            shutil.rmtree(place, ignore_errors=True)
            subprocess.run(["cp", "-al", str(first), str(place)], check=True)
            into = place / "j" / "floor"  # beside where a savepoint goes, in the tree just copied, as ours
            pairs = [(str(checkpoint / p), str(into / p)) for p in targets]
            folders = sorted({os.path.dirname(t) for _, t in pairs})
            os.sync()
            if step in workers:
                got = workers[step].take(place)
                timings[step].append((got["wall"], got["cpu"]))
                reused[step] = got["reused"]
            else:
                wall, cpu = time.perf_counter(), time.process_time()
                if step == "links":
                    _makedirs(folders)
                    _links(pairs)
                else:
                    in_slices(_makedirs, folders, MIN_FOLDERS_PER_THREAD)
                    in_slices(_links, pairs, MIN_LINKS_PER_THREAD)
                timings[step].append((time.perf_counter() - wall, time.process_time() - cpu))
            shutil.rmtree(place)
    for worker in workers.values():
        worker.close()
    files = len(targets)
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in timings.items()}
    report = {"files": files, "runs": args.runs, "load_average": os.getloadavg(), "reused": reused,
              "compared_with": args.compare,
              "wall_s": {k: round(v[0], 4) for k, v in best.items()}, "cpu_s": {k: round(v[1], 4) for k, v in best.items()},
              "cpu_us_per_file": {k: round(v[1] / files * 1e6, 1) for k, v in best.items()},
              "cpu_s_all": {k: [round(c, 4) for _, c in v] for k, v in timings.items()},
              **{f"{k}_over_links_wall": round(best[k][0] / best["links"][0], 2) for k in workers},
              **{f"{k}_over_links_cpu": round(best[k][1] / best["links"][1], 2) for k in workers},
              **{f"{k}_over_links_threaded_wall": round(best[k][0] / best["links_threaded"][0], 2) for k in workers},
              "syscall_threads": SYSCALL_THREADS}
    print(json.dumps(report))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
