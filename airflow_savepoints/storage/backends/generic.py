"""Stores with no back end of their own, kept on plain fsspec calls (GCS, ABFS and HDFS today).

:class:`FsspecBackend` serves filesystems with folders (HDFS and any other fsspec protocol): an atomic
write is a temporary file renamed into place. :class:`ObjectStoreBackend` serves object stores (GCS,
ABFS, fsspec's memory store): one PUT is atomic and folders do not exist. Neither has an atomic
create-if-absent through fsspec: ``create_exclusive`` checks, then writes, under a lock that only
orders this process's threads (docs/concepts.md says so).
"""

from __future__ import annotations

import posixpath
import threading
import uuid
from typing import ClassVar

from airflow_savepoints.storage.backends.base import Backend

_create_lock = threading.Lock()

CREDENTIALS_HINTS = {
    "gcs": "set GOOGLE_APPLICATION_CREDENTIALS or fsspec's gcs configuration",
    "abfs": "set AZURE_STORAGE_ACCOUNT_NAME/AZURE_STORAGE_ACCOUNT_KEY or fsspec's abfs configuration",
}
ERROR_HINTS = {
    "hdfs": "pyarrow's HDFS client needs JAVA_HOME, HADOOP_HOME and CLASSPATH (hadoop classpath --glob)",
}


class FsspecBackend(Backend):
    """Any fsspec filesystem with folders, through its generic calls."""

    @property
    def credentials_hint(self) -> str:  # type: ignore[override]
        return CREDENTIALS_HINTS.get(self.protocol, Backend.credentials_hint)

    @property
    def error_hint(self) -> str:  # type: ignore[override]
        return ERROR_HINTS.get(self.protocol, Backend.error_hint)

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = temporary_name(path)
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        with _create_lock:  # check, then write: atomic between this process's threads only
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True


class ObjectStoreBackend(FsspecBackend):
    """An object store through fsspec: a PUT is atomic, folders exist only through their files."""

    has_folders: ClassVar[bool] = False

    def write_atomic(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)  # a PUT is atomic


def temporary_name(path: str) -> str:
    """A hidden, unique name beside ``path`` to write it under before it is renamed into place."""
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
