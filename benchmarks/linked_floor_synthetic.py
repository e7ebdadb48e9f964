"""A linked second savepoint against its links-only floor on a synthetic local checkpoint (no Spark needed).

``benchmarks/linked_floor.py`` measures the same on the checkpoints a local ``benchmarks/run.py --workdir`` run
built with Spark (minutes to build). This one writes the object-store benchmark's synthetic RocksDB checkpoint
(``benchmarks/object_store.write_checkpoint``: 200 partitions, a snapshot zip, its SSTs and changelogs each)
into ``--workdir``, takes a first savepoint, adds one batch (a changelog per partition), then times, in turn
on a fresh ``cp -al`` of the first savepoint's root, ours (the second savepoint: linked, incremental) and the
links-only floor (the folders and one ``link`` per file it planned), each after a ``sync``. Wall and CPU
(user + system of this process), best of ``--runs``::

    python benchmarks/linked_floor_synthetic.py --workdir W [--files 2000] [--runs 7] [--json-file F]
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

from airflow_savepoints.core import take_savepoint  # noqa: E402
from benchmarks.object_store import next_batch, write_checkpoint  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json-file")
    args = parser.parse_args()
    work = Path(args.workdir)
    checkpoint, first = work / "checkpoint", work / "first"
    if not checkpoint.exists():
        newest = write_checkpoint(checkpoint, args.files)
        take_savepoint(str(checkpoint), "j", savepoint_dir=str(first), savepoint_type="periodic")
        next_batch(checkpoint, newest + 1)
    timings: dict[str, list[tuple[float, float]]] = {"ours": [], "links": []}
    info = take_savepoint(str(checkpoint), "j", savepoint_dir=str(work / "warm-up"), savepoint_type="periodic")
    shutil.rmtree(work / "warm-up")  # a full copy: it only names the files the floor links
    targets = [e.path for e in info.manifest.files]
    for n in range(args.runs):
        root = work / f"root-{n}"
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["cp", "-al", str(first), str(root)], check=True)
        for step in ("ours", "links") if n % 2 == 0 else ("links", "ours"):
            into = work / "floor"
            shutil.rmtree(into, ignore_errors=True)
            pairs = [(str(checkpoint / p), str(into / p)) for p in targets]
            folders = sorted({os.path.dirname(t) for _, t in pairs})
            os.sync()
            wall, cpu = time.perf_counter(), time.process_time()
            if step == "ours":
                take_savepoint(str(checkpoint), "j", savepoint_dir=str(root), savepoint_type="periodic")
            else:
                for folder in folders:
                    os.makedirs(folder, exist_ok=True)
                for source, target in pairs:
                    os.link(source, target)
            timings[step].append((time.perf_counter() - wall, time.process_time() - cpu))
            shutil.rmtree(into, ignore_errors=True)
        shutil.rmtree(root)
    files = len(targets)
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in timings.items()}
    report = {"files": files, "runs": args.runs, "load_average": os.getloadavg(),
              "wall_s": {k: round(v[0], 4) for k, v in best.items()}, "cpu_s": {k: round(v[1], 4) for k, v in best.items()},
              "cpu_us_per_file": {k: round(v[1] / files * 1e6, 1) for k, v in best.items()},
              "ours_over_links_wall": round(best["ours"][0] / best["links"][0], 2),
              "ours_over_links_cpu": round(best["ours"][1] / best["links"][1], 2)}
    print(json.dumps(report))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
