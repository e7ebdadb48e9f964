"""A restore with a rescale against Spark's own repartition of a plain copy (benchmarks/run.py, step ``rescale``).

One RocksDB checkpoint of a streaming aggregation holding ``keys`` keys in ``before`` state partitions,
and a savepoint of it. Ours: ``restore_savepoint(pointer, target, state_partitions=after)`` (hard links,
every byte's CRC32C checked, then Spark's repartition of the copy). Spark's own, as one would do it by
hand: ``cp -r`` of the stopped checkpoint, then ``spark._streamingCheckpointManager.repartition`` on
the copy. Same Spark session, one warm-up rewrite first, then the two alternate (best of ``repeats``);
both must end with ``after`` partitions.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from airflow_savepoints.checkpoint import formats
from airflow_savepoints.core import restore_savepoint, take_savepoint

PAYLOAD_CHARS = 64  # small rows: the figure is about keys, 1 million of them make ~0.1 GB of state


def _partitions(checkpoint: Path) -> dict[str, int]:
    files = [str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()]
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    return formats.state_partitions(files, version=last + 1)


def rescale_against_repartition(spark, job_class, work: Path, keys: int = 1_000_000, before: int = 2, after: int = 8,
                                repeats: int = 1, log=print) -> dict:
    """Seconds of our restore with a rescale and of ``cp -r`` + Spark's repartition (best of ``repeats``)."""
    job = job_class(spark, work / "rescale", "rocksdb", before, payload_chars=PAYLOAD_CHARS)
    started = time.perf_counter()
    job.run_batch(keys)
    log(f"  rescale: {keys} keys in {before} RocksDB partitions built in {time.perf_counter() - started:.1f}s")
    pointer = take_savepoint(str(job.checkpoint), "rescale", savepoint_dir=str(work / "rescale-sp")).pointer
    state_bytes = sum(p.stat().st_size for p in (job.checkpoint / "state").rglob("*") if p.is_file())

    def spark_own(target: Path) -> dict[str, int]:
        subprocess.run(["cp", "-r", str(job.checkpoint), str(target)], check=True)
        spark._streamingCheckpointManager.repartition(str(target), after, True)
        return _partitions(target)

    def ours(target: Path) -> dict[str, int]:
        return restore_savepoint(pointer, str(target), state_partitions=after, spark_session=spark).partitions_after

    spark_own(work / "rescale-warm-up")  # the JVM's code paths and the page cache, for both alike
    shutil.rmtree(work / "rescale-warm-up")
    runs: dict[str, list[float]] = {"ours": [], "spark": []}
    results: dict[str, dict[str, int]] = {}
    for r in range(repeats):
        for name, rescale in (("ours", ours), ("spark", spark_own)):
            target = work / f"rescale-{name}-{r}"
            subprocess.run(["sync"], check=False)
            begin = time.perf_counter()
            results[name] = rescale(target)
            runs[name].append(time.perf_counter() - begin)
            shutil.rmtree(target)
    return {"keys": keys, "partitions": f"{before} -> {after}", "state_bytes": state_bytes,
            "ours_s": round(min(runs["ours"]), 3), "spark_s": round(min(runs["spark"]), 3),
            "partitions_match": results["ours"] == results["spark"] == {"0": after}}
