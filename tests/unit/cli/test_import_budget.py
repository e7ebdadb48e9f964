"""Each local command imports only what it uses: its import budget, as modules it must not import.

A command's start is mostly imports (docs/performance.md, the CLI start: each command within 0.4 s of a bare
Python start). Each command runs here in a fresh interpreter through the console script's ``main()`` on a small
savepoint, and the modules it had imported when it exited are checked against what it must not import: an
eager import put back (``cli/job.py`` in every command, the restore code in ``verify``) fails here by name.
Timings are the benchmark's (``python benchmarks/run.py --cli-start``), not this test's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

MODULES_AT_EXIT = ("import atexit, json, sys; listing = sys.argv.pop(1); "
                   "atexit.register(lambda: open(listing, 'w').write(json.dumps(sorted(sys.modules)))); "
                   "from airflow_savepoints.cli.main import main; main()")

P = "airflow_savepoints."
JOB_COMMANDS = P + "cli.job"  # `job ...`: imported when `job` is named
TAKE = {P + "core.savepoint", P + "checkpoint.planner", P + "core.dispose", P + "core.state_summary"}  # a savepoint
RESTORE = {P + "core.restore", P + "core.rescale", P + "core.input_check"}  # a restore
CATALOG = {P + "core.catalog", P + "core.lease", "tenacity"}  # the job's catalog and its lock
JOBS = {P + "jobs.workflows.lifecycle", P + "jobs.workflows.run", P + "jobs.launch.runners", P + "jobs.description.model"}
READ_ONLY = {JOB_COMMANDS, "rich", *TAKE, *RESTORE, *CATALOG, *JOBS}  # show, verify, offsets: a manifest and files

# command -> modules it must not import
BUDGET = {
    "version": {JOB_COMMANDS, "rich", "pydantic", "fsspec", *TAKE, *RESTORE, *CATALOG, *JOBS},
    "list": {JOB_COMMANDS, "rich", P + "core.copier", *TAKE, *RESTORE, *JOBS},
    "show": READ_ONLY | {P + "core.copier"},
    "verify": READ_ONLY,
    "offsets": (READ_ONLY - {P + "core.input_check"}) | {P + "core.copier"},
    "restore": {JOB_COMMANDS, *TAKE, *JOBS},
    "trigger": {JOB_COMMANDS, "rich", *RESTORE, *JOBS},
    "status": {JOB_COMMANDS, "rich", *TAKE, *RESTORE, P + "jobs.workflows.lifecycle"},  # a run's state: jobs/workflows/run.py
    "job status": {"rich", *TAKE, *RESTORE, P + "jobs.workflows.lifecycle", P + "jobs.workflows.upgrade"},  # and cli/job.py
}


def run_cli(args: list[str], env: dict[str, str], listing: Path) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", MODULES_AT_EXIT, str(listing), *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return set(json.loads(listing.read_text()))


@pytest.fixture(scope="module")
def small_savepoint(tmp_path_factory):
    """A savepoint of the 15-file test checkpoint, a jobs file naming its job, and the commands' environment."""
    work = tmp_path_factory.mktemp("budget")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SAVEPOINTS__", "AIRFLOW_CONFIG"))}
    env.update(AIRFLOW_HOME=str(work / "airflow-home"), PYTHONPATH=str(ROOT))
    checkpoint, root = ROOT / "tests" / "data" / "spark35" / "hdfs", work / "sp"
    taken = subprocess.run([sys.executable, "-m", "airflow_savepoints.cli.main", "trigger", str(checkpoint), "--job", "j",
                            "--dir", str(root), "--json"], capture_output=True, text=True, env=env, check=True)
    jobs = work / "jobs.yaml"
    jobs.write_text(json.dumps({"jobs": [{"name": "j", "application": "app.py", "checkpoint": str(checkpoint),
                                          "savepoint_dir": str(root)}]}))
    pointer = json.loads(taken.stdout)["pointer"]
    commands = {
        "version": ["--version"],
        "list": ["list", "--job", "j", "--dir", str(root), "--json"],
        "show": ["show", pointer, "--json"],
        "verify": ["verify", pointer, "--json"],
        "offsets": ["offsets", pointer, "--json"],
        "restore": ["restore", pointer, "--to", str(work / "restored"), "--json"],
        "trigger": ["trigger", str(checkpoint), "--job", "j", "--dir", str(root), "--json"],
        "status": ["status", "--job", "j", "--dir", str(root), "--json"],
        "job status": ["job", "status", "j", "--jobs-file", str(jobs), "--json"],
    }
    return work, env, commands


@pytest.mark.parametrize("command", list(BUDGET))
def test_each_command_imports_only_what_it_uses(small_savepoint, command):
    work, env, commands = small_savepoint
    imported = run_cli(commands[command], env, work / f"modules-{command.replace(' ', '-')}.json")
    assert "airflow_savepoints.cli.main" in imported  # the listing is the command's own
    beyond = sorted(m for m in imported if m in BUDGET[command] or m.split(".")[0] in BUDGET[command])
    assert not beyond, f"`{command}` imported {beyond}: import them where they are used (docs/performance.md)"
    assert "airflow" not in imported  # no connection named: Airflow is never imported


def test_a_job_command_imports_the_job_commands_and_no_other_command_does(small_savepoint):
    work, env, commands = small_savepoint
    assert JOB_COMMANDS in run_cli(commands["job status"], env, work / "modules-job.json")
    assert JOB_COMMANDS not in run_cli(commands["list"], env, work / "modules-list.json")
