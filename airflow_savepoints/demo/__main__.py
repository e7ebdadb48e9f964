"""``python -m airflow_savepoints.demo``: the example DAGs, on a real Airflow, against a local streaming job.

1. a fresh Airflow (SQLite metadata database) in the work folder; the example DAGs (the
   repository's ``dags/``, shipped in the wheel) are copied to ``<work folder>/dags``; the job is
   ``demo-dedup`` from their ``jobs.yaml`` (stateful de-duplication of click events into a JSON file
   sink) on local Spark;
2. ``restore_from_savepoint`` (fresh start) starts the job detached and waits for its progress;
3. ``periodic_savepoints`` runs a few times while events arrive; the savepoints are listed;
4. ``stop_job_with_savepoint`` stops it between two batches with a final savepoint;
5. ``restore_from_savepoint`` restarts it from the latest savepoint in a fresh checkpoint location;
6. the output is checked: every event id exactly once across the stop and the restore.

Each DAG runs with ``dag.test()``; task logs go to ``<work folder>/airflow-tasks.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import airflow_savepoints.demo.app as app
from airflow_savepoints.demo import example_dags_folder, install_example_dags

JOB = "demo-dedup"
TASK = JOB.replace("-", "_")
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def airflow_environment(workdir: Path, dags: Path) -> dict[str, str]:
    """Everything Airflow and the demo job read from the environment, all inside ``workdir``."""
    return {
        "AIRFLOW_HOME": str(workdir / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{workdir}/airflow/airflow.db",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(workdir / "airflow" / "logs"),
        "SAVEPOINTS_DEMO_HOME": str(workdir),
        "SAVEPOINTS_DEMO_APP": app.__file__,
        "PYSPARK_PYTHON": sys.executable,
    }


_sinks: dict[Path, object] = {}


@contextlib.contextmanager
def quiet(log_file: Path):
    """Send Airflow's task output to ``log_file``; the console keeps the demo's own lines.

    The file stays open: Airflow's structlog keeps the stream it first saw.
    """
    sink = _sinks.setdefault(log_file, open(log_file, "a"))  # noqa: SIM115 - open for the process's life
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        root = logging.getLogger()
        saved = root.handlers[:]
        root.handlers = [logging.StreamHandler(sink)]
        try:
            yield
        finally:
            root.handlers = saved


def run_dag(dags: Path, dag_id: str, log_file: Path, **conf) -> dict:
    """Run one example DAG with dag.test(); return the XCom of each task; exit if the run failed."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import DagRunState

    with quiet(log_file):
        dag = DagBag(dag_folder=str(dags / f"{dag_id}.py")).get_dag(dag_id)
        result = dag.test(run_conf=conf or None)
        instances = result.get_task_instances()
        values = {ti.task_id: ti.xcom_pull(task_ids=ti.task_id) for ti in instances}
    if result.state != DagRunState.SUCCESS:
        states = ", ".join(f"{ti.task_id}={ti.state}" for ti in instances)
        console.print(f"[red]error:[/] DAG {dag_id} ended {result.state} ({states})\n"
                      f"how to fix: read the task logs in {log_file}")
        raise SystemExit(1)
    return values


def print_savepoints(workdir: Path) -> list:
    from airflow_savepoints.core import list_savepoints
    from airflow_savepoints.storage import Store

    root = Store(str(workdir / "savepoints"))
    records = list_savepoints(root, JOB)
    table = Table(title=f"savepoints of {JOB} in {root.child(JOB).url}")
    table.add_column("savepoint", no_wrap=True)
    for column in ("type", "state", "batch", "bytes", "created (UTC)"):
        table.add_column(column)
    for record in records:
        table.add_row(record.savepoint_id, record.type.value, record.state.value, str(record.batch_id),
                      str(record.bytes), f"{record.created_at:%H:%M:%S}")
    console.print(table)
    return records


def pin_demo_paths(jobs_file: Path, workdir: Path) -> None:
    """Make the defaults of the jobs file's ``${SAVEPOINTS_DEMO_HOME:-…}`` and ``${SAVEPOINTS_DEMO_APP:-…}`` this
    demo's folder and application, so a command reading that file later (``job status demo-dedup --jobs-file
    <workdir>/dags/jobs.yaml``) finds the demo's savepoints without the variables; set, they still win."""
    text = jobs_file.read_text()
    for variable, value in (("SAVEPOINTS_DEMO_HOME", workdir), ("SAVEPOINTS_DEMO_APP", app.__file__)):
        text = re.sub(rf"\$\{{{variable}:-[^}}]*\}}", lambda _, v=variable, p=value: f"${{{v}:-{p}}}", text)
    jobs_file.write_text(text)


