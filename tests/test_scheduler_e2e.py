"""End to end on a real Airflow 3.3 deployment: scheduler (LocalExecutor), DAG processor, triggerer
and API server as separate processes, driven only through the public REST API.

``restore_from_savepoint`` (triggered over REST) starts the demo streaming job and waits for it
with the deferrable ``BatchCommittedSensor`` in the triggerer; then the scheduler runs
``periodic_savepoints`` on its 10 s schedule while the job keeps consuming new input. Storage,
XComs, task states and event logs must all tell the same story.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import ROOT
from tests.support.airflow_cluster import AirflowCluster, airflow_cluster, tail

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

JOB = "demo-dedup"
SAVEPOINT_TASK = "savepoint_demo_dedup"  # periodic_savepoints' task for the job (other tasks may come and go)
RESTORE, PERIODIC = "restore_from_savepoint", "periodic_savepoints"


def run_path(dag_id: str, run_id: str) -> str:
    return f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"


def xcom(cluster: AirflowCluster, dag_id: str, run_id: str, task_id: str) -> Any:
    value = cluster.get(f"{run_path(dag_id, run_id)}/taskInstances/{task_id}/xcomEntries/return_value")["value"]
    return json.loads(value) if isinstance(value, str) else value


def task_states(cluster: AirflowCluster, dag_id: str, run_id: str) -> dict[str, str | None]:
    tis = cluster.get(f"{run_path(dag_id, run_id)}/taskInstances")["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in tis}


def task_log(cluster: AirflowCluster, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
    """The task's log as the REST API serves it (the worker's log and the triggerer's log of its trigger)."""
    answer = cluster.api("GET", f"{run_path(dag_id, run_id)}/taskInstances/{task_id}/logs/{try_number}",
                         params={"full_content": "true"}, headers={"Accept": "application/json"})
    return "\n".join(json.dumps(entry) if not isinstance(entry, str) else entry for entry in answer["content"])


def event_log(cluster: AirflowCluster, dag_id: str, run_id: str, task_id: str) -> list[str]:
    answer = cluster.get("/api/v2/eventLogs", dag_id=dag_id, run_id=run_id, task_id=task_id, limit=100)
    return [e["event"] for e in sorted(answer["event_logs"], key=lambda e: e["event_log_id"])]


