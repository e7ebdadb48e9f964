"""A real YARN for the tests: one ResourceManager and one NodeManager (Hadoop's own jars) on 127.0.0.1,
over the session's HDFS (tests/support/hdfs.py) as the default file system.

``make jars`` fetches ``hadoop-yarn-server-resourcemanager`` and ``hadoop-yarn-server-nodemanager`` at the
Hadoop version inside pyspark's jars (3.5.0) with Maven into ``.tools/jars/yarn`` (tests/support/jars/yarn.xml).
The session fixture ``yarn_cluster`` writes a Hadoop configuration folder (core-site.xml: the session's
NameNode as ``fs.defaultFS``, where spark-submit stages an application; hdfs-site.xml; yarn-site.xml;
capacity-scheduler.xml) and runs ``ResourceManager`` and ``NodeManager`` as two JVMs; it waits until the
ResourceManager's REST API (``/ws/v1/cluster/nodes``) lists the NodeManager RUNNING, and stops both
after the session. ``conf_dir`` is what spark-submit needs as ``HADOOP_CONF_DIR``.

Sized for this 2-core machine: the NodeManager offers 4096 MB and 4 vcores, containers are granted in
steps of 256 MB (``yarn.scheduler.minimum-allocation-mb``) up to 2048 MB, the ApplicationMasters may take
half of the queue (``maximum-am-resource-percent`` 0.5; YARN's default 0.1 would leave no room for one),
the virtual and physical memory checks and the disk health checker are off, one attempt per application
(``yarn.resourcemanager.am.max-attempts`` 1: a killed ApplicationMaster ends its application), container
folders are kept 10 minutes after they end (their logs are in ``<workdir>/nm-logs``), a NodeManager that
stops heartbeating is LOST after 10 s (``yarn.nm.liveness-monitor.expiry-interval-ms``; YARN's default is 10
minutes).

:meth:`YarnCluster.lose_node` kills the NodeManager and every process of its containers with SIGKILL, as a host
that dies; :meth:`YarnCluster.start_nodemanager` brings a NodeManager back on the same addresses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.emulators import JARS, Emulator, _spawn, free_port, jar_files
from tests.support.hdfs import _site, missing_hdfs

YARN_JARS = JARS / "yarn"

LOG4J = """\
log4j.rootLogger=WARN,console
log4j.logger.org.apache.hadoop.yarn.server.resourcemanager.RMAppManager=INFO
log4j.logger.org.apache.hadoop.yarn.server.resourcemanager.rmapp=INFO
log4j.logger.org.apache.hadoop.yarn.server.nodemanager.containermanager.container=INFO
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{HH:mm:ss,SSS} %p %c{1}: %m%n
"""

# What sizes YARN for 2 cores (see the module's docstring).
SIZING = {
    "yarn.nodemanager.resource.memory-mb": "4096",
    "yarn.nodemanager.resource.cpu-vcores": "4",
    "yarn.scheduler.minimum-allocation-mb": "256",
    "yarn.scheduler.maximum-allocation-mb": "2048",
    "yarn.scheduler.maximum-allocation-vcores": "2",
    "yarn.nodemanager.vmem-check-enabled": "false",
    "yarn.nodemanager.pmem-check-enabled": "false",
    "yarn.nodemanager.disk-health-checker.enable": "false",
    "yarn.resourcemanager.am.max-attempts": "1",
    "yarn.nm.liveness-monitor.expiry-interval-ms": "10000",
}


def missing_yarn() -> str | None:
    """Why the YARN tests cannot run here, or None."""
    if not any("hadoop-yarn-server-resourcemanager-" in Path(j).name for j in jar_files(YARN_JARS)):
        return f"Hadoop's ResourceManager and NodeManager jars are not in {YARN_JARS} (make jars)"
    return missing_hdfs()


class YarnCluster(Emulator):
    """The ResourceManager (``process``, ``url``: its web address, whose REST API is ``/ws/v1/cluster``) and
    its NodeManager; ``conf_dir``: the Hadoop configuration a client needs (HADOOP_CONF_DIR)."""

    nodemanager: subprocess.Popen | None = None
    conf_dir: Path | None = None
    started_in: float = 0.0

    def rest(self, path: str) -> dict:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.url}/ws/v1/cluster/{path}", timeout=5) as answer:
            return json.load(answer)

    def apps(self, **query: str) -> list[dict]:
        """The applications the ResourceManager lists (``states=RUNNING``, ``name=...``: its filters)."""
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return (self.rest(f"apps{'?' + q if q else ''}").get("apps") or {}).get("app") or []

    def app(self, application_id: str) -> dict:
        return self.rest(f"apps/{application_id}")["app"]

    def node_states(self) -> list[str]:
        """The states of the NodeManagers the ResourceManager knows (RUNNING, LOST, ...)."""
        nodes = self.rest("nodes?states=NEW,RUNNING,UNHEALTHY,LOST,REBOOTED,SHUTDOWN").get("nodes") or {}
        return [node.get("state") for node in nodes.get("node") or []]

    def wait_operational(self, timeout: float = 120.0) -> None:
        """Until the ResourceManager lists a RUNNING NodeManager."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in (self.process, self.nodemanager):
                if process.poll() is not None:
                    raise RuntimeError(f"YARN exited with {process.returncode}: {self.log_tail()}")
            try:
                if "RUNNING" in self.node_states():
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"YARN was not ready at {self.url} within {timeout:.0f} s: {self.log_tail()}")

    def start_nodemanager(self) -> None:
        """Run a NodeManager (again, after :meth:`lose_node`) on the configured addresses; until it is RUNNING."""
        java = ["java", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                f"{self.conf_dir}:{YARN_JARS / '*'}", "org.apache.hadoop.yarn.server.nodemanager.NodeManager"]
        # containers run $JAVA_HOME/bin/java: the NodeManager passes its JAVA_HOME on (env-whitelist)
        with _environ(JAVA_HOME=os.environ.get("JAVA_HOME") or which_java_home() or ""):
            self.nodemanager, _ = _spawn(f"nodemanager-{time.monotonic_ns()}", java, self.workdir)
        self.wait_operational()

    def lose_node(self) -> None:
        """The node dies: SIGKILL to the NodeManager and to every container's session (each runs in a session
        of its own, in a folder under ``nm-local``); YARN learns it only from the missing heartbeats."""
        import psutil

        groups = set()
        for process in psutil.process_iter(["cwd"]):
            with contextlib.suppress(psutil.Error, OSError):
                if (process.info["cwd"] or "").startswith(str(self.workdir / "nm-local")):
                    groups.add(os.getpgid(process.pid))
        self.nodemanager.kill()
        self.nodemanager.wait()
        for group in groups:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"{log.name}: {log.read_text(errors='replace')[-chars:]}"
                         for log in sorted(self.workdir.glob("*.log")))

    def container_logs(self, application_id: str, chars: int = 3000) -> str:
        """The tails of the stdout/stderr of the application's containers (the NodeManager's log folder)."""
        return "\n".join(f"{p.relative_to(self.workdir)}: {p.read_text(errors='replace')[-chars:]}"
                         for p in sorted((self.workdir / "nm-logs" / application_id).glob("*/std*")))

    def stop(self) -> None:
        if self.nodemanager is not None and self.nodemanager.poll() is None:
            self.nodemanager.terminate()
            try:
                self.nodemanager.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.nodemanager.kill()
                self.nodemanager.wait()
        super().stop()


