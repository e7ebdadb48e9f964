"""Security: nothing reaches outside the savepoint root, nothing is deleted through a link, no secret leaks.

* Job names: every entry point refuses names that are not one plain folder name (a matrix of
  traversal attempts x entry points, and a hypothesis property over arbitrary strings).
* Pointers: dispose refuses anything that is not a savepoint with a valid ``_metadata`` at
  ``<root>/<job>/savepoint-…`` (``..``, look-alike roots, the root itself, job folders, files).
* Symbolic links: a savepoint folder or job folder that is a link is never disposed or retained
  through (the files it points at stay); links inside a savepoint are removed, not followed; the
  root itself may be a link.
* Retention deletes nothing but ``<root>/<job>/savepoint-*`` folders (and rewrites the catalog).
* Credentials of a ``savepoints`` connection (login, password, extra) appear in no task log,
  XCom, ``_metadata``, catalog, or CLI output (the plugin's API is checked on a real API server by
  tests/test_plugin.py, whose every response is asserted free of the connection's secrets).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core import dispose_savepoint, list_savepoints, take_savepoint
from airflow_savepoints.core.models import validate_job_name
from airflow_savepoints.core.retention import RetentionPolicy, plan_retention, retain
from airflow_savepoints.errors import InvalidJobNameError, SavepointError
from airflow_savepoints.storage import Store
from tests.conftest import tree_snapshot
from tests.support.synthetic import write_checkpoint

runner = CliRunner()


def cli(*args: str) -> tuple[int, dict, str]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}, result.output


def operator(cls_name: str, **kwargs):
    import airflow_savepoints.operators.retention as retention_ops
    import airflow_savepoints.operators.savepoint as savepoint_ops

    cls = getattr(savepoint_ops, cls_name, None) or getattr(retention_ops, cls_name)
    return cls(task_id="security", **kwargs)


@pytest.fixture
def site(tmp_path):
    """A checkpoint, a savepoint root with a savepoint of ``orders``, and precious files outside the root."""
    ckpt = write_checkpoint(tmp_path / "checkpoint")
    root = tmp_path / "savepoints"
    pointer = Path(take_savepoint(str(ckpt), "orders", savepoint_dir=str(root)).pointer)
    outside = tmp_path / "outside"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "data.bin").write_bytes(b"do not delete")
    # a complete savepoint of the same job in ANOTHER root: a target for links and look-alike pointers
    foreign = Path(take_savepoint(str(ckpt), "orders", savepoint_dir=str(outside / "other-root")).pointer)
    return {"tmp": tmp_path, "ckpt": ckpt, "root": root, "pointer": pointer, "outside": outside, "foreign": foreign}


# ---- job names -----------------------------------------------------------------------------------------

TRAVERSAL_NAMES = ["..", "../outside", "a/../../outside", "/etc", "/tmp/x", "a/b", ".", "", "orders/..", "..orders",
                   "orders\n", "orders\x00", ".hidden", "-rf", "a\\..\\b", "~root", "j" * 129, "ord ers", "%2e%2e"]


def _entry_points(site):
    root = str(site["root"])
    ckpt = str(site["ckpt"])
    return {
        "take_savepoint": lambda job: take_savepoint(ckpt, job, savepoint_dir=root),
        "list_savepoints": lambda job: list_savepoints(Store(root), job),
        "retain": lambda job: retain(Store(root), job, RetentionPolicy(max_periodic=0, max_age_seconds=0)),
        "plan_retention": lambda job: plan_retention(Store(root), job, RetentionPolicy()),
        "cli trigger": lambda job: cli("trigger", ckpt, "--job", job, "--dir", root),
        "cli list": lambda job: cli("list", "--job", job, "--dir", root),
        "cli status": lambda job: cli("status", "--job", job, "--dir", root),
        "cli catalog --rebuild": lambda job: cli("catalog", "--job", job, "--dir", root, "--rebuild"),
        "cli retain": lambda job: cli("retain", "--job", job, "--dir", root, "--max-periodic", "0"),
        "TriggerSavepointOperator": lambda job: operator("TriggerSavepointOperator", job=job, checkpoint=ckpt,
                                                         savepoint_dir=root).execute({}),
        "ApplyRetentionOperator": lambda job: operator("ApplyRetentionOperator", job=job, max_periodic=0,
                                                       savepoint_dir=root).execute({}),
    }


def test_traversal_job_names_are_refused_by_every_entry_point(site, airflow_db):
    before = tree_snapshot(site["tmp"])
    entry_points = _entry_points(site)
    for name, call in entry_points.items():
        for job in TRAVERSAL_NAMES:
            if name.startswith("cli"):
                code, out, _ = call(job)
                assert code == 1 and out["error"]["code"] == "invalid_job_name", (name, job, out)
            else:
                with pytest.raises(InvalidJobNameError):
                    call(job)
    assert tree_snapshot(site["tmp"]) == before
    assert sorted(p.name for p in site["root"].iterdir()) == ["orders"]
    print(f"\n{len(TRAVERSAL_NAMES)} job names x {len(entry_points)} entry points = "
          f"{len(TRAVERSAL_NAMES) * len(entry_points)} refusals, nothing changed")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=st.one_of(st.text(max_size=140), st.text(alphabet="./\\-_ab\n\x00~", max_size=12)))
def test_400_generated_job_names_each_accepted_one_is_exactly_one_folder_below_the_root(job, tmp_path):
    root = Store(str(tmp_path / "root"))
    try:
        validate_job_name(job)
    except InvalidJobNameError:
        return
    folder = root.child(job)
    assert folder.parent().root == root.root and folder.name == job
    assert os.path.normpath(os.path.join(root.root, job)) == folder.root
    assert "/" not in job and job not in (".", "..") and "\n" not in job and "\x00" not in job


# ---- pointers ----------------------------------------------------------------------------------------------

def test_dispose_refuses_every_pointer_that_is_not_a_savepoint_under_the_root(site):
    root, pointer, foreign, outside = site["root"], site["pointer"], site["foreign"], site["outside"]
    sibling = site["tmp"] / "savepoints2" / "orders" / pointer.name  # a root whose name extends the real one
    shutil.copytree(pointer, sibling)
    misnamed = root / "orders" / "backup"  # a complete savepoint copied under a name this tool never writes
    shutil.copytree(pointer, misnamed)
    wrong_job = root / "payments" / pointer.name  # its manifest says job 'orders'
    shutil.copytree(pointer, wrong_job)
    pointers = {
        f"{root}/orders/../../outside/other-root/orders/{foreign.name}": "outside_root",
        f"file://{root}/../outside/other-root/orders/{foreign.name}/_metadata": "outside_root",
        str(foreign): "outside_root",
        str(sibling): "outside_root",
        str(misnamed): "outside_root",
        str(wrong_job): "outside_root",
        str(root): "incomplete_savepoint",
        str(root / "orders"): "incomplete_savepoint",
        str(root / "orders" / "_catalog.json"): "savepoint_not_found",
        str(pointer / "offsets"): "incomplete_savepoint",
        str(outside / "precious"): "incomplete_savepoint",
        str(site["ckpt"]): "incomplete_savepoint",
        "/": "incomplete_savepoint",
    }
    before = tree_snapshot(site["tmp"])
    for target, code in pointers.items():
        with pytest.raises(SavepointError) as caught:
            dispose_savepoint(target, savepoint_dir=str(root))
        assert caught.value.code == code, (target, caught.value)
        exit_code, out, _ = cli("dispose", target, "--dir", str(root))
        assert exit_code == 1 and out["error"]["code"] == code, (target, out)
    assert tree_snapshot(site["tmp"]) == before
    print(f"\n{len(pointers)} pointers x 2 surfaces refused, nothing changed")


# ---- symbolic links ---------------------------------------------------------------------------------------

def test_a_savepoint_folder_that_is_a_link_is_never_disposed_through(site, airflow_db):
    root, foreign = site["root"], site["foreign"]
    link = root / "orders" / foreign.name
    link.symlink_to(foreign, target_is_directory=True)
    before = tree_snapshot(site["tmp"])
    with pytest.raises(SavepointError) as caught:
        dispose_savepoint(str(link), savepoint_dir=str(root))
    assert caught.value.code == "outside_root" and "symbolic link" in caught.value.message and str(foreign) in caught.value.message
    code, out, _ = cli("dispose", str(link), "--dir", str(root))
    assert code == 1 and out["error"]["code"] == "outside_root"
    with pytest.raises(SavepointError, match="symbolic link"):
        operator("DisposeSavepointOperator", pointer=str(link), savepoint_dir=str(root)).execute({})
    with pytest.raises(SavepointError, match="symbolic link"):  # without a configured root too
        dispose_savepoint(str(link))
    assert tree_snapshot(site["tmp"]) == before and link.is_symlink()
    # retention sees the link as a savepoint of the job; it may not dispose it either
    report = retain(Store(str(root)), "orders", RetentionPolicy(max_periodic=0, max_age_seconds=0, orphan_timeout_seconds=0))
    assert tree_snapshot(site["outside"]) == {k[len("outside/"):]: v for k, v in before.items() if k.startswith("outside/")}
    assert foreign.name not in report.disposed


def test_a_job_folder_that_is_a_link_is_never_retained_or_disposed_through(site, airflow_db):
    root, ckpt, outside = site["root"], site["ckpt"], site["outside"]
    elsewhere = outside / "jobs-elsewhere"
    taken = [take_savepoint(str(ckpt), "evil", savepoint_dir=str(elsewhere), savepoint_type="periodic") for _ in range(3)]
    (elsewhere / "evil" / "savepoint-0rphan-0123456789ab").mkdir()  # an old orphan there
    os.utime(elsewhere / "evil" / "savepoint-0rphan-0123456789ab", (0, 0))
    (root / "evil").symlink_to(elsewhere / "evil", target_is_directory=True)
    before = tree_snapshot(site["tmp"])
    policy = RetentionPolicy(max_periodic=0, max_age_seconds=0, orphan_timeout_seconds=0)
    for call in (lambda: retain(Store(str(root)), "evil", policy),
                 lambda: retain(Store(str(root)), "evil", policy, dry_run=True),
                 lambda: operator("ApplyRetentionOperator", job="evil", max_periodic=0, max_age="0s", orphan_timeout="0s",
                                  savepoint_dir=str(root)).execute({}),
                 lambda: dispose_savepoint(str(root / "evil" / Path(taken[0].pointer).name), savepoint_dir=str(root))):
        with pytest.raises(SavepointError) as caught:
            call()
        assert caught.value.code == "outside_root" and "symbolic link" in caught.value.message
    code, out, _ = cli("retain", "--job", "evil", "--dir", str(root), "--max-periodic", "0", "--orphan-timeout", "0s")
    assert code == 1 and out["error"]["code"] == "outside_root"
    assert tree_snapshot(site["tmp"]) == before  # not even the catalog over there was rewritten


def test_an_old_orphan_that_is_a_link_is_not_removed_and_retention_reports_it(site, airflow_db):
    root, outside = site["root"], site["outside"]
    orphan = root / "orders" / "savepoint-0rphan-0123456789ab"
    orphan.symlink_to(outside / "precious", target_is_directory=True)
    os.utime(outside / "precious" / "data.bin", (0, 0))
    before = tree_snapshot(outside)
    report = retain(Store(str(root)), "orders", RetentionPolicy(orphan_timeout_seconds=0))
    assert [f["error"] for f in report.failed] == ["outside_root"] and report.removed_orphans == []
    assert tree_snapshot(outside) == before and orphan.is_symlink()
    with pytest.raises(SavepointError, match="symbolic link"):
        operator("ApplyRetentionOperator", job="orders", orphan_timeout="0s", savepoint_dir=str(root)).execute({})
    assert tree_snapshot(outside) == before


def test_a_savepoint_with_links_inside_is_refused_and_the_catalog_link_is_replaced(site):
    from airflow_savepoints.errors import SymlinkError

    root, pointer, outside = site["root"], site["pointer"], site["outside"]
    (pointer / "state" / "escape").symlink_to(outside / "precious", target_is_directory=True)
    (pointer / "state" / "data.bin").symlink_to(outside / "precious" / "data.bin")
    catalog = root / "orders" / "_catalog.json"
    decoy = outside / "decoy-catalog.json"
    decoy.write_bytes(catalog.read_bytes())
    catalog.unlink()
    catalog.symlink_to(decoy)
    before = tree_snapshot(outside)
    with pytest.raises(SymlinkError, match="state/data.bin"):  # issue 14: never disposed, verified or restored
        dispose_savepoint(str(pointer), savepoint_dir=str(root))
    assert pointer.exists() and tree_snapshot(outside) == before
    (pointer / "state" / "escape").unlink()
    (pointer / "state" / "data.bin").unlink()
    dispose_savepoint(str(pointer), savepoint_dir=str(root))
    assert not pointer.exists()
    assert tree_snapshot(outside) == before  # the catalog update replaced the link, never wrote through it
    assert not catalog.is_symlink() and pointer.name not in json.loads(catalog.read_text())["records"]


def test_a_root_that_is_itself_a_link_works(site):
    real = site["tmp"] / "disk1" / "savepoints"
    real.parent.mkdir()
    shutil.move(str(site["root"]), real)
    site["root"].symlink_to(real, target_is_directory=True)
    periodic = [take_savepoint(str(site["ckpt"]), "orders", savepoint_dir=str(site["root"]), savepoint_type="periodic")
                for _ in range(2)]
    report = retain(Store(str(site["root"])), "orders", RetentionPolicy(max_periodic=1, max_age_seconds=None))
    assert report.disposed == [Path(periodic[0].pointer).name] and not report.failed
    dispose_savepoint(str(site["pointer"]), savepoint_dir=str(site["root"]))
    assert not (real / "orders" / site["pointer"].name).exists()


def test_a_forged_secondary_in_metadata_never_deletes_outside(site):
    """``secondary`` is data in ``_metadata``: a forged one naming an outside folder must not be deleted."""
    root, outside = site["root"], site["outside"]
    for case in ("not-a-savepoint", "wrong-job-folder"):
        pointer = Path(take_savepoint(str(site["ckpt"]), "orders", savepoint_dir=str(root)).pointer)
        if case == "not-a-savepoint":  # laid out like a secondary copy, but holding something else
            forged = outside / "orders" / pointer.name
            forged.mkdir(parents=True)
            (forged / "data.bin").write_bytes(b"not a savepoint")
        else:  # the right name and even a copy of its _metadata, but not under a folder of the job
            forged = outside / "elsewhere" / pointer.name
            forged.mkdir(parents=True)
            (forged / "_metadata").write_bytes((pointer / "_metadata").read_bytes())
        manifest = json.loads((pointer / "_metadata").read_text())
        (pointer / "_metadata").write_text(json.dumps({**manifest, "secondary": str(forged)}))
        before = tree_snapshot(outside)
        dispose_savepoint(str(pointer), savepoint_dir=str(root))
        assert not pointer.exists() and tree_snapshot(outside) == before, case


# ---- retention deletes only <root>/<job>/savepoint-* ---------------------------------------------------------

JUNK = st.lists(st.sampled_from([
    "notes.txt", "savepoint-bad", "savepoint-abc123-0123456789ab.bak", "backup/savepoint-abc123-0123456789ab/_metadata",
    "savepoint-abc123-XYZ456789abc/x", "_run.json", ".savepoint-abc123-0123456789ab", "Savepoint-abc123-0123456789ab/x",
]), unique=True, max_size=5)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk_in_job=JUNK, junk_at_root=JUNK, periodic=st.integers(1, 4), keep=st.integers(0, 2))
def test_15_generated_layouts_retention_deletes_nothing_but_savepoint_folders_of_the_job(
        tmp_path_factory, junk_in_job, junk_at_root, periodic, keep):
    tmp = tmp_path_factory.mktemp("retention-scope")
    ckpt = write_checkpoint(tmp / "checkpoint")
    root = tmp / "savepoints"
    for _ in range(periodic):
        take_savepoint(str(ckpt), "orders", savepoint_dir=str(root), savepoint_type="periodic")
    take_savepoint(str(ckpt), "payments", savepoint_dir=str(root), savepoint_type="periodic")
    orphan = root / "orders" / "savepoint-0rphan-0123456789ab"
    orphan.mkdir()
    (orphan / "half-copied").write_bytes(b"x")
    os.utime(orphan / "half-copied", (0, 0))
    for folder, junk in ((root / "orders", junk_in_job), (root, junk_at_root)):
        for rel in junk:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(b"junk")
    before = tree_snapshot(tmp)
    report = retain(Store(str(root)), "orders", RetentionPolicy(max_periodic=keep, max_age_seconds=None, orphan_timeout_seconds=0))
    after = tree_snapshot(tmp)
    gone = set(before) - set(after)
    changed = {p for p in set(before) & set(after) if before[p] != after[p]} | (set(after) - set(before))
    removed_folders = {p.split("/")[2] for p in gone}
    assert all(p.startswith("savepoints/orders/savepoint-") for p in gone), gone
    assert removed_folders == set(report.disposed) | set(report.removed_orphans)
    assert changed <= {"savepoints/orders/_catalog.json"}, changed
    assert len(report.disposed) == max(0, periodic - max(keep, 1)) and report.removed_orphans == [orphan.name]


# ---- credentials ------------------------------------------------------------------------------------------

ACCESS_KEY = "AKIASECURITYTESTLOGIN7"
SECRET_KEY = "Sup3r-Secret-Password-x9Q"
EXTRA_TOKEN = "extra-session-token-Wk42"
CREDENTIALS_DAG = """
import os
from datetime import datetime, timezone

