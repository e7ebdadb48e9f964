"""HDFS (``hdfs://``) through pyarrow's HadoopFileSystem, as fsspec serves it.

pyarrow offers no create-if-absent: its output streams overwrite, and its ``move`` deletes an
existing target and renames again. So an exclusive create (the lease, the catalog) writes the file
complete under a temporary name and renames it with the NameNode's own rename that refuses an
existing target: WebHDFS ``op=RENAME&renameoptions=NONE`` (``FileContext.rename`` with
``Options.Rename.NONE``, as Spark's checkpoint file manager commits its files). One NameNode
operation decides it, so two workers never both win, and a reader never sees a half-written file.
An atomic write (the catalog, a renewed lease) renames the same way with ``OVERWRITE``: the file
is replaced in one operation, never missing in between.

The WebHDFS address of an ``hdfs://`` store is its storage option ``webhdfs`` (the keyword arguments
of fsspec's ``WebHDFS``: ``host``, ``port``, ``use_https``, ``kerberos``, ...); without it, the
``host`` option with port 9870, Hadoop 3's default NameNode HTTP port. Not tested here: this
machine has no Hadoop (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, ClassVar

import fsspec

from airflow_savepoints.errors import AtomicCreateUnavailableError, InvalidPathError
from airflow_savepoints.storage.backends.generic import FsspecBackend, temporary_name

WEBHDFS_PORT = 9870  # dfs.namenode.http-address's default port since Hadoop 3


class HdfsBackend(FsspecBackend):
    """HDFS: data through pyarrow; the renames that must be atomic through WebHDFS."""

    credentials_hint: ClassVar[str] = "run kinit (Kerberos) or set the 'user' storage option"
    error_hint: ClassVar[str] = "pyarrow's HDFS client needs JAVA_HOME, HADOOP_HOME and CLASSPATH (hadoop classpath --glob)"

    @classmethod
    def location(cls, path: str) -> tuple[str, dict[str, Any]]:
        """``namenode:8020/sp`` (from ``hdfs://namenode:8020/sp``) is ``/sp`` on that NameNode;
        ``/sp`` (from ``hdfs:///sp``) is on the NameNode of the options or the Hadoop configuration."""
        if path.startswith("/"):
            return path, {}
        authority, _, rest = path.partition("/")
        host, _, port = authority.partition(":")
        if port and not port.isdigit():
            raise InvalidPathError(f"'hdfs://{path}' has no valid NameNode port",
                                   "write hdfs://namenode:8020/path, or hdfs:///path with the NameNode in the options")
        return "/" + rest, {"host": host, **({"port": int(port)} if port else {})}

    def url(self, scheme: str, path: str) -> str:
        """``hdfs://namenode:port/path`` when the NameNode is known, else ``hdfs:///path``."""
        options = getattr(self.fs, "storage_options", None) or {}
        host, port = options.get("host"), options.get("port")
        authority = "" if not host or host == "default" else f"{host}:{port}" if port else host
        return f"{scheme}://{authority}{path}"

    @functools.cached_property
    def webhdfs(self) -> Any:
        """The NameNode's WebHDFS client (fsspec's, which brings its Kerberos and proxy settings)."""
        options = dict(getattr(self.fs, "storage_options", {}) or {})
        client = dict(options.get("webhdfs") or {})
        if "host" not in client:
            host = options.get("host")
            if not host or host == "default":
                raise AtomicCreateUnavailableError(
                    "HDFS has no atomic create-if-absent through pyarrow, and no WebHDFS address is set",
                    "set the storage option webhdfs={'host': '<namenode>', 'port': 9870} (or the 'host' option): "
                    "the lease and the catalog are created with the NameNode's rename that refuses an "
                    "existing file")
            client.update(host=host, port=client.get("port", WEBHDFS_PORT))
        if "user" not in client and options.get("user"):
            client["user"] = options["user"]
        return fsspec.filesystem("webhdfs", **client)

    def _rename(self, webhdfs: Any, tmp: str, path: str, option: str) -> None:
        """The NameNode's ``rename2(tmp, path, option)``; raises on a refusal (``_call``: the request
        every public method of fsspec's WebHDFS makes)."""
        webhdfs._call("RENAME", method="put", path=tmp, destination="/" + path.lstrip("/"), renameoptions=option)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Written whole under a temporary name, then renamed over ``path`` in one NameNode operation
        (pyarrow's ``move`` deletes the target first: a reader could find no file in between)."""
        webhdfs, tmp = self.webhdfs, temporary_name(path)
        self.fs.pipe_file(tmp, data)
        try:
            self._rename(webhdfs, tmp, path, "OVERWRITE")
        except Exception:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(tmp)
            raise

    def create_exclusive(self, path: str, data: bytes) -> bool:
        webhdfs, tmp = self.webhdfs, temporary_name(path)
        self.fs.pipe_file(tmp, data)
        try:
            self._rename(webhdfs, tmp, path, "NONE")
            return True
        except Exception:
            if not self.fs.exists(tmp):  # renamed, and the answer was lost: ours if it holds our bytes
                with contextlib.suppress(FileNotFoundError):
                    return self.fs.cat_file(path) == data
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(tmp)
            if self.fs.exists(path):
                return False  # FileAlreadyExistsException: taken
            raise