def start_yarn(default_fs: str, attempts: int = 3) -> YarnCluster:
    """Write a configuration folder for YARN over ``default_fs`` and run a ResourceManager and a NodeManager
    on free ports of 127.0.0.1. Ten ports are chosen before the daemons bind them, so another process may take
    one meanwhile: a daemon that exits on a port in use is started again on fresh ports."""
    began = time.monotonic()
    for attempt in range(attempts):
        try:
            cluster = _start_yarn(default_fs)
        except RuntimeError as exc:
            if "BindException" not in str(exc) or attempt == attempts - 1:
                raise
            continue
        cluster.started_in = time.monotonic() - began
        return cluster
    raise AssertionError("unreachable")


def _start_yarn(default_fs: str) -> YarnCluster:
    workdir = Path(tempfile.mkdtemp(prefix="yarn-"))
    conf = workdir / "conf"
    conf.mkdir()
    web = free_port()
    (conf / "core-site.xml").write_text(_site({"fs.defaultFS": default_fs, "hadoop.tmp.dir": str(workdir / "tmp")}))
    (conf / "hdfs-site.xml").write_text(_site({"dfs.replication": "1"}))
    (conf / "yarn-site.xml").write_text(_site({
        "yarn.resourcemanager.hostname": "127.0.0.1",
        "yarn.resourcemanager.address": f"127.0.0.1:{free_port()}",
        "yarn.resourcemanager.scheduler.address": f"127.0.0.1:{free_port()}",
        "yarn.resourcemanager.resource-tracker.address": f"127.0.0.1:{free_port()}",
        "yarn.resourcemanager.admin.address": f"127.0.0.1:{free_port()}",
        "yarn.resourcemanager.webapp.address": f"127.0.0.1:{web}",
        "yarn.nodemanager.hostname": "127.0.0.1",
        "yarn.nodemanager.address": f"127.0.0.1:{free_port()}",
        "yarn.nodemanager.localizer.address": f"127.0.0.1:{free_port()}",
        "yarn.nodemanager.webapp.address": f"127.0.0.1:{free_port()}",
        "yarn.nodemanager.local-dirs": str(workdir / "nm-local"),
        "yarn.nodemanager.log-dirs": str(workdir / "nm-logs"),
        "yarn.nodemanager.delete.debug-delay-sec": "600",
        "yarn.log-aggregation-enable": "false",
        "yarn.resourcemanager.nodemanagers.heartbeat-interval-ms": "500",
        "yarn.nodemanager.env-whitelist": "JAVA_HOME,HADOOP_CONF_DIR,PATH,LANG,TZ",
        **SIZING}))
    (conf / "capacity-scheduler.xml").write_text(_site({
        "yarn.scheduler.capacity.root.queues": "default",
        "yarn.scheduler.capacity.root.default.capacity": "100",
        "yarn.scheduler.capacity.root.default.maximum-capacity": "100",
        "yarn.scheduler.capacity.maximum-am-resource-percent": "0.5"}))
    (conf / "log4j.properties").write_text(LOG4J)
    java = ["java", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{conf}:{YARN_JARS / '*'}"]
    rm, log = _spawn("resourcemanager", [*java, "org.apache.hadoop.yarn.server.resourcemanager.ResourceManager"],
                     workdir)
    cluster = YarnCluster("yarn", f"http://127.0.0.1:{web}", rm, workdir, log)
    cluster.conf_dir = conf
    try:
        cluster.start_nodemanager()
    except RuntimeError:
        cluster.stop()  # both daemons, and their folder
        raise
    return cluster


@pytest.fixture(scope="session")
def yarn_cluster(hdfs_namenode):
    """One ResourceManager and NodeManager over the session's HDFS for the whole session
    (tests/conftest.py::require_part if they cannot run here)."""
    from tests.support.emulators import running

    yield from running("yarn", missing_yarn, lambda: start_yarn(hdfs_namenode.url))


@contextlib.contextmanager
def _environ(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def which_java_home() -> str | None:
    java = shutil.which("java")
    return str(Path(java).resolve().parent.parent) if java else None
