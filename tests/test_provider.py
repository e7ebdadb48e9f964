"""Provider registration and the savepoints connection, against the installed Airflow 3.3."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_savepoints.errors import InvalidInputError, NoSavepointDirError


def airflow_cli(*args: str) -> str:
    airflow = Path(sys.executable).parent / "airflow"
    proc = subprocess.run([str(airflow), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_airflow_lists_the_provider_its_hook_and_config():
    assert "airflow-savepoints" in airflow_cli("providers", "list")
    hooks = airflow_cli("providers", "hooks")
    assert "savepoints" in hooks and "SavepointStorageHook" in hooks
    assert airflow_cli("config", "get-value", "savepoints", "max_periodic_savepoints").strip() == "10"


def test_the_savepoints_asset_scheme_is_registered():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "x-savepoints" in manager.asset_uri_handlers
    assert manager.asset_factories["x-savepoints"]("orders").uri == "x-savepoints://orders"


def test_connection_form_fields_are_declared():
    from airflow.providers_manager import ProvidersManager

    behaviour = ProvidersManager().field_behaviours["savepoints"]
    assert "port" in behaviour["hidden_fields"]
    assert behaviour["relabeling"]["host"].startswith("Savepoint directory")


def test_hook_builds_the_store_from_the_connection_and_masks_secrets(monkeypatch, tmp_path):
    """The extra's `account_key` (adlfs) and `credential` (gcsfs/adlfs) are secrets Airflow does not know:
    its masker leaves them in the log once the connection is read; the hook's own masking hides them."""
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    from airflow_savepoints.hooks.savepoint import SavepointStorageHook

    unique = uuid.uuid4().hex[:12]  # the masker is process-wide: values no other test ever masked
    account_key, credential, endpoint = f"acct-{unique}", f"cred-{unique}", f"http://127.0.0.1:1/{unique}"
    conn = {"conn_type": "savepoints", "host": str(tmp_path / "sp"), "login": "AKIAEXAMPLE", "password": "s3cr3t-value",
            "extra": json.dumps({"endpoint_url": endpoint, "account_key": account_key, "credential": credential})}
    monkeypatch.setenv("AIRFLOW_CONN_SP_TEST", json.dumps(conn))
    hook = SavepointStorageHook("sp_test")
    line = f"options {account_key} {credential} at {endpoint}"
    assert hook.connection().extra_dejson["account_key"] == account_key
    assert str(redact(line)) == line  # read by Airflow: these two still in the clear
    options = hook.storage_options()
    assert options == {"endpoint_url": endpoint, "account_key": account_key, "credential": credential,
                       "key": "AKIAEXAMPLE", "secret": "s3cr3t-value"}
    assert hook.savepoint_dir() == str(tmp_path / "sp")
    assert hook.savepoint_dir("/explicit") == "/explicit"
    masked = str(redact(line))
    assert account_key not in masked and credential not in masked
    assert endpoint in masked  # not a secret: left as it is


def test_hook_without_connection_uses_configuration(monkeypatch, tmp_path):
    from airflow_savepoints.hooks.savepoint import SavepointStorageHook

    monkeypatch.delenv("AIRFLOW_CONN_SAVEPOINTS_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR", str(tmp_path / "configured"))
    assert SavepointStorageHook().get_store().url == str(tmp_path / "configured")
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR", "")
    with pytest.raises(NoSavepointDirError):
        SavepointStorageHook().get_store()
    monkeypatch.setenv("AIRFLOW_CONN_BROKEN", json.dumps({"conn_type": "savepoints", "host": "/x", "extra": "not json"}))
    with pytest.raises(InvalidInputError, match="not JSON"):
        SavepointStorageHook("broken").storage_options()


def test_jobs_yaml_loads_and_rejects_bad_jobs(tmp_path, monkeypatch):
    from airflow_savepoints.jobs import load_jobs
    from tests.conftest import ROOT

    monkeypatch.setenv("SAVEPOINTS_DEMO_HOME", "/data/demo")
    jobs = load_jobs(ROOT / "dags" / "jobs.yaml")
    assert jobs["demo-dedup"].checkpoint == "/data/demo/checkpoint"
    assert jobs["demo-dedup"].retention.max_periodic == 3 and jobs["demo-dedup"].sink.kind == "file"
    bad = tmp_path / "jobs.yaml"
    for text, words in [("jobs: {}", "no 'jobs:' list"),
                        ("jobs:\n  - {name: 'a/b', application: x, checkpoint: /c}", "name"),
                        ("jobs:\n  - {name: a, application: x, checkpoint: /c, retention: {max_periodic: -1}}",
                         "max_periodic"),
                        ("jobs:\n  - {name: a, application: x, checkpoint: /c}\n  - {name: a, application: y, checkpoint: /d}",
                         "appears twice"),
                        ("jobs: [", "cannot read")]:
        bad.write_text(text)
        with pytest.raises(InvalidInputError, match=words):
            load_jobs(bad)
