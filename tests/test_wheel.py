"""The package as a user gets it: the built wheel installed into fresh virtualenvs, away from the checkout.

One wheel is built per session (``uv build``). uv makes the virtualenvs (seconds, from its cache); pyspark's
wheel is taken from pip's cache (``pip wheel``) so that uv need not build pyspark's sdist again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

UV = Path(sys.executable).parent / "uv"


def run(*command: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600,
        check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in command], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{command} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
                             f"stderr:\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    """The package's wheel, and pyspark's wheel (the release [spark] pins) from pip's cache."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    run(UV, "build", "--wheel", "--quiet", "--out-dir", folder, ROOT)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", folder, f"pyspark=={version('pyspark')}")
    return folder


def package_wheel(wheelhouse: Path) -> Path:
    (wheel,) = wheelhouse.glob("airflow_savepoints-*.whl")
    return wheel


def fresh_venv(path: Path, requirement: str, wheelhouse: Path) -> Path:
    """A new virtualenv with ``requirement`` and its dependencies resolved from the indexes; pip check clean."""
    run(UV, "venv", "--quiet", "--seed", "--python", sys.executable, path)
    python = path / "bin" / "python"
    run(UV, "pip", "install", "--quiet", "--python", python, "--find-links", wheelhouse, requirement)
    check = run(python, "-m", "pip", "check")
    assert "No broken requirements found" in check.stdout, check.stdout
    return path / "bin"


def user_env(bin_dir: Path, home: Path) -> dict[str, str]:
    """The environment of a user of that virtualenv: nothing from this checkout or the test session."""
    # and the JVM options the session's JVMs run with (tests/conftest.py: C1 and the serial GC on 2 cores)
    keep = ("HOME", "LANG", "LC_ALL", "JAVA_HOME", "JAVA_TOOL_OPTIONS", "TMPDIR", "TERM")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    home.mkdir(parents=True, exist_ok=True)
    env.update(PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", AIRFLOW_HOME=str(home),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
               AWS_EC2_METADATA_DISABLED="true")
    return env


def test_without_spark_the_provider_installs_light_lists_imports_its_dags_and_takes_a_savepoint(
        wheelhouse, checkpoint, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv", str(package_wheel(wheelhouse)), wheelhouse)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    installed = run(bin_dir / "python", "-m", "pip", "list", "--format=json").stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "pyspark-client" in names  # what the Spark provider itself pulls in
    assert "pyspark" not in names and not (site / "pyspark" / "jars").exists()  # no full pyspark, no jars
    assert not (site / "crc32c").exists() and "google-crc32c" in names
    assert (site / "airflow_savepoints" / "plugins" / "static" / "console.js").is_file()  # the console's script: package data

    env = user_env(bin_dir, tmp_path / "airflow")
    work = tmp_path / "work"  # not the checkout: nothing of it is importable from here
    work.mkdir()
    installed_dags = run("airflow-savepoints", "dags", "install", tmp_path / "airflow" / "dags", "--json", env=env, cwd=work)
    files = sorted(Path(f).name for f in json.loads(installed_dags.stdout)["files"])
    assert files == sorted(p.name for p in (ROOT / "dags").iterdir() if p.suffix in (".py", ".yaml"))

    providers = run("airflow", "providers", "list", "--output", "json", env=env, cwd=work, timeout=300)
    listed = {p["package_name"]: p for p in json.loads(providers.stdout)}
    assert listed["airflow-savepoints"]["version"] == version("airflow-savepoints")

    bag = run("python", "-c", "import json; from airflow.dag_processing.dagbag import DagBag; "
                              "bag = DagBag(); print(json.dumps([sorted(bag.dag_ids), bag.import_errors]))",
              env=env, cwd=work, timeout=300)
    dag_ids, errors = json.loads(bag.stdout.strip().splitlines()[-1])
    assert errors == {}
    assert {"periodic_savepoints", "restore_from_savepoint", "stop_job_with_savepoint"} <= set(dag_ids)

    taken = run("airflow-savepoints", "trigger", checkpoint, "--job", "orders", "--dir", tmp_path / "sp", "--json",
                env=env, cwd=work)
    info = json.loads(taken.stdout)
    assert info["batch_id"] == 5 and Path(info["pointer"]).parent == tmp_path / "sp" / "orders"
    verified = run("airflow-savepoints", "verify", info["pointer"], "--json", env=env, cwd=work)
    assert json.loads(verified.stdout)["ok"] is True

    demo = run("airflow-savepoints", "demo", "--workdir", tmp_path / "demo", env=env, cwd=work, check=False)
    assert demo.returncode == 1 and "pip install 'airflow-savepoints[spark]'" in demo.stderr


def test_with_spark_the_demo_runs_to_its_end_from_the_wheel_alone(wheelhouse, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv", f"{package_wheel(wheelhouse)}[spark]", wheelhouse)
    env = user_env(bin_dir, tmp_path / "home")
    work = tmp_path / "work"
    work.mkdir()
    demo = run("airflow-savepoints", "demo", "--workdir", work / "demo-run", "--rounds", "1", "--interval", "1",
               env=env, cwd=work, timeout=600, check=False)
    assert demo.returncode == 0, f"{demo.stdout[-4000:]}\n{demo.stderr[-4000:]}"
    assert "every event exactly once across the stop and the restore" in demo.stdout
    assert "site-packages/airflow_savepoints/example_dags" in demo.stdout.replace("\n", "")  # the wheel's DAGs
