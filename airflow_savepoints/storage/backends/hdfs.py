"""HDFS (``hdfs://``) through hdfs-native's fsspec filesystem (the ``hdfs`` extra): the one HDFS client supported.

hdfs-native speaks the NameNode's RPC protocol itself (Rust: no JVM, no libhdfs). An exclusive create
(the lease, the catalog) writes the file complete under a temporary name and renames it with the
NameNode's ``rename2`` without ``OVERWRITE``, which refuses an existing target (as Spark's checkpoint
file manager commits its files through ``FileContext.rename``): one NameNode operation decides it, so
two workers never both win, and a reader never sees a half-written file. An atomic write (the catalog,
a renewed lease) is the same rename with ``OVERWRITE``: replaced in one operation, never missing in
between. A listing is one recursive ``getListing`` walk on the NameNode; HDFS has no server-side copy,
so savepoints stream their files (read from the DataNodes, written back).

fsspec's own ``hdfs`` filesystem (pyarrow's, which needs Hadoop's native libhdfs) is not used: without
hdfs-native an ``hdfs://`` URL fails with ``missing_backend``. A NameNode that refuses connections fails
in seconds (:data:`FAIL_FAST_CONF`); one whose address drops them fails within ``ipc.client.connect.timeout``
(a TCP connect tried before hdfs-native's, which has no timeout).

Tested against a real NameNode and DataNode (Hadoop 3.5.0, the version in pyspark's jars) with
hdfs-native 0.14.7 (tests/test_hdfs.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import socket
import weakref
from typing import IO, Any, ClassVar
from xml.etree import ElementTree

from airflow_savepoints.errors import InvalidInputError, InvalidPathError, StorageUnreachableError
from airflow_savepoints.storage.backends.base import UNREACHABLE_ERRNOS, FileStat
from airflow_savepoints.storage.backends.generic import FsspecBackend, temporary_name

# hdfs-native retries a NameNode that refuses connections as Hadoop's client does (15 attempts, sleeps
# from 0.5 s doubling to 15 s: minutes): a dead NameNode fails within ~2 s instead, unless the storage
# options or the Hadoop configuration files set these keys
FAIL_FAST_CONF = {"dfs.client.failover.max.attempts": "3", "dfs.client.failover.sleep.base.millis": "200",
                  "dfs.client.failover.sleep.max.millis": "1000"}
# hdfs-native 0.14.7 connects to the NameNode without a timeout: an address that drops packets (a firewall,
# an unroutable host) hung the first call for ever. One TCP connect with Hadoop's connect timeout comes first.
CONNECT_TIMEOUT_KEY, CONNECT_TIMEOUT_MS = "ipc.client.connect.timeout", "20000"  # Hadoop's key and default
_NAMENODES_REACHED: set[tuple[str, int]] = set()  # probed once per address and process
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how hdfs-native's OSError names its cause (its errno is None)

# hdfs-native's client owns a tokio runtime whose threads a forked child does not inherit: freeing the
# client there (fsspec clears its instance caches in every forked child) waits for those threads forever.
_NATIVE_FILESYSTEMS: weakref.WeakSet = weakref.WeakSet()
_HELD_ACROSS_FORK: list[Any] = []


def _hold_before_fork() -> None:
    """One more reference to each hdfs-native filesystem, taken before a fork: the child keeps it and so never frees one."""
    _HELD_ACROSS_FORK[:] = list(_NATIVE_FILESYSTEMS)
    for fs in _HELD_ACROSS_FORK:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(fs))


def _release_after_fork_in_parent() -> None:
    for fs in _HELD_ACROSS_FORK:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(fs))
    _HELD_ACROSS_FORK.clear()


os.register_at_fork(before=_hold_before_fork, after_in_parent=_release_after_fork_in_parent)


class HdfsBackend(FsspecBackend):
    """HDFS through hdfs-native's client: data, listings, and the NameNode's atomic renames."""

    poll_interval: ClassVar[float] = 0.1
    credentials_hint: ClassVar[str] = "run kinit (Kerberos), or check the user the NameNode sees and its permissions"
    error_hint: ClassVar[str] = ("check the NameNode in the URL (hdfs://namenode:8020/path) or the Hadoop configuration "
                                 "(HADOOP_CONF_DIR), and that the NameNode and DataNodes are up")

    def __init__(self, fs: Any, protocol: str):
        super().__init__(fs, protocol)
        if type(fs).__module__.startswith("hdfs_native"):
            _NATIVE_FILESYSTEMS.add(fs)

    @classmethod
    def filesystem_class(cls, protocol: str) -> type:
        """hdfs-native's filesystem (fsspec's own default for ``hdfs://`` is pyarrow's, which is not supported)."""
        try:
            from hdfs_native.fsspec import HdfsFileSystem
        except ImportError as exc:
            raise ImportError("hdfs-native, the HDFS client, is not installed") from exc
        return HdfsFileSystem

    @classmethod
    def filesystem_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """hdfs-native takes its options (but the NameNode's ``host`` and ``port``, and fsspec's
        ``skip_instance_cache``) as Hadoop configuration: strings; :data:`FAIL_FAST_CONF` applies where
        neither the options nor the Hadoop configuration set a key.
        A NameNode given by host and port is probed first (:func:`_probe_namenode`)."""
        if "webhdfs" in options:
            raise InvalidInputError("the HDFS storage option 'webhdfs' is not supported: it addressed WebHDFS for "
                                    "pyarrow's HDFS client, which was removed",
                                    "remove it: hdfs-native renames through the NameNode's RPC address, the URL's host and port")
        for key, value in options.items():
            if key not in ("host", "port", "skip_instance_cache") and not isinstance(value, str):  # the last: fsspec's
                raise InvalidInputError(f"the HDFS storage option {key!r} is not a string ({value!r})",
                                        "give Hadoop configuration keys with string values, e.g. {\"dfs.replication\": \"2\"}")
        configured = _hadoop_conf()
        if not options.get("host") and not options.get("fs.defaultFS") and not configured.get("fs.defaultFS"):
            raise InvalidPathError("an hdfs:/// URL names no NameNode, and neither the storage options nor the Hadoop "
                                   "configuration (core-site.xml in HADOOP_CONF_DIR or $HADOOP_HOME/etc/hadoop) set fs.defaultFS",
                                   "write the NameNode into the URL (hdfs://namenode:8020/path), or point HADOOP_CONF_DIR "
                                   "at the cluster's configuration")
        _probe_namenode(options.get("host"), options.get("port"),
                        options.get(CONNECT_TIMEOUT_KEY) or configured.get(CONNECT_TIMEOUT_KEY) or CONNECT_TIMEOUT_MS)
        return {**{k: v for k, v in FAIL_FAST_CONF.items() if k not in configured}, **options}

    def is_unreachable(self, exc: BaseException) -> bool:
        """Also hdfs-native's OSError, whose errno is None: ``Connection refused (os error 111)``."""
        if super().is_unreachable(exc):
            return True
        cause = _RUST_OS_ERROR.search(str(exc)) if isinstance(exc, OSError) else None
        return cause is not None and int(cause.group(1)) in UNREACHABLE_ERRNOS

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

    def exists(self, path: str) -> bool:
        return self._kind(path) is not None

    def isdir(self, path: str) -> bool:
        return self._kind(path) == "directory"

    def isfile(self, path: str) -> bool:
        return self._kind(path) == "file"

    def _kind(self, path: str) -> str | None:
        """``file``, ``directory``, or None when nothing is there; any other error (an unreachable NameNode)
        raises, where fsspec's ``exists``/``isdir``/``isfile`` would take it for "missing"."""
        try:
            return self.fs.info(path)["type"]
        except FileNotFoundError:
            return None

    def file_stat(self, info: dict[str, Any]) -> FileStat:
        """hdfs-native's entries: ``modification_time`` in milliseconds (with the size, the version token)."""
        return _native_stat(int(info["modification_time"]), int(info.get("size") or 0))

    def list_files(self, base: str) -> dict[str, FileStat]:
        """One recursive listing on the NameNode."""
        prefix = self.strip(base).rstrip("/") + "/"
        try:
            return {status.path[len(prefix):]: _native_stat(status.modification_time, status.length)
                    for status in self.fs.client.list_status(prefix.rstrip("/") or "/", True)
                    if not status.isdir and status.path.startswith(prefix)}
        except FileNotFoundError:
            return {}

    def open_read(self, path: str, block_size: int | None) -> tuple[IO[bytes], str | None]:
        """hdfs-native's reader reads the sizes asked for (with ``block_size`` it wraps itself in an
        ``io.BufferedReader``, which its reader cannot serve)."""
        return self.fs.open(path, "rb"), None

    def open_write(self, path: str) -> IO[bytes]:
        """A writer of ``path`` with the cluster's block size (hdfs-native takes ``block_size`` as the HDFS block's)."""
        return self.fs.open(path, "wb")

    def _rename(self, tmp: str, path: str, overwrite: bool) -> None:
        """The NameNode's ``rename2(tmp, path, OVERWRITE or NONE)``; a refusal raises ``FileExistsError``."""
        self.fs.client.rename(tmp, path, overwrite)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Written whole under a temporary name, then renamed over ``path`` in one NameNode operation
        (never missing in between, as it would be after a delete and a move)."""
        tmp = temporary_name(path)
        self.fs.pipe_file(tmp, data)
        try:
            self._rename(tmp, path, True)
        except Exception:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(tmp)
            raise

    def create_exclusive(self, path: str, data: bytes) -> bool:
        tmp = temporary_name(path)
        self.fs.pipe_file(tmp, data)
        try:
            self._rename(tmp, path, False)
            return True
        except FileExistsError:  # the NameNode's refusal: taken, even if released since
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(tmp)
            return False
        except Exception:
            if not self.fs.exists(tmp):  # renamed, and the answer was lost: ours if it holds our bytes
                with contextlib.suppress(FileNotFoundError):
                    return self.fs.cat_file(path) == data
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(tmp)
            if self.fs.exists(path):
                return False  # FileExistsError / FileAlreadyExistsException: taken
            raise


def _native_stat(millis: int, size: int) -> FileStat:
    """A file's entry from hdfs-native's modification time (milliseconds) and length: a replacement
    (a new file renamed over it) changes the time."""
    return FileStat(size=size, version=f"{millis}:{size}", modified=millis / 1000)


def _probe_namenode(host: str | None, port: int | None, timeout_ms: str) -> None:
    """One TCP connect to ``host:port`` within ``timeout_ms``, before hdfs-native's first: no answer at all
    fails with ``storage_unreachable``; a refusal or an unknown host is left to hdfs-native's own error. An
    HA nameservice or the configuration's NameNode (no port given) is not probed."""
    if not host or not port or (host, port) in _NAMENODES_REACHED:
        return
    try:
        seconds = int(timeout_ms) / 1000
    except ValueError:
        raise InvalidInputError(f"the HDFS option {CONNECT_TIMEOUT_KEY} is not a number of milliseconds ({timeout_ms!r})",
                                "give it in milliseconds, e.g. \"20000\"") from None
    try:
        socket.create_connection((host, port), timeout=seconds).close()
    except TimeoutError as exc:
        raise StorageUnreachableError(
            f"cannot reach the NameNode at hdfs://{host}:{port}: no answer to a connection within {seconds:g} s",
            "check the NameNode's address and that no firewall drops its RPC port; a slower network sets the "
            f"storage option or Hadoop configuration key {CONNECT_TIMEOUT_KEY} (milliseconds)") from exc
    except OSError:
        return
    _NAMENODES_REACHED.add((host, port))


def _hadoop_conf() -> dict[str, str]:
    """What the Hadoop configuration files set that hdfs-native reads (core-site.xml and hdfs-site.xml
    in ``HADOOP_CONF_DIR``, else ``$HADOOP_HOME/etc/hadoop``): name and value of each property."""
    folder = os.environ.get("HADOOP_CONF_DIR") or (os.environ.get("HADOOP_HOME") and os.path.join(os.environ["HADOOP_HOME"],
                                                                                                 "etc", "hadoop"))
    conf: dict[str, str] = {}
    for name in ("core-site.xml", "hdfs-site.xml") if folder else ():
        with contextlib.suppress(OSError, ElementTree.ParseError):
            conf |= {(p.findtext("name") or "").strip(): (p.findtext("value") or "").strip()
                     for p in ElementTree.parse(os.path.join(folder, name)).iter("property")}
    return conf
