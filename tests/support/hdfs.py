"""A real HDFS for the tests: one NameNode and one DataNode (Hadoop's own jars) on 127.0.0.1.

``make jars`` fetches ``hadoop-hdfs``, ``hadoop-hdfs-client`` and ``hadoop-common`` at the Hadoop
version inside pyspark's jars (3.5.0) with Maven into ``.tools/jars/hdfs`` (tests/support/jars/hdfs.xml).
The session fixture ``hdfs_namenode`` writes a core-site.xml and an hdfs-site.xml (RPC and HTTP
(whose JMX tells when the NameNode is ready) on free ports, replication 1, permissions off) into a
fresh folder, formats the NameNode there, runs ``NameNode`` and ``DataNode`` as two JVMs and waits
until the NameNode counts one live DataNode and has left safe mode; both are stopped after the
session. The jars carry no web UI resources: empty ``webapps/<name>`` folders on the classpath are
enough for their HTTP servers.

Tests reach it with hdfs-native (the ``hdfs`` extra): ``hdfs://127.0.0.1:PORT/...``, as the store does;
Spark reaches it through its own Hadoop client. Without java, the jars or hdfs-native, the tests fail
with the reason, unless SKIP_PARTS names hdfs (tests/conftest.py::require_part).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support.emulators import JARS, Emulator, _spawn, free_port, jar_files

HDFS_JARS = JARS / "hdfs"


def missing_hdfs() -> str | None:
    """Why the HDFS tests cannot run here, or None."""
    if shutil.which("java") is None:
        return "no java on PATH"
    if not any("hadoop-hdfs-3" in Path(j).name for j in jar_files(HDFS_JARS)):
        return f"Hadoop's NameNode and DataNode jars are not in {HDFS_JARS} (make jars)"
    return missing_hdfs_native()


def missing_hdfs_native() -> str | None:
    """Why hdfs-native (the store's HDFS client) cannot be imported here, or None."""
    try:
        import hdfs_native  # noqa: F401
    except ImportError:
        return "hdfs-native is not installed (pip install -e '.[hdfs]')"
    return None


def _site(properties: dict[str, str]) -> str:
    rows = "".join(f"<property><name>{k}</name><value>{v}</value></property>\n" for k, v in properties.items())
    return f"<?xml version=\"1.0\"?>\n<configuration>\n{rows}</configuration>\n"


LOG4J = """\
log4j.rootLogger=WARN,console
log4j.logger.org.apache.hadoop.hdfs.server=INFO
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{HH:mm:ss,SSS} %p %c{1}: %m%n
"""


class HdfsCluster(Emulator):
    """The NameNode (``process``) and its DataNode; ``url`` is ``hdfs://127.0.0.1:RPC_PORT``."""

    datanode: subprocess.Popen | None = None
    http_port: int = 0

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def wait_operational(self, timeout: float = 120.0) -> None:
        """Until the NameNode has one live DataNode and is out of safe mode (its JMX over HTTP)."""
        probe = f"http://127.0.0.1:{self.http_port}/jmx?qry=Hadoop:service=NameNode,name=NameNodeInfo"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in (self.process, self.datanode):
                if process.poll() is not None:
                    raise RuntimeError(f"HDFS exited with {process.returncode}: {self.log_tail()}")
            try:
                with opener.open(probe, timeout=2) as answer:
                    info = json.load(answer)["beans"][0]
                if json.loads(info["LiveNodes"]) and not info["Safemode"]:
                    return
            except (OSError, ValueError, KeyError, IndexError):
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"HDFS was not ready at {self.url} within {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        return "\n".join(f"{log.name}: {log.read_text(errors='replace')[-chars:]}"
                         for log in sorted(self.workdir.glob("*.log")))

    def stop(self) -> None:
        if self.datanode is not None and self.datanode.poll() is None:
            self.datanode.terminate()
            try:
                self.datanode.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.datanode.kill()
                self.datanode.wait()
        super().stop()


def start_hdfs() -> HdfsCluster:
    """Format a NameNode in a fresh folder and run it and one DataNode on free ports of 127.0.0.1."""
    rpc, http = free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="hdfs-"))
    conf = workdir / "conf"
    for app in ("hdfs", "datanode", "static"):
        (conf / "webapps" / app).mkdir(parents=True)
    (conf / "core-site.xml").write_text(_site({"fs.defaultFS": f"hdfs://127.0.0.1:{rpc}",
                                               "hadoop.tmp.dir": str(workdir / "tmp")}))
    (conf / "hdfs-site.xml").write_text(_site({
        "dfs.namenode.name.dir": str(workdir / "name"), "dfs.datanode.data.dir": str(workdir / "data"),
        "dfs.namenode.rpc-address": f"127.0.0.1:{rpc}", "dfs.namenode.http-address": f"127.0.0.1:{http}",
        "dfs.namenode.secondary.http-address": "127.0.0.1:0",
        "dfs.datanode.address": f"127.0.0.1:{free_port()}", "dfs.datanode.http.address": f"127.0.0.1:{free_port()}",
        "dfs.datanode.ipc.address": f"127.0.0.1:{free_port()}", "dfs.datanode.hostname": "127.0.0.1",
        "dfs.namenode.datanode.registration.ip-hostname-check": "false",
        "dfs.replication": "1", "dfs.permissions.enabled": "false", "dfs.namenode.safemode.extension": "0",
        "dfs.heartbeat.interval": "1"}))
    (conf / "log4j.properties").write_text(LOG4J)
    classpath = f"{conf}:{HDFS_JARS / '*'}"
    java = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath]
    subprocess.run([*java, "org.apache.hadoop.hdfs.server.namenode.NameNode", "-format", "-nonInteractive", "-force",
                    "-clusterid", f"CID-{uuid.uuid4()}"], check=True, capture_output=True, timeout=120, cwd=workdir)
    namenode, log = _spawn("namenode", [*java, "org.apache.hadoop.hdfs.server.namenode.NameNode"], workdir)
    cluster = HdfsCluster("hdfs", f"hdfs://127.0.0.1:{rpc}", namenode, workdir, log)
    cluster.http_port = http
    cluster.datanode, _ = _spawn("datanode", [*java, "org.apache.hadoop.hdfs.server.datanode.DataNode"], workdir)
    cluster.wait_operational()
    return cluster


@pytest.fixture(scope="session")
def hdfs_namenode():
    """One NameNode and DataNode for the whole session (tests/conftest.py::require_part if they cannot run here)."""
    from tests.support.emulators import running

    yield from running("hdfs", missing_hdfs, start_hdfs)


@pytest.fixture
def hdfs_root(hdfs_namenode, request) -> str:
    """A fresh folder of the session's HDFS for one test: ``hdfs://127.0.0.1:PORT/t-<test>-<n>``."""
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in request.node.name[:40])
    return f"{hdfs_namenode.url}/t-{name}-{time.monotonic_ns()}"