from airflow.sdk import DAG

from airflow_savepoints.operators.retention import ApplyRetentionOperator
from airflow_savepoints.operators.savepoint import DisposeSavepointOperator, TriggerSavepointOperator

conn, ckpt, bucket = "savepoints_secure", os.environ["SECURITY_TEST_CHECKPOINT"], os.environ["SECURITY_TEST_BUCKET"]
with DAG("security_credentials", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False):
    first = TriggerSavepointOperator(task_id="first", job="orders", checkpoint=ckpt, savepoints_conn_id=conn,
                                     savepoint_type="periodic", checkpoint_storage_options={})
    second = TriggerSavepointOperator(task_id="second", job="orders", checkpoint=ckpt, savepoints_conn_id=conn,
                                      savepoint_type="periodic", checkpoint_storage_options={})
    dispose = DisposeSavepointOperator(task_id="dispose", pointer="{{ ti.xcom_pull(task_ids='first')['pointer'] }}",
                                       savepoints_conn_id=conn)
    keep = ApplyRetentionOperator(task_id="retention", job="orders", max_periodic=5, savepoints_conn_id=conn)
    refused = DisposeSavepointOperator(task_id="refused", pointer=f"s3://{bucket}/elsewhere/orders/savepoint-abc123-0123456789ab",
                                       savepoints_conn_id=conn, trigger_rule="all_done")
    first >> second >> dispose >> keep >> refused
