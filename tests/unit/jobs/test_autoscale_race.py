"""One acting autoscaler per job: two ``job autoscale`` at once never both act (docs/autoscale.md).

Two real processes race through a barrier into ``evaluate`` with ``mode: act`` on a job whose recorded series calls
for a scale-up (``test_autoscale_act.py``'s job: a driver's side of a run on a synthetic checkpoint, its action
going through the real upgrade path, whose check driver exits at once, so the action is rolled back for real).
The one that takes the job's autoscaler lease (``_autoscale.lease``) acts; the other holds (``in_flight``); both
decisions are in the history.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from airflow_savepoints.core import list_savepoints
from airflow_savepoints.core.lease import Lease
from airflow_savepoints.core.names import AUTOSCALE_LEASE, AUTOSCALE_LOCK
from airflow_savepoints.jobs import StreamingJob
from airflow_savepoints.jobs.description.metrics import append_decision, read_decisions, write_series
from airflow_savepoints.jobs.description.model import AutoscaleSettings
from airflow_savepoints.jobs.workflows.run import JobContext
from airflow_savepoints.storage import Store
from tests.support.synthetic import write_checkpoint
from tests.unit.jobs.test_autoscale_act import Submitted, running_job

ROOT = Path(__file__).resolve().parents[3]


def racer(job_json: str, ready: str, go: str, out: str) -> None:
    """One ``job autoscale``: the job's context, then at the barrier's go, its evaluation (run in a process)."""
    from airflow_savepoints.jobs.workflows.autoscale import evaluate

    job = StreamingJob.model_validate_json(job_json)
    ctx = JobContext(job, Store(job.savepoint_dir))
    submitted = Submitted()
    Path(ready).touch()
    while not os.path.exists(go):
        time.sleep(0.0005)
    result = evaluate(ctx, dry_run=False, submit_for=submitted, log_dir=Path(out).parent / "logs")
    Path(out).write_text(json.dumps({"result": result, "submitted": len(submitted.jobs)}, default=str))


def race(tmp_path: Path, ctx: JobContext, racers: int = 2) -> list[dict]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    code = "import sys; from tests.unit.jobs.test_autoscale_race import racer; racer(*sys.argv[1:])"
    processes = [subprocess.Popen([sys.executable, "-c", code, ctx.job.model_dump_json(), str(barrier / f"ready{i}"),
                                   str(barrier / "go"), str(barrier / f"out{i}.json")], cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}) for i in range(racers)]
    deadline = time.monotonic() + 120
    while not all((barrier / f"ready{i}").exists() for i in range(racers)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes), "a racer did not get ready"
        time.sleep(0.01)
    (barrier / "go").touch()  # both at once
    for process in processes:
        assert process.wait(timeout=300) == 0
    return [json.loads((barrier / f"out{i}.json").read_text()) for i in range(racers)]


def test_two_autoscalers_racing_one_acts_the_other_holds_in_flight_and_both_are_recorded(tmp_path):
    ctx, _ = running_job(tmp_path / "job")
    outcomes = race(tmp_path, ctx)
    by_outcome = {o["result"]["outcome"]: o for o in outcomes}
    assert sorted(by_outcome) == ["held", "rolled_back"], [(o["result"]["outcome"], o["result"]["message"]) for o in outcomes]
    acted, held = by_outcome["rolled_back"], by_outcome["held"]
    assert acted["submitted"] >= 1 and held["submitted"] == 0  # only the one that acted submitted its check
    assert (held["result"]["action"], held["result"]["reason"], held["result"]["error"]) == ("hold", "in_flight", None)
    assert "another autoscaler of the job" in held["result"]["evidence"]["in_flight"], held["result"]
    assert len(list_savepoints(ctx.root, "orders")) == 1  # the one check's savepoint
    recorded = read_decisions(ctx.folder)
    assert sorted(d["outcome"] for d in recorded) == ["held", "rolled_back"]  # no record lost
    assert not ctx.folder.exists(AUTOSCALE_LEASE) and not ctx.folder.exists(AUTOSCALE_LOCK)  # both released


def test_two_autoscalers_racing_on_an_object_store_one_acts_the_other_holds(tmp_path, s3):
    """The same race with the job's folder on S3 (moto's server): the lease is one conditional PUT there."""
    from tests.test_lifecycle import running_run
    from tests.unit.jobs.test_autoscale_act import step_up_ending_now

    job = StreamingJob(name="orders", application="app.py", master="spark://127.0.0.1:9",
                       checkpoint=str(write_checkpoint(tmp_path / "cp")), savepoint_dir=f"s3://{s3}/sp",
                       autoscale=AutoscaleSettings(mode="act", max_executors=4, cooldown=900))
    ctx = JobContext(job, Store(job.savepoint_dir))
    write_series(ctx.folder, step_up_ending_now())
    running_run(ctx)
    outcomes = race(tmp_path, ctx)
    results = sorted((o["result"]["outcome"], o["result"]["reason"], o["submitted"] > 0) for o in outcomes)
    assert results == [("held", "in_flight", False), ("rolled_back", "scale_up", True)], \
        [(o["result"]["outcome"], o["result"]["message"]) for o in outcomes]
    assert sorted(d["outcome"] for d in read_decisions(ctx.folder)) == ["held", "rolled_back"]
    assert not ctx.folder.exists(AUTOSCALE_LEASE) and not ctx.folder.exists(AUTOSCALE_LOCK)


def test_a_dry_run_during_an_action_holds_and_a_dead_autoscalers_lease_is_broken(tmp_path):
    from airflow_savepoints.jobs.workflows.autoscale import evaluate

    ctx, _ = running_job(tmp_path / "job")
    other = Lease(ctx.folder, AUTOSCALE_LEASE, stale_after=1.0, facts={"started_at": time.time()})
    assert other.try_acquire() is None  # an autoscaler acting elsewhere
    dry = evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=tmp_path)
    assert (dry["outcome"], dry["reason"]) == ("held", "in_flight") and "another autoscaler" in dry["message"]
    time.sleep(2.5)  # it died: its lease is not renewed past its stale time
    again = evaluate(ctx, dry_run=True, submit_for=Submitted(), log_dir=tmp_path)
    assert (again["outcome"], again["reason"]) == ("recommended", "scale_up"), again
    assert [d["reason"] for d in read_decisions(ctx.folder)] == ["in_flight", "scale_up"]


def test_the_history_is_written_under_its_lock_and_a_held_lock_is_waited_for(tmp_path):
    store = Store(str(tmp_path))
    lock = Lease(store, AUTOSCALE_LOCK, stale_after=10.0)
    assert lock.try_acquire() is None
    warnings: list[str] = []
    started = time.monotonic()
    append_decision(store, {"at_epoch": 1, "outcome": "held"}, warnings=warnings, lock_timeout=0.3)
    assert time.monotonic() - started >= 0.3 and "stayed held" in warnings[0]  # waited, then recorded anyway
    lock.release()
    append_decision(store, {"at_epoch": 2, "outcome": "held"})
    assert [d["at_epoch"] for d in read_decisions(store)] == [1, 2] and not store.exists(AUTOSCALE_LOCK)


def test_job_autoscale_while_another_acts_holds_in_flight_records_it_and_exits_0(tmp_path):
    from tests.unit.cli.test_autoscale_command import invoke, running
    from tests.unit.jobs.test_autoscale_act import step_up_ending_now

    path = tmp_path / "jobs.yaml"
    path.write_text(f"jobs:\n  - name: orders\n    application: app.py\n    checkpoint: {tmp_path}/ckpt\n"
                    f"    master: spark://127.0.0.1:9\n    savepoint_dir: {tmp_path}/sp\n"
                    "    autoscale:\n      max_executors: 4\n      mode: act\n")
    folder = Store(str(tmp_path / "sp" / "orders"))
    write_series(folder, step_up_ending_now())
    running(path)
    other = Lease(folder, AUTOSCALE_LEASE, stale_after=120.0, facts={"started_at": time.time()})
    assert other.try_acquire() is None
    code, result = invoke("orders", "--jobs-file", str(path))
    assert code == 0 and (result["outcome"], result["reason"], result["error"]) == ("held", "in_flight", None), result
    assert [d["reason"] for d in read_decisions(folder)] == ["in_flight"]
    assert other.held()  # the other autoscaler's lease is left alone
    other.release()
