"""Shared fixtures: one real local Spark session, a real moto S3 server, real checkpoints."""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

# Never let botocore probe an instance-metadata address, and keep Airflow state out of $HOME.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_HOME = tempfile.mkdtemp(prefix="airflow-home-")
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)  # each run left one behind in /tmp
os.environ.update({
    "AIRFLOW_HOME": AIRFLOW_HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
})
os.environ.pop("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR", None)
logging.getLogger("py4j").setLevel(logging.WARNING)  # its shutdown messages hit closed streams
os.environ["PYSPARK_PYTHON"] = sys.executable  # the venv interpreter, not its resolved base
# Every JVM the tests start (Spark drivers and executors, spark-submit jobs, standalone daemons, brokers) is
# short-lived and small: C1 only and the serial GC. On 2 cores C2's compiler threads and G1's workers took the CPU
# the tests wait on (a small streaming job under spark-submit, at load 7-11: 71 and 101 s by default, 25 and 39 s
# so). Each JVM says "Picked up JAVA_TOOL_OPTIONS" on its stderr. A user's environment that sets it wins.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

import pytest  # noqa: E402

# ---- real parts: a missing one fails the run unless SKIP_PARTS names it ---------------------------
# Each real part the tests start (a NameNode, a broker, an emulator, a browser, ...) says here why it
# cannot run, through require_part(). A missing part FAILS its tests: `make test` installs them all
# (Makefile), so a gap is a broken machine, not a detail. To leave parts out on purpose, name them:
# `SKIP_PARTS=hdfs,kafka make test`; their tests are then skipped and the summary lists them.
LEFT_OUT = "left out (SKIP_PARTS): "
PARTS = {
    "hdfs": "a NameNode and DataNode (Hadoop's jars, `make jars`) through hdfs-native",
    "yarn": "a ResourceManager and NodeManager (Hadoop's jars, `make jars`) over the HDFS part",
    "kafka": "a Kafka broker and Spark's Kafka connector (`make jars`)",
    "s3a": "hadoop-aws and the AWS SDK in Spark (`make jars`)",
    "delta": "Delta Lake's jars for Spark (`make jars`)",
    "gcs": "fake-gcs-server (the test extra's wheel)",
    "azure": "Azurite (`make emulators`)",
    "browser": "Chromium and chromedriver (`make browser`)",
    "testbed": "root, Postgres, Redis and libfaketime for the distributed test bed (`make testbed`)",
    "faketime": "the faketime command (`make testbed`)",
    "js-lint": "Biome, the JavaScript linter (`make js-lint-tools`)",
}


def skipped_parts() -> set[str]:
    """The parts named in SKIP_PARTS (comma- or space-separated); an unknown name is a usage error."""
    names = {n for n in os.environ.get("SKIP_PARTS", "").replace(",", " ").split() if n}
    unknown = names - PARTS.keys()
    if unknown:
        raise pytest.UsageError(f"SKIP_PARTS names {', '.join(sorted(unknown))}: not a part; "
                                f"the parts are {', '.join(sorted(PARTS))}")
    return names


def require_part(part: str, missing: str | None) -> None:
    """The one rule for real parts. ``missing`` is why ``part`` cannot run here (None: it can). A part
    named in SKIP_PARTS is left out (the test skips, the summary says so) whether present or not; a
    missing part not named fails the test with the reason and how to leave it out."""
    if part in skipped_parts():
        pytest.skip(f"{LEFT_OUT}{part}", allow_module_level=True)
    if missing:
        pytest.fail(f"{part} is missing: {missing}. `make test` installs it; to leave it out, "
                    f"SKIP_PARTS={part} make test", pytrace=False)


def pytest_configure(config):
    skipped_parts()  # an unknown name stops the run before anything starts


def pytest_collection_finish(session):
    """Tests beyond the unit tree start Spark's JVMs: give them the class-data archive (built once)."""
    if any("tests/unit/" not in item.nodeid for item in session.items):
        from tests.support.jvm_archive import use_for_spark_jvms

        use_for_spark_jvms()


def pytest_terminal_summary(terminalreporter):
    names = skipped_parts()
    if not names:
        return
    left_out: dict[str, list[str]] = {part: [] for part in names}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if LEFT_OUT in reason:
            left_out.setdefault(reason.split(LEFT_OUT, 1)[1].strip(), []).append(report.nodeid)
    terminalreporter.section("parts left out (SKIP_PARTS)")
    for part, tests in sorted(left_out.items()):
        terminalreporter.write_line(f"{part}: {PARTS.get(part, '?')}; {len(tests)} test(s) skipped")
        for test in tests:
            terminalreporter.write_line(f"    {test}")