def prepare(workdir: Path) -> tuple[Path, Path]:
    """A fresh work folder with the example DAGs and an Airflow metadata database: (DAGs folder, task log)."""
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "airflow").mkdir(parents=True)
    dags = workdir / "dags"
    install_example_dags(dags)
    pin_demo_paths(dags / "jobs.yaml", workdir)
    os.environ.update(airflow_environment(workdir, dags))
    log_file = workdir / "airflow-tasks.log"
    console.rule("[bold]airflow-savepoints demo")
    console.print(f"work folder: {workdir}; DAGs: {dags} (from {example_dags_folder()})")

    from airflow.utils import db

    with quiet(log_file):
        db.resetdb()
    console.print("Airflow metadata database ready (SQLite)")
    return dags, log_file


def verdict(output: Path, sent: set[int]) -> int:
    """0 when the sink holds every event sent exactly once, else 1."""
    ids = app.committed_event_ids(output)
    console.print(f"output: {len(ids)} events, {len(set(ids))} distinct ids, {len(sent)} distinct ids sent")
    if ids == sorted(sent):
        console.print("[bold green]every event exactly once across the stop and the restore[/]")
        return 0
    console.print("[bold red]output does not match the input: duplicates or losses[/]")
    return 1


def run(workdir: Path, rounds: int, interval: float) -> int:
    from airflow_savepoints.jobs.description.record import read_run
    from airflow_savepoints.jobs.workflows.run import stop_process
    from airflow_savepoints.storage import Store

    dags, log_file = prepare(workdir)
    input_dir, job_folder = workdir / "input", Store(str(workdir / "savepoints" / JOB))
    sent: set[int] = set()
    next_file = 0

    def send(files: int) -> None:
        nonlocal next_file
        for _ in range(files):
            sent.update(app.write_events(input_dir, next_file))
            next_file += 1

    try:
        send(2)
        with app.Feeder(input_dir, sent, next_file) as arriving:  # wait_for_progress waits for a batch after the first
            started = run_dag(dags, "restore_from_savepoint", log_file, job=JOB, fresh_start=True)
        next_file = arriving.index
        first = started["restore_and_start"]
        console.print(f"restore_from_savepoint (fresh start): job {JOB} runs as pid {first['pid']}, "
                      f"committed batch {first['first_batch']}")
        for number in range(1, rounds + 1):
            send(2)
            time.sleep(interval)
            values = run_dag(dags, "periodic_savepoints", log_file)
            taken, kept = values[f"savepoint_{TASK}"], values[f"retention_{TASK}"]
            console.print(f"periodic_savepoints run {number}: savepoint at batch {taken['batch_id']}; retention "
                          f"disposed {len(kept['disposed'])} (keeps {kept['policy']['max_periodic']} periodic)")
        stopped = run_dag(dags, "stop_job_with_savepoint", log_file, job=JOB)["stop_with_savepoint"]
        console.print(f"stop_job_with_savepoint: stopped ({stopped['stop_method']}), "
                      f"{stopped['consistency']} savepoint at batch {stopped['batch_id']}")
        infos = print_savepoints(workdir)
        send(3)
        with app.Feeder(input_dir, sent, next_file) as arriving:
            restarted = run_dag(dags, "restore_from_savepoint", log_file, job=JOB)["restore_and_start"]
        next_file = arriving.index
        console.print(f"restore_from_savepoint: restored batch {restarted['restored']['batch_id']} of "
                      f"{infos[-1].pointer}\n  into {restarted['checkpoint']}; the job is live again at batch "
                      f"{restarted['first_batch']}")
        deadline = time.monotonic() + 120
        while app.committed_event_ids(workdir / "output") != sorted(sent) and time.monotonic() < deadline:
            time.sleep(1)
        ended = run_dag(dags, "stop_job_with_savepoint", log_file, job=JOB)["stop_with_savepoint"]
        console.print(f"stop_job_with_savepoint: the job ends as a user ends it, stopped with a "
                      f"{ended['consistency']} savepoint at batch {ended['batch_id']}")
    finally:
        last = read_run(job_folder)
        if last is not None and last.ended is None and stop_process(last, grace=30):
            console.print(f"[yellow]demo job (pid {last.pid}) killed[/]: the demo did not reach its stop")
    outcome = verdict(workdir / "output", sent)
    console.print(open_console_hint(workdir))
    return outcome


def open_console_hint(workdir: Path) -> str:
    """How to open the savepoints console on what the demo made."""
    return (f"open the savepoints console on what the demo made: make console (or airflow-savepoints demo --console "
            f"--workdir {workdir}), then http://127.0.0.1:8080/plugin/savepoints")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("demo-run"))
    parser.add_argument("--rounds", type=int, default=4, help="runs of periodic_savepoints")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between them")
    args = parser.parse_args()
    raise SystemExit(run(args.workdir.resolve(), args.rounds, args.interval))


if __name__ == "__main__":
    main()
