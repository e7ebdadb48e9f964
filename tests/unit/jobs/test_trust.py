"""Per-run secrets (jobs/description/trust.py): the host key, run tokens, channel secrets, seals."""

from __future__ import annotations

import os
import stat
import subprocess
import time

import psutil

from airflow_savepoints.jobs.description import trust


def test_the_host_key_is_made_once_0600_and_binds_job_and_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__RUN_KEY", raising=False)
    token = trust.run_token("orders", "r1")
    assert stat.S_IMODE(os.stat(trust.key_path()).st_mode) == 0o600
    assert sorted(p.name for p in trust.key_path().parent.iterdir()) == ["run.key"]
    assert trust.run_token("orders", "r1") == token
    assert len({token, trust.run_token("orders", "r2"), trust.run_token("payments", "r1")}) == 3
    secret = trust.channel_secret("orders", "r1")
    monkeypatch.setenv("AIRFLOW__SAVEPOINTS__RUN_KEY", "a-configured-key-shared-by-hosts")
    assert trust.channel_secret("orders", "r1") not in (secret, token)  # the configured key wins
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "another-host"))
    assert trust.run_token("orders", "r1") != token  # another host's key: no token of this one


def test_a_process_holds_its_token_only_when_started_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    token = trust.run_token("orders", "r1")
    with_token = subprocess.Popen(["sleep", "30"], env={**os.environ, trust.RUN_TOKEN_ENV: token})
    without = subprocess.Popen(["sleep", "30"])
    for process in (with_token, without):  # until each has exec'd (before that, /proc shows the parent's environment)
        while psutil.Process(process.pid).cmdline() != ["sleep", "30"]:
            time.sleep(0.01)
    try:
        assert trust.process_holds_token(with_token.pid, token)
        assert not trust.process_holds_token(without.pid, token)
        assert not trust.process_holds_token(with_token.pid, trust.run_token("orders", "r2"))
    finally:
        for process in (with_token, without):
            process.kill()
            process.wait()


def test_a_seal_holds_only_for_its_content_and_secret():
    secret = trust.new_secret()
    sealed = trust.seal({"state": "running", "last_committed_batch": 5}, secret)
    assert trust.sealed(sealed, secret)
    assert not trust.sealed({**sealed, "last_committed_batch": 6}, secret)
    assert not trust.sealed(sealed, trust.new_secret())
    assert not trust.sealed({"state": "running"}, secret) and not trust.sealed(None, secret)


def test_a_cluster_mode_driver_seals_with_the_secret_its_conf_gives(tmp_path, monkeypatch):
    """A driver on another host (its own key file) seals its heartbeats with the secret the launcher
    put in its conf (``run_conf(..., cluster=True)``), so the launcher's host believes them; without
    it, they are not believed. The recorded command shows the secret as ``***``."""
    from airflow_savepoints.core.redaction import redact_command
    from airflow_savepoints.jobs.description.channel import RUN_SECRET_CONF, JobControl, run_conf
    from airflow_savepoints.jobs.driver.control import RunHandle
    from airflow_savepoints.storage import Store

    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__RUN_KEY", raising=False)
    monkeypatch.delenv(trust.RUN_SECRET_ENV, raising=False)
    job_folder = Store(str(tmp_path / "savepoints" / "orders"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "launcher"))
    conf = run_conf(job_folder.url, run_id="r1", cluster=True)
    assert conf[RUN_SECRET_CONF] == trust.channel_secret("orders", "r1")
    command = ["spark-submit", *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")), "app.py"]
    assert conf[RUN_SECRET_CONF] not in " ".join(redact_command(command, []))
    for given, believed in ((conf, True), ({k: v for k, v in conf.items() if k != RUN_SECRET_CONF}, False)):
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "cluster-node"))  # the driver's host: another key
        RunHandle.from_conf(given.get).control.beat(state="running", timeout_s=30)
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "launcher"))
        assert (JobControl(job_folder.child("_control").child("r1")).heartbeat() is not None) is believed


def test_a_stop_request_counts_only_when_sealed_with_the_runs_secret(tmp_path, monkeypatch):
    """Issue 40: a writer of the savepoint folder who drops a ``stop-request.json`` into a run's control
    folder neither stops the run (its driver reads it through the same JobControl) nor makes ``job
    status`` say stopping; a request from a holder of the run key does."""
    import json

    from airflow_savepoints.core.names import STOP_REQUEST_FILE
    from airflow_savepoints.jobs.description.channel import JobControl
    from airflow_savepoints.storage import Store

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "host"))
    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__RUN_KEY", raising=False)
    monkeypatch.delenv(trust.RUN_SECRET_ENV, raising=False)
    folder = Store(str(tmp_path / "savepoints" / "orders" / "_control" / "r1"))
    folder.write_bytes_atomic(STOP_REQUEST_FILE, json.dumps({"request_id": "forged", "requested_at": "now"}).encode())
    driver_side = JobControl(folder)
    assert driver_side.stop_requested() is None
    assert any("not sealed" in w and STOP_REQUEST_FILE in w for w in driver_side.warnings), driver_side.warnings
    JobControl(folder).request_stop("stop-1")  # Airflow's side, holding the run key
    assert JobControl(folder).stop_requested()["request_id"] == "stop-1"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "another-host"))  # another key: not believed there
    assert JobControl(folder).stop_requested() is None
