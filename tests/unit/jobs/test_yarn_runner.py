"""The YARN runner's configuration, without a cluster (tests/test_yarn.py runs it on a real ResourceManager):
where it finds the ResourceManager, what job start refuses, what a kill does without an address, the
application id spark-submit logs."""

from __future__ import annotations

import pytest

from airflow_savepoints.errors import YarnNotConfiguredError
from airflow_savepoints.jobs.description.record import RunTarget
from airflow_savepoints.jobs.launch.launcher import application_id_from_log
from airflow_savepoints.jobs.launch.runners import YarnRunner, check_yarn_start, resource_manager_url, runner_for


def site(folder, **properties: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    rows = "".join(f"<property><name>{k}</name><value>{v}</value></property>" for k, v in properties.items())
    (folder / "yarn-site.xml").write_text(f"<?xml version='1.0'?><configuration>{rows}</configuration>")
    return str(folder)


@pytest.fixture
def no_conf(monkeypatch):
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)


def test_the_resourcemanager_is_master_ui_else_yarn_sites_webapp_address_else_its_hostname(tmp_path, monkeypatch,
                                                                                            no_conf):
    assert resource_manager_url() is None
    monkeypatch.setenv("HADOOP_CONF_DIR", site(tmp_path / "hadoop", **{"yarn.resourcemanager.hostname": "rm1"}))
    assert resource_manager_url() == "http://rm1:8088"
    monkeypatch.setenv("YARN_CONF_DIR", site(tmp_path / "yarn", **{"yarn.resourcemanager.webapp.address": "rm2:9999"}))
    assert resource_manager_url() == "http://rm2:9999"  # YARN_CONF_DIR first, as spark-submit reads it
    assert resource_manager_url("https://rm3:8090/") == "https://rm3:8090"  # the job's master_ui wins
    assert isinstance(runner_for("yarn"), YarnRunner) and runner_for("yarn").name == "yarn"


def test_job_start_refuses_yarn_without_a_yarn_site_or_a_resourcemanager_address(tmp_path, monkeypatch, no_conf):
    with pytest.raises(YarnNotConfiguredError) as refused:
        check_yarn_start(None)
    assert refused.value.code == "yarn_not_configured" and "HADOOP_CONF_DIR" in refused.value.hint
    monkeypatch.setenv("HADOOP_CONF_DIR", site(tmp_path / "empty"))
    with pytest.raises(YarnNotConfiguredError, match="yarn.resourcemanager.webapp.address"):
        check_yarn_start(None)
    check_yarn_start("http://rm:8088")  # the job's master_ui suffices
    monkeypatch.setenv("HADOOP_CONF_DIR", site(tmp_path / "full", **{"yarn.resourcemanager.hostname": "rm"}))
    check_yarn_start(None)


def test_without_an_address_or_an_application_id_nothing_is_killed(no_conf):
    runner = YarnRunner()
    target = RunTarget(job="orders", application_id="application_1_0001", master="yarn")
    outcome = runner.kill(target, grace=0)
    assert outcome["killed"] is False and "not configured" in outcome["detail"]
    assert runner.status(target).state == "unknown"
    outcome = runner.kill(RunTarget(job="orders", master="yarn", master_ui="http://127.0.0.1:1"), grace=0)
    assert outcome["killed"] is False and "application id is not known" in outcome["detail"]


def test_the_application_id_spark_submit_logs_on_yarn_and_a_standalone_drivers(tmp_path):
    log = tmp_path / "orders-20261127T205900.log"  # named as the launcher names a run's log
    log.write_text("26/11/27 20:59:00 INFO Client: Submitting application application_1795813087351_0001 to "
                   "ResourceManager\n26/11/27 20:59:01 INFO YarnClientImpl: Submitted application "
                   "application_1795813087351_0001\n")
    assert application_id_from_log(str(log)) == "application_1795813087351_0001"
    log.write_text("INFO StandaloneSchedulerBackend: Connected to Spark cluster with app ID app-20261127205900-0003\n")
    assert application_id_from_log(str(log)) == "app-20261127205900-0003"
