"""The savepoints console (Browse > Savepoints) in a real Airflow 3.3 API server, in headless Chromium.

One deployment for the module: savepoints of a real PySpark checkpoint in five jobs whose lifecycle
files say running, stopped, failed (and one job the lifecycle never ran), a job folder without
savepoints, a stray README.md in the root, a savepoint in progress and one in conflict, the
example DAGs serialized (no scheduler: a triggered run stays queued, which is what is checked), an
admin and a viewer. The API is checked over HTTP, the page after a real login through Airflow's
form; screenshots go to test-artifacts/ (the main ones are copied into docs/ by hand).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_savepoints.core import dispose_savepoint, take_savepoint
from airflow_savepoints.core.catalog import Catalog
from airflow_savepoints.core.models import SavepointType
from airflow_savepoints.jobs.description.channel import CONTROL_FOLDER, JobControl
from airflow_savepoints.storage import Store
from tests.conftest import ROOT, require_part
from tests.support.airflow_cluster import airflow_cluster, tail
from tests.test_plugin import ARTIFACTS, WebDriver

API = "/savepoints/api"
VIEWER = "viewer-vera"
JOBS = ["clicks", "empty-job", "fraud", "inventory", "ledger", "orders", "payments"]
EXAMPLE_DAGS = ("periodic_savepoints.py", "stop_job_with_savepoint.py", "restore_from_savepoint.py", "jobs.yaml")
browser_needed = pytest.mark.usefixtures("chromium")  # tests/conftest.py: the browser part


# ---- the savepoint root the console shows ----------------------------------------------------------

RETIRED = "beyond max_periodic 3: not among the newest periodic savepoints"
FRAUD_REASON = "UnknownTopicOrPartitionException: the Kafka topic 'fraud' was deleted"
FRAUD_LOG = "\n".join(["the query stopped; driver log:", "26/11/25 18:00:01 INFO SparkContext: Running Spark version 4.2.0",
                       "26/11/25 18:00:02 ERROR MicroBatchExecution: Query fraud terminated with error "
                       "org.apache.kafka.common.errors." + FRAUD_REASON,
                       "26/11/25 18:00:03 INFO ShutdownHookManager: Shutdown hook called"])

def _beat(root: Path, job: str, run_id: str, **facts: Any) -> JobControl:
    control = JobControl(Store(str(root / job / CONTROL_FOLDER / run_id)))
    control.beat(**{"state": "running", "timeout_s": 3600, "spark_version": "4.1.0", **facts})
    return control


def populate(root: Path, checkpoint: Path, earlier: Path) -> dict[str, list[str]]:
    """Jobs in every state the console shows; returns each job's savepoint ids, oldest first."""
    def take(source: Path, job: str, kind: str, reason: str) -> str:
        return take_savepoint(str(source), job, savepoint_dir=str(root), savepoint_type=kind,
                              reason=reason).manifest.savepoint_id

    taken: dict[str, list[str]] = {"orders": [take(earlier, "orders", "periodic", f"round {i}") for i in range(11)]}
    taken["orders"].append(take(checkpoint, "orders", "manual", "<script>alert('x')</script> before upgrade"))
    Catalog(Store(str(root / "orders")), "orders").begin("savepoint-0a1b2c-00000000abcd", SavepointType.PERIODIC,
                                                         "in flight", None)
    _beat(root, "orders", "run-orders-1", last_committed_batch=5)
    record_load(Store(str(root / "orders")))

    retired = take(checkpoint, "payments", "periodic", "hourly")  # disposed below: only its history entry remains
    taken["payments"] = [take(checkpoint, "payments", "stop", "decommissioned")]
    dispose_savepoint(str(root / "payments" / retired), savepoint_dir=str(root), by="retention", why=RETIRED)
    # a "Savepoint now" that failed after its plan (bad input records nothing: tests/test_bad_input.py)
    Catalog(Store(str(root / "payments")), "payments").record_failure(
        None, SavepointType.MANUAL, datetime.now(UTC),
        f"checkpoint {root.parent / 'gone-checkpoint'} vanished while it was copied", "Savepoint now")
    record_file_backlog(Store(str(root / "payments")))
    payments = _beat(root, "payments", "run-payments-1", last_committed_batch=5)
    payments.acknowledge_stop({"request_id": "stop-1"}, last_committed_batch=5)

    taken["inventory"] = [take(checkpoint, "inventory", "periodic", "hourly")]  # made two hours old below: stale
    Catalog(Store(str(root / "inventory")), "inventory").update(
        lambda doc: setattr(doc.records[taken["inventory"][0]], "created_at", datetime.now(UTC) - timedelta(hours=2)))
    _beat(root, "inventory", "run-inventory-1", last_committed_batch=5)

    taken["fraud"] = [take(checkpoint, "fraud", "manual", "before a schema change")]
    Catalog(Store(str(root / "fraud")), "fraud").update(
        lambda doc: setattr(doc.records[taken["fraud"][0]], "conflict", "its _metadata names another query"))
    _beat(root, "fraud", "run-fraud-1").report_failure(RuntimeError(FRAUD_LOG))

    taken["clicks"] = [take(checkpoint, "clicks", "periodic", "hourly")]  # the lifecycle never ran it
    (root / "empty-job").mkdir()
    (root / "README.md").write_text("savepoints of the streaming jobs; see the runbook\n")  # not a job
    return taken


SERIES_WRITTEN = 900  # triggers recorded for orders; the series keeps the last DEFAULT_KEEP (720)
DECISIONS = [("hold", "catching_up", "held", 2, None), ("scale_up", "scale_up", "recommended", 2, 4),
             ("scale_up", "scale_up", "rolled_back", 2, 4), ("hold", "cooldown", "held", 2, None),
             ("scale_up", "scale_up", "acted", 2, 4), ("scale_down", "scale_down", "recommended", 4, 2)]


def progress(batch: int, now: float) -> dict[str, Any]:
    """One ``query.lastProgress`` of orders, 5 s triggers: a load step up at batch 450 (batches take longer than
    the trigger, a Kafka backlog grows), 4 cores from batch 600 (it drains), the load back down from batch 780."""
    load = 400.0 if 450 <= batch < 780 else 150.0
    cores = 4 if batch >= 600 else 2
    processed = 120.0 * cores * (1 + 0.05 * (batch % 7) / 7)
    duration = min(load / processed, 1.6) * 3500 + 40 * (batch % 5)
    backlog = (batch - 450) * 600 if 450 <= batch < 600 else max(0, 90000 - (batch - 600) * 1500) if batch >= 600 else 0
    stamp = datetime.fromtimestamp(now - (SERIES_WRITTEN - batch) * 5, UTC).isoformat().replace("+00:00", "Z")
    return {"batchId": batch, "timestamp": stamp, "numInputRows": int(load * 5), "inputRowsPerSecond": load,
            "processedRowsPerSecond": processed, "durationMs": {"triggerExecution": duration, "addBatch": duration - 30},
            "stateOperators": [{"operatorName": "stateStoreSave", "numRowsTotal": 1000 + batch, "memoryUsedBytes": 81920,
                                "numShufflePartitions": 4}],
            "sources": [{"latestOffset": {"orders": {"0": 100000 + backlog}}, "endOffset": {"orders": {"0": 100000}}}]}


def record_file_backlog(folder: Store) -> None:
    """payments' metric series: a file source whose unread files the in-job helper counted (8, 6, 4, 2, 0)."""
    from airflow_savepoints.jobs.description.metrics import point_of, write_series

    now = time.time()
    sources = [{"description": "FileStreamSource[file:/in]", "endOffset": {"logOffset": 1}, "latestOffset": None}]
    write_series(folder, [point_of({**progress(b, now), "sources": sources}, trigger_interval_ms=5000, cores=2,
                                   run_id="run-payments-1").model_copy(update={"backlog_files": 8 - 2 * i, "files_read": 2})
                          for i, b in enumerate(range(SERIES_WRITTEN - 5, SERIES_WRITTEN))])