@pytest.fixture
def chromium():
    """The browser part: Chromium and chromedriver, for the UI page tests."""
    from tests.test_plugin import CHROMEDRIVER, CHROMIUM

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    require_part("browser", missing and f"no {' and no '.join(missing)} "
                 "(Debian: apt-get install -y chromium chromium-driver, or `make browser-deps` as root)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def airflow_db():
    """A fresh Airflow 3.3 metadata database (SQLite) in a throw-away AIRFLOW_HOME."""
    from airflow.utils import db

    db.resetdb()
    yield AIRFLOW_HOME


_SHARED_SPARK: list[tuple] = []  # this worker's session and its SQL settings as created, once it exists


@pytest.fixture(scope="session")
def spark():
    from tests.support.spark_shapes import make_spark_session

    session = make_spark_session()
    _SHARED_SPARK.append((session, dict(session.conf.getAll)))
    yield session
    session.stop()


@pytest.fixture(scope="module", autouse=True)
def spark_settings_as_created():
    """Each test module starts from the shared session's SQL settings as created: what a module set (a shape's
    state store and checkpoint format, shuffle partitions, ...) never reaches the next module on its worker,
    whichever order the workers take the modules in."""
    _settings_as_created()
    yield


def _settings_as_created() -> None:
    from tests.support.spark_shapes import restore_session_conf

    for session, created in _SHARED_SPARK:
        restore_session_conf(session, created)


def atomic_conditional_puts() -> None:
    """Make moto's conditional PUT (``If-None-Match: *``, ``If-Match``) atomic, as S3's is: moto 5.2 checks
    the key, then writes it, while its threaded server runs requests side by side, so two racing creates
    could both succeed (seen once in 10 racers for the catalog lock). Unconditional PUTs are left as they are."""
    import threading

    from moto.s3.responses import S3Response

    if getattr(S3Response, "_atomic_conditional_puts", False):
        return
    plain, lock = S3Response._key_response_put, threading.Lock()

    def put(self, *args, **kwargs):
        if "If-None-Match" in self.headers or "If-Match" in self.headers:
            with lock:
                return plain(self, *args, **kwargs)
        return plain(self, *args, **kwargs)

    S3Response._key_response_put = put
    S3Response._atomic_conditional_puts = True


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's standalone S3 server on 127.0.0.1, reached over HTTP through s3fs."""
    from moto.server import ThreadedMotoServer

    atomic_conditional_puts()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """Environment for s3fs against the moto server, through fsspec's own configuration; a fresh bucket."""
    import fsspec

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", s3_endpoint)
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    fsspec.config.set_conf_env(fsspec.config.conf)
    s3fs_class = fsspec.get_filesystem_class("s3")
    s3fs_class.clear_instance_cache()  # instances remember the credentials they were made with
    fs = fsspec.filesystem("s3", endpoint_url=s3_endpoint, skip_instance_cache=True)
    bucket = f"sp-{time.monotonic_ns()}"
    fs.mkdir(bucket)
    yield bucket
    s3fs_class.clear_instance_cache()
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved)


def dag_bag_of_own_bundle(monkeypatch, folder: Path, bundle: str, files: dict[str, str]):
    """A DagBag of DAG files written into ``folder``, configured as a DAG bundle of their own beside
    the project's ``dags`` folder (``dag.test()`` runs only DAGs of a configured bundle)."""
    from airflow.dag_processing.dagbag import DagBag

    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        (folder / name).write_text(source)
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([
        {"name": bundle, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {"path": str(folder)}},
        {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(ROOT / "dags")}},
    ]))
    bag = DagBag(dag_folder=str(folder))
    assert not bag.import_errors, bag.import_errors
    return bag


def job_folder_entries(job_dir: Path) -> list[str]:
    """What a job's savepoint folder holds besides its catalog (savepoint locations, the lease, ...)."""
    return sorted(p.name for p in job_dir.iterdir() if p.name != "_catalog.json") if job_dir.exists() else []


