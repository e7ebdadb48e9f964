"""Stores with no back end of their own, kept on plain fsspec calls (any fsspec protocol not listed),
and what the object-store back ends share.

:class:`FsspecBackend` serves filesystems with folders (and is the base of HDFS's, ``hdfs.py``): an
atomic write is a temporary file renamed into place. :class:`ObjectStoreBackend` serves object stores
(fsspec's memory store; the base of the S3, GCS and Azure back ends): one PUT is atomic and folders
do not exist. Neither has an atomic create-if-absent through fsspec: ``create_exclusive`` checks,
then writes, under a lock that only orders this process's threads (docs/concepts.md says so).
"""

from __future__ import annotations

import posixpath
import threading
import uuid
from collections.abc import Callable
from typing import ClassVar

from airflow_savepoints.storage.backends.base import Backend, TooLarge

_create_lock = threading.Lock()

class FsspecBackend(Backend):
    """Any fsspec filesystem with folders, through its generic calls."""

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

    def read_capped(self, path: str, cap: int) -> tuple[bytes, float | None]:
        """One read as ``read_stamped`` (a HEAD first would double the requests of every lease and
        catalog read), its length checked after: another fsspec store bounds it by the object, not the cap
        (S3, GCS and Azure check the size before the body, or read a range of the cap)."""
        data, modified = self.read_stamped(path)
        if len(data) > cap:
            raise TooLarge(len(data))
        return data, modified

    def folder_in_place(self, path: str) -> bool:
        """Keys below a missing object's name are no object of that name: it is missing (S3 looks)."""
        return False

    def same_service(self, other: Backend) -> bool:
        """Whether ``other`` reaches the same service with the same settings (a server-side copy can work)."""
        if self.fs is other.fs:
            return True
        return type(self) is type(other) and \
            getattr(self.fs, "storage_options", None) == getattr(other.fs, "storage_options", None) and \
            getattr(self.fs, "client_kwargs", None) == getattr(other.fs, "client_kwargs", None)

    def create_if_absent(self, path: str, data: bytes, put: Callable[[], object], taken: Callable[[Exception], bool]) \
            -> bool:
        """``put`` (a conditional write of ``data``); when ``taken(error)`` says the object exists, it is
        ours only if it holds ``data``: a retried request whose first response was lost is refused too
        (callers put a unique token in ``data``)."""
        try:
            put()
        except Exception as exc:
            if not taken(exc):
                raise
            try:
                return self.fs.cat_file(path) == data
            except FileNotFoundError:
                return False
        finally:
            self.invalidate(posixpath.dirname(path))
        return True


def temporary_name(path: str) -> str:
    """A hidden, unique name beside ``path`` to write it under before it is renamed into place."""
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