def record_load(folder: Store) -> None:
    """orders' metric series and autoscale decisions, through metrics.py's own writers."""
    from airflow_savepoints.jobs.description.metrics import append_decision, point_of, write_series

    now = time.time()
    write_series(folder, [point_of(progress(b, now), trigger_interval_ms=5000, cores=4 if b >= 600 else 2,
                                   run_id="run-orders-1" if b < 600 else "run-orders-2") for b in range(SERIES_WRITTEN)])
    for i, (action, reason, outcome, cores, target) in enumerate(DECISIONS):
        at = now - (len(DECISIONS) - i) * 600
        append_decision(folder, {  # as `job autoscale` records one (jobs/workflows/autoscale.py, evaluate)
            "job": "orders", "at": datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds"), "mode": "recommend",
            "dry_run": False, "outcome": outcome, "action": action, "reason": reason, "message": f"decision {i}: {reason}",
            "current": {"executors": cores, "cores": cores, "partitions": 4},
            "target": {"executors": target, "cores": target, "partitions": None},
            "spark_conf": {}, "evidence": {"utilization": 1.2, "window_s": 300}, "run_id": "run-orders-1",
            "points": 720, "upgrade": None, "at_epoch": at, "error": {
                "code": "autoscale_rolled_back", "message": "the scale_up of job 'orders' failed its check",
                "hint": "see the cause and its log"} if outcome == "rolled_back" else None})


def jobs_file(path: Path, root: Path) -> Path:
    """The jobs file the API server reads: a job declared on this root before its first savepoint
    (shown, not started), one of another root (not shown), and orders, whose file sink holds batches 0..4."""
    job = "application: /opt/jobs/{name}.py\n    checkpoint: /data/checkpoints/{name}\n    savepoint_dir: {where}"
    entries = [("ledger", root), ("elsewhere", path.parent / "other-savepoints"), ("orders", root)]
    sink = orders_sink(root)
    for batch in range(5):
        (sink / "_spark_metadata").mkdir(parents=True, exist_ok=True)
        (sink / "_spark_metadata" / str(batch)).write_text('v1\n')
    path.write_text("jobs:\n" + "".join(f"  - name: {name}\n    " + job.format(name=name, where=where) + "\n"
                                          for name, where in entries) + f"    sink: {{kind: file, path: {sink}}}\n")
    return path


def orders_sink(root: Path) -> Path:
    return root.parent / "orders-sink"


# ---- pure parts (fast) -----------------------------------------------------------------------------

def test_job_folders_are_directories_and_a_missing_root_says_so(tmp_path):
    from airflow_savepoints.core.pointer import list_jobs
    from airflow_savepoints.errors import SavepointRootMissingError

    root = tmp_path / "savepoints"
    with pytest.raises(SavepointRootMissingError, match="does not exist") as missing:
        list_jobs(Store(str(root)))
    assert missing.value.code == "savepoint_root_not_found" and "savepoint_dir" in missing.value.hint
    for name in ("orders", "payments", ".hidden", "_tmp", "a..b"):
        (root / name).mkdir(parents=True)
    (root / "README.md").write_text("not a job")
    (root / "notes").write_text("a file with a job-like name")
    assert list_jobs(Store(str(root))) == ["orders", "payments"]
    (root / "empty").mkdir()
    assert list_jobs(Store(str(tmp_path / "savepoints" / "empty"))) == []  # exists, no jobs: not an error


def test_a_failure_reason_is_its_error_line_not_the_log_around_it():
    from airflow_savepoints.plugins.console import error_reason

    exited = ("its process (pid 12) exited without a stop request; last log lines:\n"
              "26/11/25 18:00:01 INFO SparkContext: Running Spark version 4.2.0\n"
              "26/11/25 18:00:02 ERROR Executor: org.apache.spark.SparkException: [CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT] "
              "cannot commit exitCode=143\n26/11/25 18:00:03 INFO ShutdownHookManager: Shutdown hook called")
    assert error_reason(exited) == "SparkException: [CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT] cannot commit exitCode=143"
    assert error_reason(FRAUD_LOG) == FRAUD_REASON
    assert error_reason("RuntimeError: the Kafka topic 'fraud' was deleted") == "RuntimeError: the Kafka topic 'fraud' was deleted"
    assert error_reason("nothing failed here\nat all") == "nothing failed here"


BIOME = ROOT / ".tools" / "biome" / "node_modules" / ".bin" / "biome"


