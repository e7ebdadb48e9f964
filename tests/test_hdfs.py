"""HDFS for real: a NameNode and a DataNode (Hadoop 3.5.0's jars, tests/support/hdfs.py) on 127.0.0.1.

* A query RUNNING with its checkpoint on ``hdfs://`` (Spark's own Hadoop client) is savepointed again
  and again while its batches commit; the last savepoint is restored into a fresh HDFS folder and the
  query continued there: its output equals an uninterrupted run's.
* The lease on the NameNode's clock (acquire, renew, stale, takeover, release) through hdfs-native.
* Without hdfs-native (the ``hdfs`` extra), an ``hdfs://`` URL fails with missing_backend.

The back end contract (atomic write, exclusive create between racers, listings, versions, no
server-side copy) is run on this NameNode by tests/unit/storage/test_backends.py, and the lease and
catalog race between processes by tests/test_store_races.py.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from airflow_savepoints.core.lease import Lease, store_now
from airflow_savepoints.storage import Store
from airflow_savepoints.storage.backends.hdfs import FAIL_FAST_CONF, HdfsBackend
from tests.conftest import require_part
from tests.support.blocked import cli_without
from tests.support.hdfs import missing_hdfs_native
from tests.test_s3a import savepointed_while_running_restored_and_continued

pytestmark = pytest.mark.hdfs


@pytest.mark.slow
def test_a_query_running_on_hdfs_is_savepointed_restored_to_a_new_folder_and_continued(spark, hdfs_root, tmp_path):
    spark.sparkContext._jsc.hadoopConfiguration().set("dfs.replication", "1")  # one DataNode
    # a savepoint here takes ~5 s (hdfs-native closes each file in ~0.5 s): the query commits its
    # batches meanwhile, so one savepoint (or more) is taken while it runs, not one per batch
    savepointed_while_running_restored_and_continued(spark, "aggregation_hdfs", hdfs_root, tmp_path, batches_savepointed=1)
    assert Store(hdfs_root).isfile("savepoints/aggregation_hdfs/_catalog.json")


# A judge in a child process on a clock faketime moved: it prints its clock and what it reads of the lease.
JUDGE = ("import json, sys, time\n"
         "from airflow_savepoints.core.lease import Lease\n"
         "from airflow_savepoints.storage import Store\n"
         "state = Lease(Store(sys.argv[1]), '_lease.json', stale_after=1.5).read()\n"
         "print(json.dumps({'clock': time.time(), 'token': state.token, 'stale': state.stale, 'age_s': state.age_s}))")


def judged_on_a_skewed_clock(url: str, offset: str, skew_s: float) -> dict:
    """The lease at ``url`` as a process whose clock is ``offset`` away judges it; checks the clock moved."""
    before = time.time()
    out = subprocess.run(["faketime", "-f", offset, sys.executable, "-c", JUDGE, url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    judged = json.loads(out.stdout)
    assert abs(judged["clock"] - before - skew_s) < 60, (judged, offset)  # the judge's clock moved by the offset
    return judged


def test_a_lease_on_hdfs_goes_by_the_namenodes_clock_and_its_fencing_token(hdfs_root):
    """Judges an hour ahead and an hour behind the NameNode see a renewed lease fresh and a lapsed one
    stale: a judge by its own clock would call the first an hour old and the second an hour ahead."""
    require_part("faketime", None if shutil.which("faketime") else "faketime is not installed (make testbed installs it)")
    store = Store(f"{hdfs_root}/job")
    assert abs(store_now(store, fresh=True) - time.time()) < 5  # the NameNode's clock: this machine's
    first = Lease(store, "_lease.json", token="run-1", stale_after=1.5, facts={"host": "a"})
    assert first.try_acquire() is None
    assert first.renew(application_id="app-7")
    state = Lease(store, "_lease.json", stale_after=1.5).read()
    assert (state.token, state.facts, state.stale) == ("run-1", {"host": "a", "application_id": "app-7"}, False)
    renewing = threading.Event()

    def renew() -> None:  # the holder's heartbeat, at a quarter of its 1.5 s
        while not renewing.wait(0.35):
            first.renew()

    thread = threading.Thread(target=renew)
    thread.start()
    try:
        ahead = judged_on_a_skewed_clock(store.url, "+1h", 3600)
    finally:
        renewing.set()
        thread.join()
    assert (ahead["token"], ahead["stale"]) == ("run-1", False) and ahead["age_s"] < 1.5, ahead
    assert Lease(store, "_lease.json", token="run-2", stale_after=1.5).try_acquire().token == "run-1"  # held
    time.sleep(2.0)  # first stops renewing: stale by the file's modification time on the NameNode
    behind = judged_on_a_skewed_clock(store.url, "-1h", -3600)
    assert (behind["token"], behind["stale"]) == ("run-1", True) and behind["age_s"] >= 1.5, behind
    second = Lease(store, "_lease.json", token="run-2", stale_after=1.5)
    assert second.try_acquire() is None
    assert first.renew() is False and first.release() is False  # the fencing token tells them apart
    assert json.loads(store.read_bytes("_lease.json"))["token"] == "run-2"
    assert second.release() and store.list_files() == {}  # no temporary or break file left


def _put_a_listing(url: str, queue) -> None:
    queue.put(sorted(Store(url).list_files()))


def test_a_forked_process_of_one_holding_an_hdfs_client_works_and_exits(hdfs_root):
    """hdfs-native's client owns a tokio runtime whose threads a forked child lacks; fsspec drops its
    cached filesystems in every child, and freeing that client there hung the child for ever (every
    later forking test of the session, e.g. test_lease's racers, timed out). The child keeps it."""
    Store(f"{hdfs_root}/forked").write_bytes_atomic("a", b"1")  # then only fsspec's cache holds the client
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=_put_a_listing, args=(f"{hdfs_root}/forked", queue))
    child.start()
    assert queue.get(timeout=60) == ["a"]  # the child opens HDFS again through a client of its own
    child.join(30)
    assert child.exitcode == 0


