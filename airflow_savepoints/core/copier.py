"""Copy files between stores by streaming, computing CRC32C on the way (memory stays flat)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import crc32c

from airflow_savepoints.storage import Store

CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class CopiedFile:
    path: str
    size: int
    crc: int

    @property
    def checksum(self) -> str:
        return format(self.crc, "08x")


def checksum_of(store: Store, rel: str) -> tuple[int, int]:
    """(size, CRC32C) of one file, read in chunks."""
    crc, size = 0, 0
    with store.open_read(rel, block_size=CHUNK) as src:
        while chunk := src.read(CHUNK):
            crc = crc32c.crc32c(chunk, crc)
            size += len(chunk)
    return size, crc


def copy_file(src: Store, src_rel: str, dst: Store, dst_rel: str | None = None) -> CopiedFile:
    """Stream ``src_rel`` to ``dst_rel`` and return its size and CRC32C as read."""
    crc, size = 0, 0
    with src.open_read(src_rel, block_size=CHUNK) as reader, dst.open_write(dst_rel or src_rel) as writer:
        while chunk := reader.read(CHUNK):
            crc = crc32c.crc32c(chunk, crc)
            size += len(chunk)
            writer.write(chunk)
    return CopiedFile(src_rel, size, crc)


def copy_many(src: Store, dst: Store, paths: list[str], parallelism: int) -> dict[str, CopiedFile]:
    """Copy ``paths`` (same relative path on both sides) in parallel; the first failure is raised."""
    if not paths:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(paths)))) as pool:
        results = list(pool.map(lambda p: copy_file(src, p, dst), paths))
    return {r.path: r for r in results}
