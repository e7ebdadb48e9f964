"""The checksum kinds a savepoint's files carry: CRC32C (every store), and Azure's CRC64.

CRC32C is the default: S3 and GCS compute it for the objects they write, and the worker computes it
(hardware CRC32C) wherever it reads. Azure computes no CRC32C, but a synchronous copy returns the
CRC64 of the bytes it copied (CRC-64/NVME, the polynomial Azure Storage uses): an Azure savepoint
records that instead of reading each copy back. Computing a CRC64 here (to restore or verify such a
savepoint) needs Microsoft's ``azure-storage-extensions`` (in the ``[azure]`` extra).
"""

from __future__ import annotations

import google_crc32c

from airflow_savepoints.errors import MissingBackendError

CRC32C, CRC64 = "crc32c", "crc64"
HEX_DIGITS = {CRC32C: 8, CRC64: 16}
HEX_FORMAT = {algorithm: f"0{digits}x" for algorithm, digits in HEX_DIGITS.items()}  # format(value, ...): as_hex


def crc64_available() -> bool:
    """Whether this worker can compute Azure's CRC64 (``azure-storage-extensions`` is installed)."""
    try:
        from azure.storage.extensions import checksums  # noqa: F401
    except ImportError:
        return False
    return True


def _crc64_extend(crc: int, chunk: bytes) -> int:
    try:
        from azure.storage.extensions import checksums
    except ImportError as exc:
        raise MissingBackendError(
            "this savepoint's files carry Azure CRC64 checksums, which need azure-storage-extensions",
            "pip install 'airflow-savepoints[azure]'",
        ) from exc
    return checksums.crc64.compute(chunk, crc)


EXTEND = {CRC32C: google_crc32c.extend, CRC64: _crc64_extend}


def extend(algorithm: str, value: int, chunk: bytes) -> int:
    """``value`` (the checksum so far) extended by ``chunk``."""
    return EXTEND[algorithm](value, chunk)


def of_bytes(algorithm: str, data: bytes) -> int:
    return extend(algorithm, 0, data)


def as_hex(algorithm: str, value: int) -> str:
    """The value as the manifest writes it: lower-case hex, zero-padded to the algorithm's width."""
    return format(value, HEX_FORMAT[algorithm])
