"""SavepointStorageHook: a ``savepoints`` connection (real, in the SQLite metadata database) turned into a Store."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_savepoints.errors import InvalidInputError, NoSavepointDirError
from airflow_savepoints.hooks.savepoint import SavepointStorageHook
from tests.support.connections import bucket_reached_only_with, stored_connection

KEY, SECRET = "AKIAUNITHOOKLOGIN01", "unit-hook-secret-Zq7"


@pytest.mark.s3
def test_the_store_of_an_s3_connection_reaches_its_bucket_with_the_connections_keys(airflow_db, s3_endpoint,
                                                                                     monkeypatch):
    bucket = bucket_reached_only_with(monkeypatch, s3_endpoint, KEY, SECRET)
    conn_id = stored_connection(monkeypatch, host=f"s3://{bucket}/savepoints", login=KEY, password=SECRET,
                                extra={"client_kwargs": {"endpoint_url": s3_endpoint}})
    store = SavepointStorageHook(conn_id).get_store()
    assert (store.url, store.protocol) == (f"s3://{bucket}/savepoints", "s3")
    assert store.storage_options == {"client_kwargs": {"endpoint_url": s3_endpoint}, "key": KEY, "secret": SECRET}
    store.child("orders").write_bytes_atomic("probe", b"written through the connection")
    assert store.listdir() == ["orders"]
    assert SavepointStorageHook(conn_id).test_connection() == (True, f"listed s3://{bucket}/savepoints")


def test_options_nested_under_storage_options_and_explicit_keys_win_over_login(airflow_db, monkeypatch, tmp_path):
    conn_id = stored_connection(monkeypatch, host=str(tmp_path), login="login-key", password="password-secret",
                                extra={"storage_options": {"key": "extra-key", "anon": False}})
    assert SavepointStorageHook(conn_id).storage_options() == {"key": "extra-key", "anon": False,
                                                               "secret": "password-secret"}
    conn_id = stored_connection(monkeypatch, host=str(tmp_path), extra={"storage_options": None, "anon": True})
    assert SavepointStorageHook(conn_id).storage_options() == {"anon": True}


def test_the_savepoint_directory_is_the_override_then_the_host_then_configuration(airflow_db, monkeypatch, tmp_path):
    with_host = SavepointStorageHook(stored_connection(monkeypatch, host=str(tmp_path / "host")))
    assert with_host.savepoint_dir(str(tmp_path / "given")) == str(tmp_path / "given")
    assert with_host.savepoint_dir() == str(tmp_path / "host")
    assert with_host.get_store().url.endswith("/host")
    without_host = SavepointStorageHook(stored_connection(monkeypatch))
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR", f"  {tmp_path / 'configured'} ")
    assert without_host.savepoint_dir() == str(tmp_path / "configured")
    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR")
    with pytest.raises(NoSavepointDirError, match=f"connection '{without_host.savepoints_conn_id}'"):
        without_host.savepoint_dir()


def test_a_missing_default_connection_means_configuration_but_a_missing_named_one_fails(airflow_db, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SAVEPOINTS_DEFAULT", raising=False)
    assert SavepointStorageHook().storage_options() == {}
    assert SavepointStorageHook(None).storage_options() == {}
    with pytest.raises(AirflowNotFoundException):
        SavepointStorageHook("savepoints_no_such_connection").storage_options()


def test_an_extra_that_is_not_a_json_object_is_a_clear_error(airflow_db, monkeypatch, tmp_path):
    """The metadata database refuses an extra that is not a JSON object; a connection from the environment
    (or a secrets backend) can still carry one."""
    for conn_id, extra, problem in (("savepoints_unit_text", "{not json", "is not JSON"),
                                    ("savepoints_unit_list", '["a", "list"]', "is not a JSON object of storage options")):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                           json.dumps({"conn_type": "savepoints", "host": str(tmp_path), "extra": extra}))
        with pytest.raises(InvalidInputError, match=f"extra field of connection '{conn_id}' {problem}"):
            SavepointStorageHook(conn_id).storage_options()
    conn_id = stored_connection(monkeypatch, host=str(tmp_path), extra={"storage_options": "not a mapping"})
    with pytest.raises(InvalidInputError, match=f"connection '{conn_id}' is not a JSON object of storage options"):
        SavepointStorageHook(conn_id).storage_options()


def test_test_connection_lists_the_directory_or_says_why_not(airflow_db, monkeypatch, tmp_path):
    (tmp_path / "sp" / "orders").mkdir(parents=True)
    ok, message = SavepointStorageHook(stored_connection(monkeypatch, host=str(tmp_path / "sp"))).test_connection()
    assert ok and message.startswith("listed ") and message.endswith("/sp")
    ok, message = SavepointStorageHook(stored_connection(
        monkeypatch, host=str(tmp_path), extra=json.dumps({"storage_options": "not a mapping"}))).test_connection()
    assert not ok and message