def tree_snapshot(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes: to prove a command changed nothing."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def write_json_inputs(folder: Path, start: int, stop: int, keys: int = 5, rows: int = 20) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, stop):
        path = folder / f"part-{i:05d}.json"
        path.write_text("\n".join(json.dumps({"key": f"k{j % keys}", "value": i * 100 + j}) for j in range(rows)))
        os.utime(path, (1_000_000 + i, 1_000_000 + i))


@pytest.fixture(scope="session")
def stopped_checkpoint(spark, tmp_path_factory) -> Path:
    """A real checkpoint of a stopped stateful query (HDFS state store) that committed 6 batches."""
    from pyspark.sql import functions as F

    base = tmp_path_factory.mktemp("stopped")
    write_json_inputs(base / "input", 0, 6)
    _settings_as_created()  # session fixtures are made before the asking module's reset: not on the last one's settings
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    frame = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(str(base / "input"))
    query = (frame.groupBy("key").agg(F.sum("value").alias("total")).writeStream.outputMode("update")
             .format("noop").option("checkpointLocation", str(base / "checkpoint")).start())
    query.processAllAvailable()
    query.stop()
    return settled_copy(base / "checkpoint", base / "checkpoint-stopped")


@pytest.fixture(scope="session")
def references(spark, tmp_path_factory):
    """The sink of an uninterrupted run of each query shape over all the round trips' input (ALL_FILES files of
    tests/support/spark_shapes.py), computed once a session for the modules that compare a restored run with it
    (test_roundtrip, test_object_stores, test_azure_crc64; each made the same run once a module before)."""
    from tests.support.spark_shapes import ALL_FILES, SHAPES, run_to_end

    cache: dict[str, dict[int, list]] = {}

    def reference(name: str) -> dict[int, list]:
        if name not in cache:
            shape, base = SHAPES[name], tmp_path_factory.mktemp(f"ref-{name}")
            shape.write_input(base / "input", 0, ALL_FILES)
            query = shape.start(spark, base / "input", str(base / "checkpoint"), base / "sink")
            run_to_end(query)
            query.stop()
            cache[name] = shape.read_sink(base / "sink")
        return cache[name]

    return reference


def settled_copy(source: Path, target: Path) -> Path:
    """A copy of a stopped query's checkpoint that nothing else writes to.

    The session's state-store maintenance keeps running for a stopped query's loaded stores and may
    still write snapshots into its checkpoint (seen: a ``..6.snapshot.<uuid>.tmp.crc`` vanishing
    while a test copied the folder). Temp files are left out; a copy that met a file renamed or
    purged under it is made again."""
    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_fixed

    from airflow_savepoints.checkpoint.formats import is_transient_path

    def temp_names(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if ".tmp" in n and is_transient_path(n)}

    @retry(retry=retry_if_exception_type(shutil.Error), stop=stop_after_attempt(6), wait=wait_fixed(0.5),
           before_sleep=lambda _: shutil.rmtree(target, ignore_errors=True), reraise=True)
    def copy() -> None:
        shutil.copytree(source, target, ignore=temp_names)

    copy()
    return target


@pytest.fixture
def checkpoint(stopped_checkpoint, tmp_path) -> Path:
    """A private copy of ``stopped_checkpoint``: a test may damage or extend it."""
    copy = tmp_path / "checkpoint"
    shutil.copytree(stopped_checkpoint, copy)
    return copy


def is_state_file(path: str) -> bool:
    """An HDFS state file: a delta, or a snapshot where Spark's state maintenance already wrote one
    (when it does is Spark's timing, so a test never counts on one kind being there)."""
    return path.startswith("state/") and path.endswith((".delta", ".snapshot"))


def planned_state_files(checkpoint: Path) -> list[str]:
    """The state files a savepoint of ``checkpoint`` copies now, as the planner chooses them."""
    from airflow_savepoints.checkpoint.planner import plan_checkpoint
    from airflow_savepoints.storage import Store

    store = Store(str(checkpoint))
    return sorted(f.path for f in plan_checkpoint(store.list_files(), store.read_bytes).files if is_state_file(f.path))


def remove_checkpoint(path: Path) -> None:
    """rmtree, again if Spark's state-store maintenance (still running for a stopped query's loaded
    stores) wrote a snapshot into it meanwhile."""
    for _ in range(10):
        try:
            shutil.rmtree(path)
            return
        except OSError:
            time.sleep(0.5)
    shutil.rmtree(path)


# Object-store emulators (fake-gcs-server, Azurite) and a fresh bucket/container per test.
from tests.support.emulators import azure_container, azure_emulator, gcs_bucket, gcs_emulator  # noqa: E402, F401


@pytest.fixture
def without_cloud_backends(monkeypatch):
    """gcsfs and adlfs unimportable, as on an install without the [gcs] and [azure] extras (the test
    extra installs both for the emulator tests)."""
    import importlib

    registry = importlib.import_module("fsspec.registry")._registry  # (fsspec.registry is its mapping proxy)
    for module in ("gcsfs", "adlfs"):
        monkeypatch.setitem(sys.modules, module, None)  # `import gcsfs` raises ImportError
    for protocol in ("gs", "gcs", "abfs", "abfss", "az", "adl"):
        if protocol in registry:  # a class fsspec already imported would be reused
            monkeypatch.delitem(registry, protocol)


# One NameNode and DataNode per session and a fresh folder per test (tests/support/hdfs.py);
# one Kafka broker (KRaft) per session and a fresh topic per test (tests/support/kafka.py);
# one ResourceManager and NodeManager over that HDFS per session (tests/support/yarn.py);
# one Spark standalone master and worker per session (tests/support/spark_cluster.py).
from tests.support.hdfs import hdfs_namenode, hdfs_root  # noqa: E402, F401
from tests.support.kafka import kafka_broker, kafka_topic  # noqa: E402, F401
from tests.support.spark_cluster import spark_standalone  # noqa: E402, F401
from tests.support.yarn import yarn_cluster  # noqa: E402, F401
