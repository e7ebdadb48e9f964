"""Small checkpoints written in Spark's on-disk formats, without Spark (for fast bad-input and security tests).

The layout follows /work/shared/reference/spark-checkpoint-spec.md §1 (HDFS state store, one file
source): ``metadata``, ``offsets/0..N``, ``commits/0..N``, ``sources/0/<L>``, ``state/0/<p>/<v>.delta``,
the operator metadata and partition 0's schema file. tests/test_roundtrip.py restores real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

QUERY_ID = "5d5a3b9c-7a3e-4ad1-9c1e-3f2a00c0ffee"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def offsets_bytes(log_offset: int) -> bytes:
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"spark.sql.streaming.stateStore.providerClass": HDFS,
                                                                    "spark.sql.shuffle.partitions": "2"}}
    return f"v1\n{json.dumps(meta)}\n{json.dumps({'logOffset': log_offset})}".encode()


def write_checkpoint(path: Path, batches: int = 3, *, committed: int | None = None, state_bytes: int = 16) -> Path:
    """A stopped stateful query's checkpoint: ``batches`` batches planned, the first ``committed`` committed."""
    committed = batches if committed is None else committed
    path.mkdir(parents=True, exist_ok=True)
    (path / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
    for sub in ("offsets", "commits", "sources/0", "state/0/_metadata", "state/0/0/_metadata", "state/0/1"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    for b in range(batches):
        (path / "offsets" / str(b)).write_bytes(offsets_bytes(b))
        (path / "sources" / "0" / str(b)).write_text(f'v1\n{{"path":"file:///in/f{b}.json","timestamp":1,"batchId":{b}}}')
    for b in range(committed):
        (path / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    for part in (0, 1):
        for v in range(1, committed + 1):
            (path / "state" / "0" / str(part) / f"{v}.delta").write_bytes(bytes([v % 256]) * state_bytes)
    (path / "state" / "0" / "0" / "_metadata" / "schema").write_bytes(b"\x00\x02v2")
    (path / "state" / "0" / "_metadata" / "metadata").write_text(
        'v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},'
        '"stateStoreInfo":[{"storeName":"default","numColsPrefixKey":0,"numPartitions":2}]}')
    return path
