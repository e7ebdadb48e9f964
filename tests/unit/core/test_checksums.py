"""The checksum kinds of a savepoint's files (core/checksums.py)."""

from __future__ import annotations

import os

import google_crc32c
import pytest

from airflow_savepoints.core import checksums
from airflow_savepoints.core.checksums import CRC32C, CRC64


@pytest.mark.parametrize("algorithm,check,digits", [
    (CRC32C, 0xE3069283, 8),  # CRC-32C (Castagnoli)
    (CRC64, 0xAE8B14860A799888, 16),  # CRC-64/NVME, the CRC64 Azure Storage computes
])
def test_each_kind_is_its_standard_crc_computed_in_any_chunks(algorithm, check, digits):
    assert checksums.of_bytes(algorithm, b"123456789") == check  # the catalogue's check value
    data = os.urandom(3 * 1024 * 1024 + 17)
    whole, value = checksums.of_bytes(algorithm, data), 0
    for start in range(0, len(data), 1024 * 1024):
        value = checksums.extend(algorithm, value, data[start:start + 1024 * 1024])
    assert value == whole
    assert checksums.as_hex(algorithm, 1) == "0" * (digits - 1) + "1"


def test_crc32c_is_google_crc32c():
    data = os.urandom(4096)
    assert checksums.of_bytes(CRC32C, data) == google_crc32c.value(data)