"""


@pytest.mark.s3
def test_connection_secrets_never_reach_logs_xcom_metadata_catalog_or_cli(s3, s3_endpoint, airflow_db, tmp_path, monkeypatch,
                                                                          capfd, caplog):
    import logging

    import fsspec
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    caplog.set_level(logging.INFO)  # Airflow's default task log level (botocore's DEBUG records carry request headers)
    ckpt = write_checkpoint(tmp_path / "checkpoint")
    root = f"s3://{s3}/savepoints"
    # the connection is the ONLY place the keys are: none in the environment, none in fsspec's config
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    fsspec.get_filesystem_class("s3").clear_instance_cache()
    monkeypatch.setenv("AIRFLOW_CONN_SAVEPOINTS_SECURE", json.dumps({
        "conn_type": "savepoints", "host": root, "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": json.dumps({"token": EXTRA_TOKEN, "client_kwargs": {"endpoint_url": s3_endpoint}}),
    }))
    from tests.conftest import dag_bag_of_own_bundle  # the project's DAG folder stays configured beside it

    monkeypatch.setenv("SECURITY_TEST_CHECKPOINT", str(ckpt))
    monkeypatch.setenv("SECURITY_TEST_BUCKET", s3)
    bag = dag_bag_of_own_bundle(monkeypatch, tmp_path / "dags", "security-test", {"security_credentials.py": CREDENTIALS_DAG})
    dag_run = bag.get_dag("security_credentials").test()
    run_id = dag_run.run_id
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states == {"first": "success", "second": "success", "dispose": "success", "retention": "success",
                      "refused": "failed"}, states

    secrets = (ACCESS_KEY, SECRET_KEY, EXTRA_TOKEN)
    found: dict[str, str] = {}
    with create_session() as session:
        xcoms = session.query(XComModel).filter_by(dag_id="security_credentials", run_id=run_id).all()
        found.update({f"xcom {x.task_id}/{x.key}": json.dumps(XComModel.deserialize_value(x), default=str) for x in xcoms})
    assert {x.split()[1].split("/")[0] for x in found} >= {"first", "second", "dispose", "retention"}
    fs = fsspec.filesystem("s3", key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=s3_endpoint, skip_instance_cache=True)
    objects = fs.find(s3)
    assert any(o.endswith("/_metadata") for o in objects) and any(o.endswith("/_catalog.json") for o in objects)
    found.update({f"object {o}": fs.cat_file(o).decode("utf-8", "replace") for o in objects})
    logs_dir = Path(os.environ["AIRFLOW_HOME"]) / "logs"
    found.update({f"log file {p}": p.read_text(errors="replace") for p in logs_dir.rglob("*") if p.is_file()})
    captured = capfd.readouterr()
    found["task output (stdout)"], found["task output (stderr)"] = captured.out, captured.err
    found["log records"] = "\n".join(r.getMessage() for r in caplog.records)
    assert "savepoint completed" in found["log records"] + captured.out + captured.err  # the task logs were captured

    # the CLI, given the same keys through fsspec's configuration, prints none of them either
    monkeypatch.setenv("FSSPEC_S3_KEY", ACCESS_KEY)
    monkeypatch.setenv("FSSPEC_S3_SECRET", SECRET_KEY)
    monkeypatch.setenv("FSSPEC_S3_TOKEN", EXTRA_TOKEN)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", s3_endpoint)
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    fsspec.config.set_conf_env(fsspec.config.conf)
    try:
        pointer = json.loads(found["xcom second/return_value"])["pointer"]
        for args in (["list", "--job", "orders", "--dir", root], ["show", pointer], ["verify", pointer],
                     ["catalog", "--job", "orders", "--dir", root], ["retain", "--job", "orders", "--dir", root, "--dry-run"],
                     ["dispose", f"s3://{s3}/elsewhere/orders/x", "--dir", root]):
            for fmt in ([], ["--json"]):
                result = runner.invoke(app, [*args, *fmt])
                found[f"cli {' '.join(args)} {' '.join(fmt)}"] = result.output
    finally:
        fsspec.config.conf.clear()
        fsspec.config.conf.update(saved)
    leaks = {where: [s for s in secrets if s in text] for where, text in found.items() if any(s in text for s in secrets)}
    assert not leaks, leaks
    print(f"\n{sum(k.startswith('log file') for k in found)} log files, {len(caplog.records)} log records; "
          f"searched {len(found)} places (XComs, {len(objects)} objects, log files, task output, CLI runs): no secret")