def test_scheduler_triggerer_and_rest_api_run_the_savepoint_dags(tmp_path):
    import airflow_savepoints.demo.app as demo
    from airflow_savepoints.core import list_savepoints, verify_savepoint
    from airflow_savepoints.jobs.description.record import read_run
    from airflow_savepoints.jobs.launch.launcher import process_alive
    from airflow_savepoints.jobs.workflows.run import stop_process
    from airflow_savepoints.storage import Store

    started = time.monotonic()
    demo_home = tmp_path / "demo"
    env = {
        "SAVEPOINTS_DEMO_HOME": str(demo_home),
        "SAVEPOINTS_DEMO_APP": demo.__file__,
        "SAVEPOINTS_PERIODIC_INTERVAL": "10s",  # max_active_runs=1: rounds never overlap
        "PYSPARK_PYTHON": sys.executable,  # the venv's interpreter, not its resolved base
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    savepoints = Store(str(demo_home / "savepoints"))
    job_folder = savepoints.child(JOB)
    next_file = 0

    def write_input() -> None:
        nonlocal next_file
        demo.write_events(demo_home / "input", next_file)
        next_file += 1

    write_input()
    observed: dict[str, Any] = {}
    # DAGs are paused at creation and unpaused over REST in order: periodic_savepoints unpaused at
    # creation would run at once, before the job exists (its task fails and retries every 30 s).
    with airflow_cluster(tmp_path / "airflow", ROOT / "dags", env, paused_at_creation=True) as cluster:
        try:
            observed["startup_s"] = round(time.monotonic() - started)

            # -- authentication: the API refuses calls without a valid JWT -----------------------
            assert cluster.request("GET", "/api/v2/dags", auth=False).status_code in (401, 403)
            bogus = {"Authorization": "Bearer not-a-jwt"}
            assert cluster.request("GET", "/api/v2/dags", auth=False, headers=bogus).status_code in (401, 403)
            wrong = cluster.request("POST", "/auth/token", auth=False,
                                    json={"username": cluster.username, "password": "wrong-password"})
            assert wrong.status_code == 401, wrong.text
            refused = cluster.request("POST", f"/api/v2/dags/{RESTORE}/dagRuns", auth=False,
                                      json={"logical_date": None, "conf": {"job": JOB}})
            assert refused.status_code in (401, 403), refused.text

            # -- the DAG processor has serialized the example DAGs ---------------------------------
            deadline = time.monotonic() + 120
            while not all(cluster.request("GET", f"/api/v2/dags/{d}").status_code == 200 for d in (RESTORE, PERIODIC)):
                cluster.check_alive()
                assert time.monotonic() < deadline, ("DAGs not parsed", cluster.get("/api/v2/importErrors"))
                time.sleep(0.25)
            assert cluster.get("/api/v2/importErrors")["total_entries"] == 0, cluster.get("/api/v2/importErrors")
            periodic_dag = cluster.get(f"/api/v2/dags/{PERIODIC}")
            assert periodic_dag["is_paused"] is True
            assert periodic_dag["timetable_summary"] == "0:00:10", periodic_dag  # SAVEPOINTS_PERIODIC_INTERVAL at parse time
            assert cluster.get(f"/api/v2/dags/{RESTORE}/dagRuns")["total_entries"] == 0  # the refused trigger made none

            # -- restore_from_savepoint through the REST API (fresh start) ------------------------
            cluster.api("PATCH", f"/api/v2/dags/{RESTORE}", json={"is_paused": False})
            run = cluster.api("POST", f"/api/v2/dags/{RESTORE}/dagRuns", expect=(200,),
                              json={"logical_date": None, "conf": {"job": JOB, "fresh_start": True}})
            restore_run = observed["restore_run"] = run["dag_run_id"]
            assert run["conf"] == {"job": JOB, "fresh_start": True}
            seen_states: list[tuple[str, str | None]] = observed.setdefault("wait_for_progress_states", [])
            deadline, fed = time.monotonic() + 300, time.monotonic()
            while True:
                if time.monotonic() - fed > 3:  # new input now and then, so batches follow the first whenever it lands
                    write_input()
                    fed = time.monotonic()
                states = task_states(cluster, RESTORE, restore_run)
                if not seen_states or seen_states[-1][1] != states.get("wait_for_progress"):
                    seen_states.append((f"{time.monotonic() - started:.1f}s", states.get("wait_for_progress")))
                state = cluster.get(run_path(RESTORE, restore_run))["state"]
                if state in ("success", "failed"):
                    break
                cluster.check_alive()
                assert time.monotonic() < deadline, f"{RESTORE} still {state}: {states}"
                time.sleep(0.3)
            assert state == "success", task_states(cluster, RESTORE, restore_run)
            assert task_states(cluster, RESTORE, restore_run) == {"restore_and_start": "success",
                                                                  "wait_for_progress": "success"}
            observed["restored_s"] = round(time.monotonic() - started)
            started_job = xcom(cluster, RESTORE, restore_run, "restore_and_start")
            job_run = read_run(job_folder)
            assert job_run is not None and job_run.pid == started_job["pid"] and process_alive(job_run.pid)
            assert started_job["checkpoint"] == job_run.checkpoint == str(demo_home / "checkpoint")
            progressed = xcom(cluster, RESTORE, restore_run, "wait_for_progress")
            assert progressed["batch_id"] > started_job["first_batch"], (progressed, started_job)

            # -- the sensor deferred: the wait ran in the triggerer -------------------------------
            # the execution API records every state the task reports; DEFERRED comes before SUCCESS
            events = observed["wait_for_progress_events"] = event_log(cluster, RESTORE, restore_run, "wait_for_progress")
            assert "deferred" in events and events.index("deferred") < events.index("success"), events
            # the triggerer's own lines about this task's trigger, served with the task log over REST
            log = task_log(cluster, RESTORE, restore_run, "wait_for_progress")
            trigger_name = f"{RESTORE}/{restore_run}/wait_for_progress/-1/1"
            assert "Pausing task as DEFERRED" in log, log[-3000:]
            assert f"trigger {trigger_name} (ID" in log and "starting" in log, log[-3000:]
            fired = [line for line in log.splitlines() if "Trigger fired event" in line and trigger_name in line]
            assert len(fired) == 1 and f"'batch_id': {progressed['batch_id']}" in fired[0], log[-3000:]
            tries = cluster.get(f"{run_path(RESTORE, restore_run)}/taskInstances/wait_for_progress/tries")
            assert [t["try_number"] for t in tries["task_instances"]] == [1]  # resumed, not retried

            # -- periodic_savepoints on its 10 s schedule while the job consumes new input --------
            cluster.api("PATCH", f"/api/v2/dags/{PERIODIC}", json={"is_paused": False})
            deadline, last_write = time.monotonic() + 240, 0.0
            while True:
                if time.monotonic() - last_write > 4:  # new input between (and during) savepoint rounds
                    write_input()
                    last_write = time.monotonic()
                runs = cluster.get(f"/api/v2/dags/{PERIODIC}/dagRuns", limit=100)["dag_runs"]
                failed = [r["dag_run_id"] for r in runs if r["state"] == "failed"]
                assert not failed, {r: task_states(cluster, PERIODIC, r) for r in failed}
                # two rounds may run back to back (the round of the interval before the unpause, then
                # the next): wait until the rounds' savepoints show the job moved on between them
                periodic_batches = {i.batch_id for i in list_savepoints(savepoints, JOB) if i.type.value == "periodic"}
                if sum(r["state"] == "success" for r in runs) >= 2 and len(periodic_batches) >= 2:
                    break
                cluster.check_alive()
                assert process_alive(job_run.pid), "the streaming job died:\n" + tail(Path(job_run.log_file))
                assert time.monotonic() < deadline, [(r["dag_run_id"], r["state"]) for r in runs]
                time.sleep(1)
            cluster.api("PATCH", f"/api/v2/dags/{PERIODIC}", json={"is_paused": True})
            deadline = time.monotonic() + 120  # let a round already under way finish
            while any(r["state"] in ("queued", "running") for r in runs):
                assert time.monotonic() < deadline, [(r["dag_run_id"], r["state"]) for r in runs]
                time.sleep(1)
                runs = cluster.get(f"/api/v2/dags/{PERIODIC}/dagRuns", limit=100)["dag_runs"]
            observed["periodic_done_s"] = round(time.monotonic() - started)
            assert process_alive(job_run.pid), "the job must keep running through the savepoint rounds"

            # -- storage, XComs and task states agree ---------------------------------------------
            succeeded = sorted((r for r in runs if r["state"] == "success"), key=lambda r: r["run_after"])
            assert len(succeeded) >= 2 and all(r["state"] == "success" for r in runs), runs
            assert {r["run_type"] for r in succeeded} == {"scheduled"}  # the scheduler made them, on its schedule
            after = [datetime.fromisoformat(r["run_after"]) for r in succeeded]
            assert all((b - a).total_seconds() >= 9.9 for a, b in pairwise(after)), after  # 10 s apart
            on_disk = {info.pointer: info for info in list_savepoints(savepoints, JOB)
                       if info.type.value == "periodic"}
            assert len(on_disk) >= 2, sorted(on_disk)
            pushed = {}
            for r in succeeded:
                assert task_states(cluster, PERIODIC, r["dag_run_id"])[SAVEPOINT_TASK] == "success"
                summary = xcom(cluster, PERIODIC, r["dag_run_id"], SAVEPOINT_TASK)
                pushed[summary["pointer"]] = (r["dag_run_id"], summary)
            observed["periodic"] = {run_id: (s["batch_id"], s["pointer"]) for run_id, s in pushed.values()}
            assert set(on_disk) <= set(pushed), (sorted(on_disk), sorted(pushed))  # retention may drop old ones
            for pointer, info in on_disk.items():
                run_id, summary = pushed[pointer]
                assert info.batch_id == summary["batch_id"], (pointer, info.batch_id, summary)
                assert info.reason == f"{PERIODIC}/{run_id}"
                assert info.request_id == f"{PERIODIC}/{run_id}/{SAVEPOINT_TASK}/-1"
                location, manifest = verify_savepoint(pointer)  # every file matches its checksum
                assert manifest.batch_id == summary["batch_id"]
                assert manifest.checkpoint.rstrip("/").endswith(str(demo_home / "checkpoint"))
            batches = [pushed_summary["batch_id"] for _, pushed_summary in
                       sorted(pushed.values(), key=lambda item: item[1]["created_at"])]
            assert batches == sorted(batches) and batches[-1] > batches[0], batches  # the job moved on between rounds
            assert batches[0] >= progressed["batch_id"]
        except BaseException:
            print(f"observed: {json.dumps(observed, indent=1, default=str)}")
            last = read_run(job_folder)
            if last is not None:
                spark_info = r"^\d\d/\d\d/\d\d [\d:]+ INFO "  # keep warnings, errors and tracebacks
                print(f"===== streaming job log {last.log_file} (tail, without INFO lines)\n"
                      f"{tail(Path(last.log_file), 40, spark_info)}")
            raise
        finally:
            last = read_run(job_folder)
            if last is not None:
                stop_process(last, grace=30)
    assert last is not None and not process_alive(last.pid)
    assert cluster.leftover_processes() == []
    print(f"observed: {json.dumps(observed, indent=1, default=str)}; total {time.monotonic() - started:.0f}s")
