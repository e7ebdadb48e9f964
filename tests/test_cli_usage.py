"""The CLI as a finished tool: --version, JSON for usage errors, a missing directory, help texts, the
progress bar on a terminal, and storage reached through the same Airflow connection as the operators."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from tests.conftest import ROOT

runner = CliRunner()
SCRIPT = Path(sys.executable).parent / "airflow-savepoints"


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"airflow-savepoints {version('airflow-savepoints')}"
    result = runner.invoke(app, ["version", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout) == {"version": version("airflow-savepoints")}
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.stdout.strip() == version("airflow-savepoints")


def test_every_command_takes_json():
    """demo takes --json too: a bad value is then reported as the value's usage error, not --json's."""
    result = runner.invoke(app, ["demo", "--rounds", "0", "--json"])
    error = json.loads(result.stdout)["error"]
    assert result.exit_code == 2 and error["code"] == "usage_error" and "--rounds" in error["message"], error
    from typer.main import get_command

    group = get_command(app)
    commands = {**group.commands, **{f"dags {n}": c for n, c in group.commands["dags"].commands.items()},
                **{f"job {n}": c for n, c in group.commands["job"].commands.items()}}
    without = [name for name, command in commands.items() if name not in ("dags", "job")
               and not any("--json" in p.opts for p in command.params)]
    assert not without, without


USAGE_ERRORS = [
    (["list", "--json"], "Missing option '--job'"),
    (["trigger", "/x", "--job", "j", "--max-attempts", "0", "--json"], "--max-attempts"),
    (["show", "--json"], "Missing argument 'pointer'"),
    (["list", "--job", "j", "--colour", "--json"], "No such option: --colour"),
    (["bogus", "--json"], "No such command 'bogus'"),
    (["trigger", "/x", "--job", "j", "--type", "weekly", "--json"], "weekly"),
]


@pytest.mark.parametrize("args,words", USAGE_ERRORS, ids=[" ".join(a[:2]) for a, _ in USAGE_ERRORS])
def test_usage_errors_answer_json_with_exit_2(args, words):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "usage_error" and words in error["message"] and error["hint"].endswith("--help")
    assert not result.stderr


def test_usage_error_without_json_is_text_on_stderr():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 2 and "Missing option '--job'" in result.stderr and not result.stdout


@pytest.mark.parametrize("command", ["list", "retain", "catalog"])
def test_a_missing_directory_is_an_error_not_an_empty_list(command, tmp_path):
    missing = tmp_path / "no-such-dir"
    result = runner.invoke(app, [command, "--job", "j", "--dir", str(missing), "--json"])
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "savepoint_dir_not_found" and str(missing) in error["message"]
    assert not missing.exists()
    text = runner.invoke(app, [command, "--job", "j", "--dir", str(missing)])
    assert text.exit_code == 1 and "does not exist" in " ".join(text.stderr.split())


def test_every_option_has_help_and_config_sections_show_literally():
    from typer.main import get_command

    group = get_command(app)
    commands = dict(group.commands)
    commands.update({f"dags {n}": c for n, c in commands.pop("dags").commands.items()})
    for name, command in commands.items():
        assert command.help, name
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, f"{name} {param.opts}"
    result = runner.invoke(app, ["retain", "--help"], terminal_width=200)
    assert "[savepoints] max_periodic_savepoints" in result.stdout


def run_on_a_terminal(*args: str, cwd: Path) -> tuple[int, str]:
    """Run the console script with a pseudo-terminal as its stdout and stderr; return its exit code and output."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    proc = subprocess.Popen([str(SCRIPT), *args], stdin=terminal, stdout=terminal, stderr=terminal, cwd=cwd, env=env)
    os.close(terminal)
    chunks = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_and_not_with_quiet_or_json(checkpoint, tmp_path):
    no_conn = ("--conn-id", "")  # no connection lookup: the commands start without Airflow
    code, output = run_on_a_terminal("trigger", str(checkpoint), "--job", "j", "--dir", str(tmp_path / "sp"), *no_conn,
                                     cwd=ROOT)
    assert code == 0, output
    assert "savepoint" in output and "━" in output and "files" in output and "savepoint completed" in output
    code, output = run_on_a_terminal("trigger", str(checkpoint), "--job", "j", "--dir", str(tmp_path / "sp"), *no_conn,
                                     "--quiet", cwd=ROOT)
    assert code == 0 and "━" not in output and "savepoint completed" in output
    pointer = str(next((tmp_path / "sp" / "j").glob("savepoint-*")))
    code, output = run_on_a_terminal("verify", pointer, *no_conn, "--json", cwd=ROOT)
    assert code == 0 and "━" not in output and json.loads(output)["ok"] is True
    code, output = run_on_a_terminal("verify", pointer, *no_conn, cwd=ROOT)
    assert code == 0 and "━" in output and "ok" in output


