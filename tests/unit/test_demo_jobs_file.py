"""The demo's copy of jobs.yaml names the demo's own folders, so the `job` commands reading it find its savepoints
without ``SAVEPOINTS_DEMO_HOME`` (getting-started.md's ``job status demo-dedup --jobs-file demo-run/dags/jobs.yaml``)."""

from __future__ import annotations

import json
import os

from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.demo import install_example_dags
from airflow_savepoints.demo.__main__ import pin_demo_paths


def job_status(workdir, **variables) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAVEPOINTS_DEMO", "AIRFLOW__SAVEPOINTS", "AIRFLOW_CONN"))}
    result = CliRunner().invoke(app, ["job", "status", "demo-dedup", "--jobs-file", str(workdir / "dags" / "jobs.yaml"),
                                      "--json"], env=env | variables)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_demos_jobs_file_names_its_savepoints_without_the_variable(tmp_path):
    workdir = tmp_path / "demo-run"
    install_example_dags(workdir / "dags")
    pin_demo_paths(workdir / "dags" / "jobs.yaml", workdir)
    assert job_status(workdir)["detail"] == f"no run recorded in {workdir}/savepoints/demo-dedup"
    elsewhere = tmp_path / "elsewhere"
    assert job_status(workdir, SAVEPOINTS_DEMO_HOME=str(elsewhere))["detail"] == \
        f"no run recorded in {elsewhere}/savepoints/demo-dedup"  # the variable, set, still wins