def test_the_console_script_passes_the_linter():
    """plugins/static/console.js, as the page loads it, passes Biome's recommended rules (biome.json)."""
    require_part("js-lint", None if BIOME.exists() else "the JavaScript linter is not installed: `make js-lint-tools` "
                 "(npm install of @biomejs/biome into .tools/biome; needs Node.js and npm)")
    linted = subprocess.run([str(BIOME), "lint", "--error-on-warnings", "airflow_savepoints/plugins/static"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert linted.returncode == 0, linted.stdout[-4000:] + linted.stderr[-4000:]
    assert "Checked 1 file" in linted.stdout + linted.stderr


def test_api_mds_metrics_keys_are_the_answers(tmp_path):
    """docs/api.md's key lists of the metrics route: the answer's keys (of a real answer), a point's
    (``ChartPoint``) and a decision's (``DecisionEntry``), both ways."""
    from airflow_savepoints.plugins.console import ChartPoint, DecisionEntry, job_metrics
    from tests.unit.test_docs_drift import json_keys

    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("### A job's load"):text.index("### Actions")]
    answer, point, decision = (json_keys(section[section.index(label):]) for label in
                               ("The answer's JSON:", "A point's JSON:", "A decision's JSON:"))
    assert sorted(answer) == sorted(job_metrics(Store(str(tmp_path)), "orders", 10, 10)), answer
    assert sorted(point) == sorted(ChartPoint.model_fields) and sorted(decision) == sorted(DecisionEntry.model_fields)


def test_the_last_batch_is_the_checkpoints_when_the_heartbeat_lags(stopped_checkpoint, tmp_path):
    from airflow_savepoints.plugins.console import _newest_batch

    assert _newest_batch(4, str(stopped_checkpoint)) == 5  # the heartbeat said 4, the checkpoint committed 5
    assert _newest_batch(7, str(stopped_checkpoint)) == 7
    assert _newest_batch(4, str(tmp_path / "elsewhere")) == 4 and _newest_batch(None, None) is None


def test_pages_commands_and_intervals():
    from airflow_savepoints.core.catalog import SavepointRecord, SavepointState
    from airflow_savepoints.plugins.console import commands, page_of, periodic_interval_s

    now = datetime.now(UTC)
    records = [SavepointRecord(savepoint_id=f"savepoint-abc123-{i:012x}", job="orders", type=SavepointType.PERIODIC,
                               state=SavepointState.COMPLETED, created_at=now, updated_at=now) for i in range(25)]
    page = page_of(records, 20, 10, newest_first=True)
    assert (page["total"], page["offset"], page["order"]) == (25, 20, "newest")
    assert [s["savepoint_id"][-2:] for s in page["savepoints"]] == ["04", "03", "02", "01", "00"]
    assert len(page_of(records, 0, None, newest_first=False)["savepoints"]) == 25
    made = commands("orders", "s3://b/sp/orders/savepoint-abc123-00000000000a", "s3://b/cp/it's here", "savepoint-abc123-00000000000a")
    assert made["restore"] == ("airflow-savepoints restore s3://b/sp/orders/savepoint-abc123-00000000000a "
                               "--to 's3://b/cp/it'\"'\"'s here-restore-00000000000a'")  # quoted for a shell
    assert made["start"] == "airflow-savepoints job start orders --from s3://b/sp/orders/savepoint-abc123-00000000000a"
    assert periodic_interval_s("1h") == 3600 and periodic_interval_s(None) > 0


# ---- one deployment for the module ----------------------------------------------------------------

class Console:
    def __init__(self, cluster, base: Path, root: Path, taken: dict[str, list[str]], viewer_password: str):
        self.cluster, self.base, self.root, self.taken = cluster, base, root, taken
        self.viewer_password = viewer_password

    def get(self, path: str, token: str | None = None, *, auth: bool = True, **kwargs: Any):
        """GET as the admin (bearer token), as the holder of ``token``, or with ``auth=False`` as nobody."""
        headers = {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {token}"} if token else {})}
        return self.cluster.request("GET", path, auth=auth and token is None, headers=headers, **kwargs)

    def token_of(self, username: str, password: str) -> str:
        response = self.cluster.request("POST", "/auth/token", auth=False,
                                        json={"username": username, "password": password})
        assert response.status_code == 201, response.text
        return response.json()["access_token"]

    @contextmanager
    def connection(self, **fields: Any):
        """``savepoints_default`` replaced by another definition for the block."""
        self.cluster.api("DELETE", "/api/v2/connections/savepoints_default", expect=(204,))
        try:
            self.cluster.api("POST", "/api/v2/connections", expect=(201,),
                             json={"connection_id": "savepoints_default", "conn_type": "savepoints", **fields})
            yield
        finally:
            self.cluster.api("DELETE", "/api/v2/connections/savepoints_default", expect=(204, 404))
            create_connection(self.cluster, self.root)


def create_connection(cluster, root: Path) -> None:
    cluster.api("POST", "/api/v2/connections", expect=(201,), json={
        "connection_id": "savepoints_default", "conn_type": "savepoints", "host": str(root)})


@contextmanager
def silent_endpoint():
    """A TCP endpoint on 127.0.0.1 that accepts connections and never answers (a hung store)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        server.close()


@pytest.fixture(scope="module")
def console(stopped_checkpoint, tmp_path_factory):
    base = tmp_path_factory.mktemp("console")
    checkpoint, earlier = base / "checkpoint", base / "checkpoint-earlier"
    shutil.copytree(stopped_checkpoint, checkpoint)
    shutil.copytree(stopped_checkpoint, earlier)
    (earlier / "commits" / "5").unlink()
    root = base / "savepoints"
    taken = populate(root, checkpoint, earlier)
    dags = base / "dags"
    dags.mkdir()
    for name in EXAMPLE_DAGS:
        shutil.copy2(ROOT / "dags" / name, dags / name)
    env = {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"e2e-admin:admin,{VIEWER}:viewer",
           "AIRFLOW__SAVEPOINTS__JOBS_FILE": str(jobs_file(base / "console-jobs.yaml", root)),
           "AIRFLOW__SAVEPOINTS__API_TIMEOUT": "3", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"}
    with airflow_cluster(base / "airflow-home", dags, env, components=("api-server",)) as cluster:
        airflow = str(Path(sys.executable).parent / "airflow")
        serialized = subprocess.run([airflow, "dags", "reserialize"], env=cluster.env, capture_output=True, text=True,
                                    timeout=300, cwd=cluster.home)
        assert serialized.returncode == 0, serialized.stderr[-3000:]
        create_connection(cluster, root)
        passwords = json.loads((cluster.home / "simple_auth_manager_passwords.json").read_text())
        yield Console(cluster, base, root, taken, passwords[VIEWER])


# ---- the API ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_overview_summarises_every_job_folder(console):
    c = console
    answer = c.get(f"{API}/overview")
    assert answer.status_code == 200, answer.text
    overview = answer.json()
    assert overview["root"] == str(c.root) and overview["periodic_interval_s"] == 900
    jobs = {job["job"]: job for job in overview["jobs"]}
    assert sorted(jobs) == JOBS  # README.md is no job; ledger is declared on this root, elsewhere on another
    assert c.get(f"{API}/jobs").json()["jobs"] == [job for job in JOBS if job != "ledger"]  # the folders
    assert (jobs["ledger"]["state"], jobs["ledger"]["savepoints"], jobs["ledger"]["newest"]) == ("not_started", 0, None)

    orders = jobs["orders"]
    assert (orders["state"], orders["last_batch"], orders["stale"]) == ("running", 5, False)
    assert orders["newest"]["savepoint_id"] == c.taken["orders"][-1] and orders["newest"]["type"] == "manual"
    assert orders["by_type"] == {"periodic": 12, "manual": 1}  # 11 completed periodic + the one in progress
    assert orders["by_state"] == {"completed": 12, "in_progress": 1} and orders["savepoints"] == 13
    manifests = [json.loads((c.root / "orders" / sid / "_metadata").read_text()) for sid in c.taken["orders"]]
    assert orders["total_bytes"] == sum(m["total_bytes"] for m in manifests)
    assert 0 <= orders["newest_age_s"] < 3600

    assert (jobs["payments"]["state"], jobs["payments"]["stale"]) == ("stopped", False)
    assert jobs["inventory"]["state"] == "running" and jobs["inventory"]["stale"] is True
    assert jobs["inventory"]["newest_age_s"] >= 7200 - 5
    assert jobs["fraud"]["state"] == "failed" and "Kafka topic 'fraud' was deleted" in jobs["fraud"]["lifecycle"]["error"]
    assert jobs["fraud"]["lifecycle"]["reason"] == FRAUD_REASON  # the ERROR line, not the INFO lines around it
    assert jobs["fraud"]["newest"] is None and jobs["fraud"]["conflicts"] == 1  # a savepoint in conflict is never "newest"
    assert jobs["clicks"]["state"] is None and jobs["clicks"]["lifecycle"] is None
    assert jobs["empty-job"]["savepoints"] == 0 and jobs["empty-job"]["newest"] is None


@pytest.mark.slow
def test_savepoints_are_paged_newest_first(console):
    c = console
    ids = c.taken["orders"]
    first = c.get(f"{API}/jobs/orders/savepoints", params={"order": "newest", "limit": 5}).json()
    assert (first["total"], first["offset"], first["limit"]) == (13, 0, 5)
    assert first["savepoints"][0]["state"] == "in_progress"  # begun last
    assert [s["savepoint_id"] for s in first["savepoints"][1:]] == ids[::-1][:4]
    last = c.get(f"{API}/jobs/orders/savepoints", params={"order": "newest", "offset": 10, "limit": 5}).json()
    assert [s["savepoint_id"] for s in last["savepoints"]] == ids[:3][::-1]
    everything = c.get(f"{API}/jobs/orders/savepoints").json()  # no paging asked: all of them, oldest first
    assert [s["savepoint_id"] for s in everything["savepoints"] if s["state"] == "completed"] == ids
    for bad in ({"limit": 0}, {"offset": -1}, {"order": "random"}, {"limit": 5000}):
        answer = c.get(f"{API}/jobs/orders/savepoints", params=bad)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_input", (bad, answer.text)


@pytest.mark.slow
def test_history_keeps_every_attempt_and_a_declared_job_is_no_error(console):
    c = console
    orders = c.get(f"{API}/jobs/orders/history").json()
    assert [(e["savepoint_id"], e["outcome"]) for e in orders["history"]] == [(s, "completed") for s in c.taken["orders"][::-1]]
    manifests = {sid: json.loads((c.root / "orders" / sid / "_metadata").read_text()) for sid in c.taken["orders"]}
    for entry in orders["history"]:
        manifest = manifests[entry["savepoint_id"]]
        assert (entry["bytes"], entry["files"], entry["batch_id"]) == (manifest["total_bytes"], len(manifest["files"]),
                                                                        manifest["batch_id"])
        assert 0 <= entry["duration_s"] < 120
    assert orders["operators"]["savepoint_id"] == c.taken["orders"][-1] and orders["operators"]["state_stores"][0]["operator"] == "0"

    payments = c.get(f"{API}/jobs/payments/history").json()["history"]  # newest first
    assert [e["outcome"] for e in payments] == ["failed", "disposed", "completed", "completed"]
    assert "gone-checkpoint" in payments[0]["error"] and payments[0]["type"] == "manual" and payments[0]["savepoint_id"] is None
    assert (payments[1]["disposed_by"], payments[1]["reason"], payments[1]["type"]) == ("retention", RETIRED, "periodic")

    for route in ("savepoints", "history"):  # declared in jobs.yaml, no folder yet: an empty answer that says so
        answer = c.get(f"{API}/jobs/ledger/{route}")
        assert answer.status_code == 200 and answer.json()["declared"] is True, answer.text
        assert "no savepoint" in answer.json()["message"] and answer.json()["total"] == 0
    assert c.get(f"{API}/jobs/nobody/history").json()["error"]["code"] == "job_not_found"


@pytest.mark.slow
def test_the_page_loads_its_script_from_the_plugin(console):
    c = console
    page = c.get("/savepoints/ui", headers={"Accept": "text/html"}).text
    served = c.get("/savepoints/static/console.js")
    source = (ROOT / "airflow_savepoints" / "plugins" / "static" / "console.js").read_bytes()
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript")
    assert served.content == source
    assert f'<script src="/savepoints/static/console.js?v={hashlib.sha256(source).hexdigest()[:12]}">' in page
    assert c.get("/savepoints/static/console.js", auth=False).status_code == 401  # as every route of the plugin


@pytest.mark.slow
def test_savepoint_detail_has_what_a_restore_needs(console):
    c = console
    newest, older = c.taken["orders"][-1], c.taken["orders"][0]
    detail = c.get(f"{API}/jobs/orders/savepoints/{older}").json()
    manifest = json.loads((c.root / "orders" / older / "_metadata").read_text())
    assert detail["savepoint"]["batch_id"] == manifest["batch_id"] == 4
    assert detail["manifest"]["source_offsets"] == manifest["source_offsets"]
    assert detail["manifest"]["checkpoint"] == manifest["checkpoint"]
    extra = detail["detail"]
    assert extra["restore_pick"] == {"savepoint_id": newest, "pointer": str(c.root / "orders" / newest), "is_this": False}
    stores = extra["state_stores"]
    state_files = [f for f in manifest["files"] if f["path"].startswith("state/")]
    assert sum(s["files"] for s in stores) == len(state_files) and stores[0]["operator"] == "0"
    assert stores[0]["partitions"] == len({f["path"].split("/")[2] for f in state_files if f["path"].split("/")[2].isdigit()})
    assert stores[0]["provider"] == manifest["state_store"]["provider"]
    assert extra["checksums"]["verified"] is None and extra["checksums"]["files"] == len(manifest["files"])
    pointer = str(c.root / "orders" / older)
    assert extra["commands"]["restore"].startswith(f"airflow-savepoints restore {pointer} --to ")
    assert extra["commands"]["start"] == f"airflow-savepoints job start orders --from {pointer}"
    # what a restore would tell of orders' file sink (jobs file), checked now as the restore checks it
    sink = orders_sink(c.root)
    assert extra["restore_sink"]["refused"] is None and extra["restore_sink"]["on_rerun"] == "skipped", extra["restore_sink"]
    assert extra["restore_sink"]["recorded_batch"] == 4 and f"file sink at {sink}" in extra["restore_sink"]["detail"]
    (sink / "_spark_metadata" / "7").write_text("v1\n")  # the sink ran on: a restore of batch 4 would drop 5..7
    try:
        ahead = c.get(f"{API}/jobs/orders/savepoints/{older}").json()["detail"]["restore_sink"]
    finally:
        (sink / "_spark_metadata" / "7").unlink()
    assert ahead["refused"]["code"] == "sink_ahead" and "already holds batch 7" in ahead["refused"]["message"], ahead
    assert c.get(f"{API}/jobs/payments/savepoints/{c.taken['payments'][0]}").json()["detail"]["restore_sink"]["kind"] \
        == "unknown"  # not in the jobs file: not checked, and said

    verified = c.get(f"{API}/jobs/orders/savepoints/{newest}", params={"verify": "true"}).json()["detail"]
    assert verified["checksums"]["verified"] is True and verified["restore_pick"]["is_this"] is True

    in_flight = c.get(f"{API}/jobs/orders/savepoints/savepoint-0a1b2c-00000000abcd").json()
    assert in_flight["savepoint"]["state"] == "in_progress" and in_flight["manifest"] is None
    conflicted = c.get(f"{API}/jobs/fraud/savepoints/{c.taken['fraud'][0]}").json()
    assert conflicted["savepoint"]["conflict"] and conflicted["detail"]["restore_pick"] is None


@pytest.mark.slow
def test_a_jobs_metrics_are_downsampled_and_its_decisions_newest_first(console):
    """The series orders' run recorded (900 triggers: the file keeps the last 720) in at most ``points`` points,
    each the longest batch, the mean rates and the largest backlog of the consecutive batches it merges; the
    decisions `job autoscale` recorded, newest first; for a viewer too."""
    from airflow_savepoints.jobs.description.metrics import DEFAULT_KEEP, read_decisions, read_series

    c = console
    series, recorded = read_series(Store(str(c.root / "orders"))), read_decisions(Store(str(c.root / "orders")))
    viewer = c.token_of(VIEWER, c.viewer_password)
    for asked, merged in ((None, 6), (50, 15), (DEFAULT_KEEP, 1), (7, 103)):
        answer = c.get(f"{API}/jobs/orders/metrics", viewer, params={"points": asked} if asked else {})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        points = body["points"]
        assert (body["total_points"], body["merged"], body["warnings"]) == (DEFAULT_KEEP, merged, []), asked
        assert len(points) <= (asked or 120) and sum(p["batches"] for p in points) == DEFAULT_KEEP == len(series)
        assert [p["batch_id"] for p in points][-1] == SERIES_WRITTEN - 1 and points[0]["batches"] == merged
        runs = [series[i:i + merged] for i in range(0, len(series), merged)]
        assert [p["duration_ms"] for p in points] == [max(q.duration_ms for q in run) for run in runs]
        assert [p["backlog"] for p in points] == [max(q.backlog for q in run) for run in runs]
        assert [p["input_rate"] for p in points] == pytest.approx([sum(q.input_rate for q in run) / len(run) for run in runs])
        assert points[-1]["cores"] == 4 and points[-1]["partitions"] == 4 and points[-1]["trigger_interval_ms"] == 5000
    assert {p["backlog_files"] for p in points} == {None}  # orders reads Kafka
    files = c.get(f"{API}/jobs/payments/metrics", viewer).json()["points"]  # a file source: its unread files
    assert [(p["backlog"], p["backlog_files"]) for p in files] == [(None, n) for n in (8, 6, 4, 2, 0)], files
    decisions = c.get(f"{API}/jobs/orders/metrics", params={"decisions": 4}).json()
    assert decisions["total_decisions"] == len(DECISIONS) == len(recorded)
    assert [(d["action"], d["reason"], d["outcome"]) for d in decisions["decisions"]] == \
        [(a, r, o) for a, r, o, _, _ in DECISIONS[::-1][:4]]
    assert decisions["decisions"][0] == {key: recorded[-1][key] for key in decisions["decisions"][0]}
    for bad in ({"points": 1}, {"points": DEFAULT_KEEP + 1}, {"decisions": 0}, {"decisions": 201}):
        answer = c.get(f"{API}/jobs/orders/metrics", params=bad)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_input", (bad, answer.text)
    none = c.get(f"{API}/jobs/clicks/metrics").json()  # a job whose runs recorded nothing
    assert (none["total_points"], none["points"], none["decisions"], none["warnings"]) == (0, [], [], [])
    declared = c.get(f"{API}/jobs/ledger/metrics").json()
    assert declared["declared"] is True and declared["points"] == [] and "no savepoint" in declared["message"]
    assert c.get(f"{API}/jobs/nobody/metrics").json()["error"]["code"] == "job_not_found"


@pytest.mark.slow
def test_a_forged_huge_or_linked_metrics_file_is_not_read(console):
    """A ``_metrics.json`` over the run files' 1 MiB cap, or a link (here to orders' real series, and an
    ``_autoscale.json`` linked to orders' decisions): the API server reads none of them, answers an empty series
    and history, and says why; the job's other routes still answer."""
    c = console
    folder = c.root / "clicks"
    huge = {"version": 1, "points": [{"batch_id": i, "time": 1.0e9 + i, "duration_ms": 1.0} for i in range(40000)]}
    try:
        (folder / "_metrics.json").write_text(json.dumps(huge))
        assert (folder / "_metrics.json").stat().st_size > 1024 * 1024
        answer = c.get(f"{API}/jobs/clicks/metrics")
        assert answer.status_code == 200, answer.text[:300]
        body = answer.json()
        assert (body["total_points"], body["points"]) == (0, []), body["total_points"]
        assert any("_metrics.json is over 1048576 bytes" in w for w in body["warnings"]), body["warnings"]
        (folder / "_metrics.json").unlink()
        (folder / "_metrics.json").symlink_to(c.root / "orders" / "_metrics.json")
        (folder / "_autoscale.json").symlink_to(c.root / "orders" / "_autoscale.json")
        answer = c.get(f"{API}/jobs/clicks/metrics")
        assert answer.status_code == 200, answer.text[:300]
        body = answer.json()
        assert (body["total_points"], body["total_decisions"]) == (0, 0), str(body)[:300]
        assert sum("is a symbolic link: not followed" in w for w in body["warnings"]) == 2, body["warnings"]
        assert c.get(f"{API}/jobs/clicks/history").status_code == 200
    finally:
        for name in ("_metrics.json", "_autoscale.json"):
            (folder / name).unlink(missing_ok=True)


@pytest.mark.slow
def test_run_files_naming_a_master_make_the_api_server_send_no_request(console):
    """Issue 40, over the real API server: a ``_run.json`` (a declared job's and another's) and a heartbeat naming a
    standalone master and web UI at a local listener: the overview, a job's history and metrics and a savepoint's
    detail (its sink check reads the run record) send it nothing (the console fetched a run file's web UI on every overview)."""
    from tests.test_run_files import Listener

    c, listener = console, Listener()
    named = {"master": f"spark://127.0.0.1:{listener.url.rsplit(':', 1)[1]}", "master_ui": listener.url,
             "application_id": "app-20260101000000-0001"}
    forged = [c.root / job / "_run.json" for job in ("orders", "inventory")]
    try:
        for path in forged:
            path.write_text(json.dumps({"job": path.parent.name, "checkpoint": f"/data/checkpoints/{path.parent.name}",
                                        "started_at": datetime.now(UTC).isoformat(), "run_id": "run-forged",
                                        "host": socket.gethostname(), **named}))
        answers = [c.get(f"{API}/overview"), c.get(f"{API}/jobs/orders/history"), c.get(f"{API}/jobs/inventory/history"),
                   c.get(f"{API}/jobs/orders/savepoints/{c.taken['orders'][0]}"), c.get(f"{API}/jobs/orders/metrics")]
        assert [a.status_code for a in answers] == [200] * 5, [a.text[:300] for a in answers]
        assert {job["job"] for job in answers[0].json()["jobs"]} >= {"orders", "inventory"}
        assert listener.requests == [], listener.requests
    finally:
        for path in forged:
            path.unlink(missing_ok=True)
        listener.close()


@pytest.mark.slow
def test_errors_say_what_is_wrong(console):
    c = console
    with c.connection(host=str(c.base / "no-such-root")):
        answer = c.get(f"{API}/overview")
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert error["code"] == "savepoint_root_not_found" and str(c.base / "no-such-root") in error["message"]
    with silent_endpoint() as endpoint, c.connection(host="s3://console-bucket/savepoints",
                                                     extra=json.dumps({"endpoint_url": endpoint, "key": "k", "secret": "s"})):
        started = time.monotonic()
        answer = c.get(f"{API}/overview")
        waited = time.monotonic() - started
        assert answer.status_code == 504, answer.text
        assert answer.json()["error"]["code"] == "store_timeout" and "within 3 s" in answer.json()["error"]["message"]
        assert waited < 20, waited
    page = c.get("/savepoints/ui", auth=False, headers={"Accept": "text/html"}, follow_redirects=False)
    assert page.status_code == 303 and "/auth/login?next=" in page.headers["location"], page.headers
    assert c.get("/savepoints/ui", auth=False).status_code == 401  # a script still gets JSON


@pytest.mark.slow
def test_actions_follow_airflow_permissions(console):
    c = console
    admin = {a["action"]: a for a in c.get(f"{API}/actions").json()["actions"]}
    assert {name: (a["dag_id"], a["deployed"], a["allowed"]) for name, a in admin.items()} == {
        "savepoint": ("periodic_savepoints", True, True), "stop": ("stop_job_with_savepoint", True, True),
        "restore": ("restore_from_savepoint", True, True)}
    assert admin["stop"]["stops_job"] is True and admin["restore"]["stops_job"] is False
    assert [o["param"] for o in admin["restore"]["options"]] == ["state_partitions", "allow_repeats"]
    assert admin["stop"]["options"] == []
    viewer = c.token_of(VIEWER, c.viewer_password)
    refused = {a["action"]: a["allowed"] for a in c.get(f"{API}/actions", token=viewer).json()["actions"]}
    assert refused == {"savepoint": False, "stop": False, "restore": False}
    assert c.get(f"{API}/overview", token=viewer).status_code == 200  # a viewer still sees everything


# ---- the page in Chromium --------------------------------------------------------------------------

PAGE = """
const frame = document.querySelector('iframe');
const doc = frame ? frame.contentDocument : document;
return doc && doc.body && doc.body.dataset.loaded === 'true' ? true : null;
"""


def in_page(script: str) -> str:
    """Run ``script`` with ``doc`` = the console's document (in the UI's iframe or opened alone)."""
    return ("const frame = document.querySelector('iframe');\n"
            "const doc = frame ? frame.contentDocument : document;\n" + script)


JOB_ROWS = in_page("""return Array.from(doc.querySelectorAll('tr.job')).map(row => ({job: row.dataset.job,
  cells: Array.from(row.cells).map(cell => cell.textContent.trim()), title: row.cells[2] && row.cells[2].title}));""")
SAVEPOINT_ROWS = in_page("""return Array.from(doc.querySelectorAll('tr.savepoint')).map(
  row => [row.dataset.job, ...Array.from(row.cells).map(cell => cell.textContent)]);""")
FACTS = in_page("""const detail = doc.getElementById('detail');
if (detail.hidden || detail.dataset.loaded !== 'true') return null;
const facts = Object.fromEntries(Array.from(detail.querySelectorAll('dd[data-fact]')).map(dd => [dd.dataset.fact, dd.textContent]));
const values = Object.fromEntries(Array.from(detail.querySelectorAll('code[data-value]')).map(c => [c.dataset.value, c.textContent]));
return {facts, values, title: detail.querySelector('h2').textContent};""")
HISTORY = in_page("""return Object.fromEntries(Array.from(doc.querySelectorAll('.history-view')).map(view => [view.dataset.job, {
  rows: Array.from(view.querySelectorAll('tr.attempt')).map(row => [row.dataset.outcome,
    ...Array.from(row.cells).map(c => c.textContent)]),
  charts: Array.from(view.querySelectorAll('figure.chart')).map(f => [f.dataset.chart, f.querySelectorAll('svg circle').length,
    f.textContent]),
  operators: Array.from(view.querySelectorAll('table.operators tbody tr')).map(
    r => Array.from(r.cells).map(c => c.textContent))}]));""")
OPERATOR_HEADING = in_page("""const id = doc.querySelector('.history-view[data-job=orders] h3 .id');
return id ? {text: id.textContent, shown: id.innerText, transform: getComputedStyle(id).textTransform} : null;""")
CHART_AXES = in_page("""return Array.from(doc.querySelectorAll('.history-view[data-job=orders] figure.chart')).map(f => ({
  chart: f.dataset.chart, x: Array.from(f.querySelectorAll('.axis text[data-axis=x]')).map(t => t.textContent),
  y: Array.from(f.querySelectorAll('.axis text[data-axis=y]')).map(t => t.textContent),
  lines: f.querySelectorAll('.axis line').length}));""")
LOAD_OF = """const view = doc.querySelector('.metrics-view[data-job=JOB]');
const texts = (f, axis) => Array.from(f.querySelectorAll(`.axis text[data-axis=${axis}]`)).map(t => t.textContent);
const lines = f => Object.fromEntries(Array.from(f.querySelectorAll('g.line')).map(
  g => [g.dataset.line, g.querySelector('path').getAttribute('d').split(/[ML]/).length - 1]));
return view && {heading: view.querySelector('h3').textContent, charts: Array.from(view.querySelectorAll('figure.chart')).map(
  f => ({chart: f.dataset.chart, x: texts(f, 'x'), y: texts(f, 'y'), axes: f.querySelectorAll('.axis line').length, lines: lines(f)})),
  decisions: Array.from(view.querySelectorAll('tr.decision')).map(
    r => [r.dataset.outcome, ...Array.from(r.cells).map(c => c.textContent)])};"""
LOAD = in_page(LOAD_OF.replace("JOB", "orders"))
DETAIL_PARTS = in_page("""const detail = doc.getElementById('detail');
const provider = detail.querySelector('table.stores tbody td.wrap');
const offsets = Array.from(detail.querySelectorAll('table.offsets tbody tr')).map(r => [r.dataset.source, r.cells[1].innerText]);
return {provider: provider && [provider.innerText, provider.title, provider.scrollWidth <= provider.clientWidth],
  offsets, pre: detail.querySelectorAll('pre').length};""")
STICKY_HEADER = in_page("""const detail = doc.getElementById('detail');
detail.scrollTop = detail.scrollHeight;
const head = detail.querySelector(':scope > header').getBoundingClientRect(), box = detail.getBoundingClientRect();
const close = Array.from(detail.querySelectorAll('header button')).find(b => b.textContent === 'Close').getBoundingClientRect();
return {scrolled: detail.scrollTop, headerTop: head.top - box.top,
  closeVisible: close.top >= box.top && close.bottom <= box.bottom};""")
PROBLEM = in_page("""const banner = doc.querySelector('#problem .banner');
return doc.body.dataset.loaded === 'true' && banner ? {code: banner.dataset.code, text: banner.textContent,
  color: getComputedStyle(banner.querySelector('.title')).color} : null;""")
BADGE_COLOURS = in_page("""const colours = Object.fromEntries(Array.from(doc.querySelectorAll('tr.job')).map(
  row => [row.dataset.job, row.cells[2].querySelector('.badge') && getComputedStyle(row.cells[2].querySelector('.badge')).color]));
return {...colours, muted: getComputedStyle(doc.querySelector('#jobs th')).color};""")
STYLE = in_page("""const style = getComputedStyle(doc.body);
return {background: style.backgroundColor, color: style.color, font: style.fontFamily, theme: doc.body.dataset.theme,
  hostFont: getComputedStyle(document.body).fontFamily};""")


def click_in_page(browser: WebDriver, css: str) -> None:
    browser.script(in_page(f"doc.querySelector({json.dumps(css)}).click(); return true;"))


@contextmanager
def inside_console(browser: WebDriver):
    """WebDriver commands (real clicks: a user's gesture, which the clipboard needs) go to the console's iframe."""
    framed = browser.script("return document.querySelector('iframe') !== null;")
    if framed:
        browser.call("POST", f"{browser.session}/frame", {"id": {WebDriver.ELEMENT: browser.find("iframe")}})
    try:
        yield
    finally:
        if framed:
            browser.call("POST", f"{browser.session}/frame/parent", {})


def wait_loaded(browser: WebDriver, what: str, timeout: float = 60) -> None:
    browser._wait(lambda: browser.script(PAGE), timeout, what)


def reload_page(browser: WebDriver) -> None:
    browser.script(in_page("doc.body.dataset.loaded = 'false'; doc.getElementById('refresh').click(); return true;"))
    wait_loaded(browser, "the console did not reload")


def luminance(css_color: str) -> float:
    """0 (black) to 255 (white), from ``rgb(...)`` or ``oklch(L ...)`` (Airflow's colours)."""
    numbers = [x for x in css_color[css_color.index("(") + 1:css_color.index(")")].replace(",", " ").split()]
    if css_color.startswith("oklch"):
        return float(numbers[0].rstrip("%")) / (100 if numbers[0].endswith("%") else 1) * 255
    return sum(float(x) for x in numbers[:3]) / 3


def login(browser: WebDriver, c: Console, username: str, password: str, path: str = "/plugin/savepoints") -> None:
    browser.go(f"{c.cluster.base_url}{path}")
    browser.type("input[name=username]", username)
    browser.type("input[name=password]", password)
    browser.click("button[type=submit]")


@contextmanager
def chromium(tmp_path: Path):
    ARTIFACTS.mkdir(exist_ok=True)
    browser = WebDriver(tmp_path)
    try:
        yield browser
    except BaseException:
        print(f"chromedriver log:\n{tail(browser.log, 40)}")
        raise
    finally:
        browser.close()


def dag_runs(c: Console, dag_id: str) -> list[dict]:
    return c.cluster.get(f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]


def confirm_dialog(browser: WebDriver, accept: bool) -> str:
    text = browser._wait(lambda: browser.script(in_page(
        "const d = doc.getElementById('confirm'); return d.open ? d.textContent : null;")), 10, "no confirmation dialog")
    click_in_page(browser, "#confirm-ok" if accept else "#confirm button[value=cancel]")
    return text


def notice(browser: WebDriver) -> dict:
    return browser._wait(lambda: browser.script(in_page(
        "const b = doc.querySelector('#notice .banner'); return b ? {kind: b.className, text: b.textContent,"
        " run: (b.querySelector('[data-run-id]') || {dataset: {}}).dataset.runId} : null;")), 30, "no notice after the action")


@pytest.mark.slow
@browser_needed
def test_console_in_chromium(console, tmp_path):
    from tests.test_plugin import ui_route

    c = console
    with chromium(tmp_path) as browser:
        # a logged-out visit of the page (the operators' extra link) goes to Airflow's login, then back
        browser.go(f"{c.cluster.base_url}/savepoints/ui?job=orders")
        browser.find("input[name=username]")
        assert "/auth/login" in browser.url(), browser.url()
        browser.type("input[name=username]", c.cluster.username)
        browser.type("input[name=password]", c.cluster.password)
        browser.click("button[type=submit]")
        wait_loaded(browser, "the console did not open after the login")
        assert browser.url() == f"{c.cluster.base_url}/savepoints/ui?job=orders"
        assert [row["job"] for row in browser.script(JOB_ROWS)] == ["orders"]

        # Browse > Savepoints: the jobs view in the UI's iframe
        browser.go(f"{c.cluster.base_url}/plugin/savepoints")
        wait_loaded(browser, "the console did not load in the UI's iframe")
        assert browser.url() == f"{c.cluster.base_url}{ui_route()}"
        jobs = {row["job"]: row for row in browser.script(JOB_ROWS)}
        assert list(jobs) == JOBS and jobs["ledger"]["cells"][2] == "not started"
        assert jobs["orders"]["cells"][2:4] == ["running", "5"] and "stale" in jobs["inventory"]["cells"][4]
        assert jobs["payments"]["cells"][2] == "stopped" and jobs["fraud"]["cells"][2] == "failed" + FRAUD_REASON
        assert "Kafka topic 'fraud' was deleted" in jobs["fraud"]["title"]
        assert "no savepoints" in jobs["empty-job"]["cells"][5] and "conflict 1" in jobs["fraud"]["cells"][5]
        assert "in progress 1" in jobs["orders"]["cells"][5] and jobs["clicks"]["cells"][2] == "\u2014"
        assert browser.script(SAVEPOINT_ROWS) == []  # six jobs: collapsed at first
        colours = browser.script(BADGE_COLOURS)  # a stopped job is at rest: grey as a heading, not green as a running one
        assert colours["payments"] == colours["muted"] != colours["orders"], colours

        # collapse and paging: the newest ten of orders, then the older ones
        click_in_page(browser, "tr.job[data-job=orders]")
        rows = browser._wait(lambda: browser.script(SAVEPOINT_ROWS), 30, "orders did not expand")
        ids = c.taken["orders"]
        assert [r[1] for r in rows[1:]] == ids[::-1][:9] and rows[0][3] == "in progress"
        assert rows[1][2:6] == ["manual", "completed", "<script>alert('x')</script> before upgrade", "5"]
        assert all(r[7].endswith("ago") and r[6].endswith("B") for r in rows[1:]), rows
        browser.screenshot(ARTIFACTS / "console-jobs.png")

        # the history of orders: every attempt, the size and duration trends, the state per operator
        views = browser._wait(lambda: browser.script(HISTORY) or None, 30, "no history under orders")
        assert [row[0] for row in views["orders"]["rows"]] == ["completed"] * 12
        assert [row[2] for row in views["orders"]["rows"]] == ids[::-1]
        assert all(row[5].endswith(" s") and row[6].endswith("B") for row in views["orders"]["rows"]), views["orders"]["rows"]
        assert [(name, points) for name, points, _ in views["orders"]["charts"]] == [("Size", 12), ("Duration", 12)]
        assert views["orders"]["operators"][0][0] == "0" and views["orders"]["operators"][0][3].endswith("B")
        heading = browser.script(OPERATOR_HEADING)  # the newest savepoint's id as it is written, not in capitals
        assert heading == {"text": ids[-1], "shown": ids[-1], "transform": "none"}, heading
        axes = browser.script(CHART_AXES)  # each trend has its axes: the highest value and 0, the first and last time
        assert [a["chart"] for a in axes] == ["Size", "Duration"] and all(a["lines"] == 2 for a in axes), axes
        assert axes[0]["y"][0].endswith("B") and axes[0]["y"][1] == "0 B" and axes[1]["y"][1] == "0.00 s", axes
        assert all(len(a["x"]) == 2 and re.fullmatch(r"\d\d-\d\d \d\d:\d\d", a["x"][0]) for a in axes), axes
        # orders' load: its recorded series in three charts with axes and units, and its autoscale decisions
        shown = c.get(f"{API}/jobs/orders/metrics").json()  # what the page asked for: 120 points of 6 batches each
        load = browser._wait(lambda: browser.script(LOAD), 30, "no load view under orders")
        assert load["heading"] == "Load (the last 720 batches, 6 per point)", load["heading"]
        assert [chart["chart"] for chart in load["charts"]] == ["Batch duration", "Input and processed rate", "Backlog"]
        known = {name: sum(p[key] is not None for p in shown["points"]) for name, key in (
            ("batch duration", "duration_ms"), ("trigger interval", "trigger_interval_ms"), ("input", "input_rate"),
            ("processed", "processed_rate"), ("backlog", "backlog"))}
        assert set(known.values()) == {120}, known
        assert [chart["lines"] for chart in load["charts"]] == [
            {name: known[name] for name in names} for names in (("batch duration", "trigger interval"),
                                                                ("input", "processed"), ("backlog",))]
        longest = max(p["duration_ms"] for p in shown["points"]) / 1000  # each axis from 0 to the highest, with its unit
        rates, backlog = load["charts"][1]["y"], load["charts"][2]["y"]
        assert load["charts"][0]["y"] == [f"{longest:.2f} s", "0.00 s"] and backlog == ["90K records", "0 records"], load
        assert rates[0].endswith(" rows/s") and float(rates[0].split()[0]) > 400 and rates[1] == "0 rows/s", rates
        assert all(len(chart["x"]) == 2 and re.fullmatch(r"\d\d-\d\d \d\d:\d\d", chart["x"][1])
                   and chart["axes"] == 2 for chart in load["charts"]), load["charts"]
        assert [row[0] for row in load["decisions"]] == [outcome for _, _, outcome, _, _ in DECISIONS[::-1]]
        assert load["decisions"][1][1:] == [load["decisions"][1][1], "scale up", "scale_up", "acted", "2 \u2192 4", "4",
                                            "decision 4: scale_up"], load["decisions"][1]
        assert load["decisions"][3][7] == ("decision 2: scale_upautoscale_rolled_back: the scale_up of job 'orders' "
                                           "failed its check"), load["decisions"][3]  # why it was rolled back
        browser.script(in_page("doc.querySelector('.metrics-view[data-job=orders]').scrollIntoView(); return true;"))
        browser.screenshot(ARTIFACTS / "console-metrics.png")
        # payments: a failed attempt's reason, a disposed savepoint's entry; ledger: declared, no savepoint yet
        click_in_page(browser, "tr.job[data-job=payments]")
        click_in_page(browser, "tr.job[data-job=ledger]")
        views = browser._wait(lambda: (lambda v: v if "payments" in v else None)(browser.script(HISTORY)), 30,
                              "no history under payments")
        failed, disposed = views["payments"]["rows"][:2]
        assert failed[0] == "failed" and failed[2] == "\u2014" and "gone-checkpoint" in failed[8], failed
        assert disposed[0] == "disposed" and disposed[8] == f"by retention: {RETIRED}", disposed
        declared = browser._wait(lambda: browser.script(in_page(
            "const b = doc.querySelector('tr.savepoints-row[data-job=ledger] .banner');"
            " return b ? [b.dataset.code, b.textContent] : null;")), 30, "ledger did not expand")
        assert declared[0] == "declared" and "has no savepoint" in declared[1] and "start it" in declared[1], declared
        browser.script(in_page("doc.querySelector('.history-view[data-job=payments]').scrollIntoView(); return true;"))
        browser.screenshot(ARTIFACTS / "console-history.png")
        click_in_page(browser, "tr.job[data-job=payments]")
        click_in_page(browser, "tr.job[data-job=ledger]")
        click_in_page(browser, "tr.savepoints-row[data-job=orders] .pager button:last-child")
        older = browser._wait(lambda: [r for r in browser.script(SAVEPOINT_ROWS) if r[1] == ids[0]], 30, "no older page")
        assert older and len(browser.script(SAVEPOINT_ROWS)) == 3

        # the detail view of one savepoint
        click_in_page(browser, f"tr.savepoint[data-savepoint-id={ids[0]}]")
        detail = browser._wait(lambda: browser.script(FACTS), 30, "the detail view did not open")
        pointer = str(c.root / "orders" / ids[0])
        assert detail["title"] == ids[0] and detail["values"]["pointer"] == pointer
        assert detail["values"]["restore"].startswith(f"airflow-savepoints restore {pointer} --to ")
        assert detail["facts"]["Batch"] == "4" and "not verified" in detail["facts"]["Checksums"]
        assert ids[-1] in detail["facts"]["A restore would pick"] and detail["facts"]["Spark version"]
        assert browser._wait(lambda: "no asset events yet" in browser.script(FACTS)["facts"]["In Airflow"], 30,
                             "the asset link was not resolved")  # core-taken savepoints: Airflow saw no asset event
        with inside_console(browser):
            browser.click("#detail button[data-copy=restore]")
        assert browser._wait(lambda: browser.script(in_page(
            "return doc.querySelector('#detail button[data-copy=restore]').textContent === 'Copied';")), 5, "no copy")
        click_in_page(browser, "#detail .facts button.link")  # verify now
        verified = browser._wait(lambda: (browser.script(FACTS) or {}).get("facts", {}).get("Checksums", "").startswith("verified")
                                 or None, 30, "verification did not show")
        assert verified
        browser.screenshot(ARTIFACTS / "console-detail.png")
        parts = browser.script(DETAIL_PARTS)  # the provider's name whole, the offsets as positions, not raw JSON
        assert parts["provider"][0] in {"HDFS-backed", "RocksDB"} and parts["provider"][1].endswith("StateStoreProvider")
        assert parts["provider"][2], parts  # not cut
        assert parts["offsets"] and parts["pre"] == 0 and not parts["offsets"][0][1].startswith("{"), parts
        sticky = browser.script(STICKY_HEADER)  # scrolled to its end, the drawer keeps Restore and Close in view
        assert sticky["scrolled"] > 0 and abs(sticky["headerTop"]) <= 1 and sticky["closeVisible"], sticky
        browser.screenshot(ARTIFACTS / "console-detail-scrolled.png")
        browser.script(in_page("doc.getElementById('detail').scrollTop = 0; return true;"))

        # Restore from the detail view: the dialog offers state partitions (blank: unchanged), refuses 0, queues the run
        before = len(dag_runs(c, "restore_from_savepoint"))
        click_in_page(browser, "#detail button[data-action=restore]")
        field = "#confirm-options input[data-option=state_partitions]"
        browser._wait(lambda: browser.script(in_page(f"return doc.querySelector('{field}') !== null || null;")), 10, "no option")
        with inside_console(browser):
            browser.type(field, "0")
            browser.click("#confirm-ok")
            assert browser.script(in_page("return doc.getElementById('confirm').open;"))  # below its minimum: not sent
            browser.script(in_page(f"doc.querySelector('{field}').value = ''; return true;"))
            browser.type(field, "4")
        browser.screenshot(ARTIFACTS / "console-restore.png")
        said = confirm_dialog(browser, accept=True)
        assert "State partitions" in said and f"Restore: job orders from {ids[0]}?" in said, said
        assert f"for job orders from {ids[0]}, which starts the job from this savepoint in a fresh checkpoint location." \
            in said, said  # the savepoint is named as the source, never as the location
        assert f"The sink: the file sink at {orders_sink(c.root)} holds" in said, said  # told before it is confirmed
        shown = notice(browser)
        runs = {run["dag_run_id"]: run for run in dag_runs(c, "restore_from_savepoint")}
        assert len(runs) == before + 1 and shown["run"] in runs, (shown, list(runs))
        assert runs[shown["run"]]["conf"] == {"job": "orders", "pointer": pointer, "state_partitions": 4}
        assert runs[shown["run"]]["state"] == "queued"  # no scheduler here: Airflow holds it
        browser.script(in_page("doc.getElementById('notice').replaceChildren(); return true;"))  # the next action's own notice

        # a filter
        browser.script(in_page("const f = doc.getElementById('filter'); f.value = 'pay';"
                               " f.dispatchEvent(new Event('input')); return true;"))
        assert [row["job"] for row in browser.script(JOB_ROWS)] == ["payments"]
        browser.script(in_page("const f = doc.getElementById('filter'); f.value = '';"
                               " f.dispatchEvent(new Event('input')); return true;"))

        # an action: stop with savepoint asks first; cancelled, nothing happens; confirmed, a DAG run
        before = len(dag_runs(c, "stop_job_with_savepoint"))
        click_in_page(browser, "tr.job[data-job=orders] button[data-action=stop]")
        assert "The job stops" in confirm_dialog(browser, accept=False)
        time.sleep(1)
        assert len(dag_runs(c, "stop_job_with_savepoint")) == before
        click_in_page(browser, "tr.job[data-job=orders] button[data-action=stop]")
        browser.screenshot(ARTIFACTS / "console-confirm.png")
        confirm_dialog(browser, accept=True)
        shown = notice(browser)
        runs = {run["dag_run_id"]: run for run in dag_runs(c, "stop_job_with_savepoint")}
        assert "success" in shown["kind"] and shown["run"] in runs, (shown, list(runs))
        assert runs[shown["run"]]["conf"] == {"job": "orders"}

        # dark mode and a timezone that is not UTC, as chosen in Airflow's own settings
        light = browser.script(STYLE)
        browser.script("localStorage.setItem('theme', 'dark');"
                       " localStorage.setItem('timezone', JSON.stringify('Asia/Kolkata')); return true;")
        browser.go(f"{c.cluster.base_url}/plugin/savepoints")
        wait_loaded(browser, "the console did not load in dark mode")
        dark = browser.script(STYLE)
        assert dark["theme"] == "dark" and light["theme"] == "light"
        assert luminance(dark["background"]) < 80 < luminance(light["background"]), (light, dark)
        assert dark["font"] == dark["hostFont"] == light["font"], (light, dark)  # Airflow's font
        click_in_page(browser, "tr.job[data-job=payments]")
        stop = browser._wait(lambda: browser.script(SAVEPOINT_ROWS), 30, "payments did not expand")[0]
        files = browser._wait(lambda: browser.script(in_page(LOAD_OF.replace("JOB", "payments"))), 30, "no load view under payments")
        assert [chart["chart"] for chart in files["charts"]] == ["Batch duration", "Input and processed rate", "File backlog"]
        assert files["charts"][2]["lines"] == {"files not yet read": 5} and files["charts"][2]["y"] == ["8 files", "0 files"], files
        created = json.loads((c.root / "payments" / c.taken["payments"][0] / "_metadata").read_text())["created_at"]
        india = datetime.fromisoformat(created).astimezone(timezone(timedelta(hours=5, minutes=30)))
        assert stop[8] == india.strftime("%Y-%m-%d %H:%M:%S") + " +05:30", stop
        browser.screenshot(ARTIFACTS / "console-dark.png")


@pytest.mark.slow
@browser_needed
def test_console_states_and_a_viewer_in_chromium(console, tmp_path):
    c = console
    with chromium(tmp_path) as browser:
        login(browser, c, VIEWER, c.viewer_password)
        wait_loaded(browser, "the console did not load for the viewer")
        buttons = browser.script(in_page("return Array.from(doc.querySelectorAll('button[data-action]')).map("
                                         "b => [b.dataset.action, b.disabled, b.title]);"))
        assert buttons and all(disabled and "may not trigger" in title for _, disabled, title in buttons), buttons
        before = len(dag_runs(c, "stop_job_with_savepoint"))
        browser.script(in_page("doc.defaultView.eval(\"runAction(ui.actions.stop, {job: 'orders'}, 'orders')\"); return true;"))
        confirm_dialog(browser, accept=True)
        refused = notice(browser)
        assert "error" in refused["kind"] and "refused" in refused["text"], refused
        assert len(dag_runs(c, "stop_job_with_savepoint")) == before

        with c.connection(host=str(c.base / "no-such-root")):
            reload_page(browser)
            problem = browser._wait(lambda: browser.script(PROBLEM), 30, "no problem shown")
            assert problem["code"] == "savepoint_root_not_found" and "does not exist" in problem["text"]
            assert "savepoint_dir names the wrong place" in problem["text"] and "Retry" in problem["text"]  # what to do
            assert "0 savepoint" not in browser.script(in_page("return doc.body.textContent;"))
            title, text = problem["color"], browser.script(in_page("return getComputedStyle(doc.body).color;"))
            assert title != text, (title, text)  # the error's own colour, not the page's text colour
            browser.screenshot(ARTIFACTS / "console-missing-root.png")
        hung_store = {"host": "s3://console-bucket/savepoints", "login": "console-key", "password": "console-secret"}
        with silent_endpoint() as endpoint, c.connection(**hung_store, extra=json.dumps({"endpoint_url": endpoint})):
            reload_page(browser)
            problem = browser._wait(lambda: browser.script(PROBLEM), 30, "no timeout shown")
            assert problem["code"] == "store_timeout" and "did not answer within 3 s" in problem["text"], problem
            browser.screenshot(ARTIFACTS / "console-store-timeout.png")
        click_in_page(browser, "#problem button")  # retry, now that the store is back
        wait_loaded(browser, "the retry did not load")
        assert browser._wait(lambda: browser.script(JOB_ROWS), 30, "no jobs after the retry")
