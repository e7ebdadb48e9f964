"""Storage back ends: one class per kind of store, found by fsspec protocol (as fsspec's registry).

``known_backends`` maps a protocol to the import path of its class; a protocol not listed gets
:class:`~airflow_savepoints.storage.backends.generic.FsspecBackend`. Adding a store is one class
(a subclass of :class:`~airflow_savepoints.storage.backends.base.Backend` or of one of the generic
ones) and one ``register_backend`` line here.
"""

from __future__ import annotations

import importlib

from airflow_savepoints.storage.backends.base import (
    LINK,
    SERVER_COPY,
    STREAM,
    Backend,
    FileStat,
    ServerCopy,
)

__all__ = ["LINK", "SERVER_COPY", "STREAM", "Backend", "FileStat", "ServerCopy", "backend_class",
           "register_backend", "known_backends"]

_PACKAGE = "airflow_savepoints.storage.backends"
DEFAULT_BACKEND = f"{_PACKAGE}.generic.FsspecBackend"

known_backends: dict[str, str] = {}


def register_backend(protocol: str, cls: str | type[Backend], clobber: bool = False) -> None:
    """Serve ``protocol`` with ``cls`` (a class or its import path ``package.module.Class``)."""
    path = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    if protocol in known_backends and known_backends[protocol] != path and not clobber:
        raise ValueError(f"protocol {protocol!r} is already served by {known_backends[protocol]}")
    known_backends[protocol] = path


def backend_class(protocol: str) -> type[Backend]:
    """The back end class of fsspec ``protocol``: its own, or the generic fsspec one."""
    module, _, name = known_backends.get(protocol, DEFAULT_BACKEND).rpartition(".")
    return getattr(importlib.import_module(module), name)


register_backend("file", f"{_PACKAGE}.local.LocalBackend")
register_backend("s3", f"{_PACKAGE}.s3.S3Backend")
register_backend("gcs", f"{_PACKAGE}.gcs.GCSBackend")
register_backend("abfs", f"{_PACKAGE}.azure.AzureBackend")
register_backend("memory", f"{_PACKAGE}.generic.ObjectStoreBackend")  # fsspec's in-memory store
register_backend("hdfs", f"{_PACKAGE}.hdfs.HdfsBackend")