def test_a_dead_namenode_fails_a_command_within_seconds_naming_it(tmp_path, monkeypatch):
    """Nothing listens at the NameNode's port: hdfs-native would retry for minutes (Hadoop's 15 failover
    attempts); the command fails in seconds with storage_unreachable naming the URL (not "does not exist")."""
    require_part("hdfs", missing_hdfs_native())
    from typer.testing import CliRunner

    from airflow_savepoints.cli.main import app

    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        root = f"hdfs://127.0.0.1:{s.getsockname()[1]}/savepoints"
    started = time.monotonic()
    result = CliRunner().invoke(app, ["list", "--job", "orders", "--dir", root, "--conn-id", "", "--json"])
    took = time.monotonic() - started
    error = json.loads(result.stdout)["error"]
    assert result.exit_code != 0 and error["code"] == "storage_unreachable", result.stdout
    assert root in error["message"] and "Connection refused" in error["message"] and "NameNode" in error["hint"], error
    assert took < 60, took  # Hadoop's defaults (15 attempts, sleeps up to 15 s) took minutes; ~2 s here unloaded

    # a key the Hadoop configuration sets (or the storage options) is not replaced by the fail-fast default
    (tmp_path / "hdfs-site.xml").write_text("<configuration><property><name>dfs.client.failover.max.attempts</name>"
                                            "<value>15</value></property></configuration>")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    options = HdfsBackend.filesystem_options({"host": "nn", "dfs.client.failover.sleep.max.millis": "5000"})
    assert "dfs.client.failover.max.attempts" not in options
    assert options["dfs.client.failover.sleep.max.millis"] == "5000"
    assert options["dfs.client.failover.sleep.base.millis"] == FAIL_FAST_CONF["dfs.client.failover.sleep.base.millis"]


def test_without_hdfs_native_an_hdfs_url_fails_naming_the_extra_and_changes_nothing(hdfs_root):
    """fsspec's own ``hdfs`` filesystem (pyarrow's) is not a fallback: a command that would write the
    catalog fails with missing_backend naming the ``hdfs`` extra, and the NameNode's tree is as it was."""
    store = Store(hdfs_root)
    store.write_bytes_atomic("orders/sp-1/_metadata", b"{}")
    out = subprocess.run(cli_without("hdfs_native", "catalog", "--job", "orders", "--rebuild",
                                     "--dir", hdfs_root, "--conn-id", "", "--json"), capture_output=True, text=True, timeout=120)
    error = json.loads(out.stdout)["error"]
    assert out.returncode != 0 and error["code"] == "missing_backend", out.stdout + out.stderr
    assert "pip install 'airflow-savepoints[hdfs]'" in error["hint"] and "hdfs-native" in error["hint"], error
    assert list(store.list_files()) == ["orders/sp-1/_metadata"]