@pytest.mark.s3
def test_cli_with_conn_id_lands_where_the_operator_with_that_connection_puts_it(s3, s3_endpoint, checkpoint,
                                                                                monkeypatch):
    import fsspec

    from airflow_savepoints.operators.savepoint import TriggerSavepointOperator

    # only the connection knows the endpoint and the keys: no fsspec configuration, no AWS variables
    for var in ("FSSPEC_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    fsspec.config.conf.pop("s3", None)
    fsspec.get_filesystem_class("s3").clear_instance_cache()
    conn = {"conn_type": "savepoints", "host": f"s3://{s3}/team-savepoints", "login": "testing",
            "password": "testing", "extra": json.dumps({"endpoint_url": s3_endpoint})}
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_S3", json.dumps(conn))

    result = runner.invoke(app, ["trigger", str(checkpoint), "--job", "orders", "--conn-id", "team_s3", "--json"])
    assert result.exit_code == 0, result.output
    by_cli = json.loads(result.stdout)
    by_operator = TriggerSavepointOperator(task_id="t", job="orders", checkpoint=str(checkpoint), request_id="op-1",
                                           savepoints_conn_id="team_s3", savepoint_type="manual").execute({})
    folder = f"s3://{s3}/team-savepoints/orders"
    assert by_cli["pointer"].rsplit("/", 1)[0] == by_operator["pointer"].rsplit("/", 1)[0] == folder

    monkeypatch.setenv("AIRFLOW_CONN_SAVEPOINTS_DEFAULT", json.dumps(conn))  # the default: no --conn-id needed
    listed = runner.invoke(app, ["list", "--job", "orders", "--json"])
    assert listed.exit_code == 0, listed.output
    assert sorted(s["pointer"] for s in json.loads(listed.stdout)["savepoints"]) == sorted(
        [by_cli["pointer"], by_operator["pointer"]])
    shown = runner.invoke(app, ["verify", by_cli["pointer"], "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["ok"] is True

    missing = runner.invoke(app, ["list", "--job", "orders", "--conn-id", "nope", "--json"])
    assert missing.exit_code == 1 and "'nope' is not defined" in json.loads(missing.stdout)["error"]["message"]


@pytest.mark.usefixtures("without_cloud_backends")
@pytest.mark.parametrize("url,extra", [("gs://bucket/sp", "gcs"), ("abfs://container/sp", "azure")])
def test_a_missing_backend_names_the_package_extra(url, extra):
    result = runner.invoke(app, ["list", "--job", "j", "--dir", url, "--json"])
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "missing_backend" and f"pip install 'airflow-savepoints[{extra}]'" in error["hint"]


@pytest.mark.parametrize("args", [["list", "--job", "j", "--dir", "abfs://c/x"], ["show", "abfs://c/x/j/savepoint-abc"]],
                         ids=["list", "show"])
def test_azure_without_an_account_or_credentials_is_missing_credentials(args, monkeypatch):
    import fsspec

    for var in [v for v in os.environ if v.startswith("AZURE_STORAGE_")]:
        monkeypatch.delenv(var)
    monkeypatch.setitem(fsspec.config.conf, "abfs", {})
    fsspec.get_filesystem_class("abfs").clear_instance_cache()
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "missing_credentials" and "abfs://c/x" in error["message"], error
    assert "AZURE_STORAGE_ACCOUNT_NAME" in error["hint"]


def test_output_stays_one_json_document_whatever_airflow_can_do_here(tmp_path):
    """Without a connection named, Airflow is not asked (even where it could not look connections up:
    a task's subprocess without a metadata DB URL); a connection asked for by name then fails clearly."""
    (tmp_path / "sp" / "job").mkdir(parents=True)
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow-home")}
    retained = subprocess.run([str(SCRIPT), "retain", "--job", "job", "--dir", str(tmp_path / "sp"), "--json"],
                              capture_output=True, text=True, env=env, timeout=120)
    assert retained.returncode == 0 and json.loads(retained.stdout)["disposed"] == [], retained
    broken = {**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "not a url"}
    listed = subprocess.run([str(SCRIPT), "list", "--job", "job", "--dir", str(tmp_path / "sp"), "--json"],
                            capture_output=True, text=True, env=broken, timeout=120)
    assert listed.returncode == 0 and json.loads(listed.stdout)["savepoints"] == [], listed
    named = subprocess.run([str(SCRIPT), "list", "--job", "job", "--dir", str(tmp_path / "sp"), "--json",
                            "--conn-id", "ops_store"], capture_output=True, text=True, env=broken, timeout=120)
    error = json.loads(named.stdout)["error"]
    assert named.returncode == 1 and error["code"] == "invalid_input" and "ops_store" in error["message"], named


def test_an_unanticipated_failure_is_a_coded_error_never_a_traceback(tmp_path):
    """A failure no typed error covers (here: a restore target under /proc, which nobody can create)
    still answers one JSON error with exit 1; the traceback only on request."""
    checkpoint = ROOT / "tests" / "data" / "spark35" / "hdfs"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow")}
    taken = subprocess.run([str(SCRIPT), "trigger", str(checkpoint), "--job", "j", "--dir", str(tmp_path / "sp"),
                            "--conn-id", "", "--json"], capture_output=True, text=True, env=env, timeout=120)
    pointer = json.loads(taken.stdout)["pointer"]
    restore = [str(SCRIPT), "restore", pointer, "--to", "/proc/1/no-such/checkpoint", "--conn-id", "", "--json"]
    result = subprocess.run(restore, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result
    error = json.loads(result.stdout)["error"]
    assert error["code"] and "/proc/1/no-such" in error["message"] and error["hint"], error
    assert "Traceback" not in result.stdout + result.stderr
    debug = subprocess.run(restore, capture_output=True, text=True, env={**env, "AIRFLOW_SAVEPOINTS_DEBUG": "1"},
                           timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and json.loads(debug.stdout)["error"] == error


def clean_env(airflow_home: Path, **extra: str) -> dict[str, str]:
    """This environment without any connection or [savepoints] option, with a fresh AIRFLOW_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SAVEPOINTS__", "AIRFLOW_CONFIG"))}
    return {**env, "AIRFLOW_HOME": str(airflow_home), **extra}


MODULES_AT_EXIT = ("import atexit, json, sys; listing = sys.argv.pop(1); "
                   "atexit.register(lambda: open(listing, 'w').write(json.dumps(sorted(sys.modules)))); "
                   "from airflow_savepoints.cli.main import main; main()")


def run_cli(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run a command in a fresh interpreter; also return the modules it had imported when it exited."""
    with tempfile.TemporaryDirectory() as folder:
        listing = Path(folder) / "modules.json"
        proc = subprocess.run([sys.executable, "-c", MODULES_AT_EXIT, str(listing), *args],
                              capture_output=True, text=True, env=env, timeout=120)
        return proc, set(json.loads(listing.read_text()))


def test_a_command_without_a_connection_named_neither_imports_airflow_nor_creates_a_database(tmp_path):
    home, sp = tmp_path / "airflow-home", tmp_path / "sp"
    env = clean_env(home)
    checkpoint = ROOT / "tests" / "data" / "spark35" / "hdfs"
    taken, imported = run_cli("trigger", str(checkpoint), "--job", "j", "--dir", str(sp), "--json", env=env)
    assert taken.returncode == 0, taken.stdout + taken.stderr[-2000:]
    assert "airflow_savepoints.core.savepoint" in imported  # the listing is read right
    assert not {m for m in imported if m == "airflow" or m.startswith("airflow.")}
    listed, imported = run_cli("list", "--job", "j", "--dir", str(sp), "--json", env=env)
    assert [s["pointer"] for s in json.loads(listed.stdout)["savepoints"]] == [json.loads(taken.stdout)["pointer"]]
    assert "airflow" not in imported and "airflow_savepoints.core.copier" not in imported  # list copies nothing
    assert not home.exists()  # no airflow.db, no logs folder: Airflow never started


def test_a_connection_named_by_the_environment_or_the_configuration_is_used(tmp_path):
    home, sp = tmp_path / "airflow-home", tmp_path / "sp"
    (sp / "j").mkdir(parents=True)
    conn = json.dumps({"conn_type": "savepoints", "host": str(sp)})
    # AIRFLOW_CONN_SAVEPOINTS_DEFAULT names the default connection: no --dir, no --conn-id needed
    listed, imported = run_cli("list", "--job", "j", "--json", env=clean_env(home, AIRFLOW_CONN_SAVEPOINTS_DEFAULT=conn))
    assert listed.returncode == 0, listed.stdout + listed.stderr[-2000:]
    assert json.loads(listed.stdout)["savepoint_dir"] == str(sp)
    assert "airflow_savepoints.hooks.savepoint" in imported
    # [savepoints] conn_id names another (here from the environment's AIRFLOW__SAVEPOINTS__CONN_ID)
    named = clean_env(home, AIRFLOW__SAVEPOINTS__CONN_ID="team_store", AIRFLOW_CONN_TEAM_STORE=conn)
    listed, _ = run_cli("list", "--job", "j", "--json", env=named)
    assert listed.returncode == 0 and json.loads(listed.stdout)["savepoint_dir"] == str(sp), listed.stdout
    # a named connection that is defined nowhere: a clear error, and still no database created to look for it
    missing, _ = run_cli("list", "--job", "j", "--json", env=clean_env(home, AIRFLOW__SAVEPOINTS__CONN_ID="nope"))
    error = json.loads(missing.stdout)["error"]
    assert missing.returncode == 1 and error["code"] == "invalid_input" and "'nope' is not defined" in error["message"]
    assert not (home / "airflow.db").exists()
