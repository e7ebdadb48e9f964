"""Bad input, table-driven, across the CLI, the Python API and the Airflow operators.

Every case must fail with a stable ``code`` (airflow_savepoints/errors.py), a message that names
the offending thing, a hint on how to fix it, a non-zero exit status for the CLI, and it must
change NOTHING: the whole test tree (and the S3 bucket, for S3 cases) is compared byte for byte
before and after. Checkpoints here are written in Spark's formats without Spark
(tests/support/synthetic.py), so the whole table runs in seconds.

Read-only and full targets are real: as root, a read-only bind mount and a tiny tmpfs (root
ignores chmod); otherwise chmod, and the full-disk cases are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core import dispose_savepoint, list_savepoints, restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.core.retention import RetentionPolicy, retain
from airflow_savepoints.errors import SavepointError
from airflow_savepoints.jobs import load_jobs
from airflow_savepoints.storage import Store
from tests.conftest import tree_snapshot
from tests.support.synthetic import write_checkpoint

runner = CliRunner()
IS_ROOT = os.geteuid() == 0


# ---- the world every case starts from ---------------------------------------------------------------

class World(dict):
    """Paths of one case's tree (``w.ckpt``...); ``w.fmt("{sp}/x")`` fills them into a string."""

    __getattr__ = dict.__getitem__

    def fmt(self, text: str) -> str:
        return text.format(**{k: v for k, v in self.items() if not callable(v)})


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def make_read_only(path: Path, request) -> str:
    """Make the folder ``path`` read-only for this process, the way a real deployment meets it."""
    if not IS_ROOT:
        path.chmod(0o555)
        request.addfinalizer(lambda: path.chmod(0o755))
        return "chmod 555"
    if _mount("--bind", str(path), str(path)):
        if _mount("-o", "remount,ro,bind", str(path)):
            request.addfinalizer(lambda: _mount("-o", "remount,rw,bind", str(path)) or True)
            request.addfinalizer(lambda: subprocess.run(["umount", str(path)], capture_output=True))
            return "read-only bind mount"
        subprocess.run(["umount", str(path)], capture_output=True)
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        request.addfinalizer(lambda: subprocess.run(["chattr", "-i", str(path)], capture_output=True))
        return "chattr +i"
    pytest.skip("running as root (chmod is ignored) and neither a read-only bind mount nor chattr +i is possible here")


def make_full_disk(path: Path, request, size: str = "256k") -> str:
    """Mount a tiny tmpfs at ``path``: writes past ``size`` fail with ENOSPC."""
    path.mkdir(parents=True, exist_ok=True)
    if not IS_ROOT:
        pytest.skip("a full disk needs a tiny tmpfs or loop device, which only root can mount")
    if not _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)):
        pytest.skip("running as root but mounting a tmpfs is not permitted here (no CAP_SYS_ADMIN)")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(path)], capture_output=True))
    return f"tmpfs size={size}"


@pytest.fixture
def world(tmp_path) -> World:
    w = World(tmp=tmp_path)
    w["ckpt"] = write_checkpoint(tmp_path / "checkpoint")
    w["uncommitted"] = write_checkpoint(tmp_path / "uncommitted", batches=1, committed=0)
    purged = write_checkpoint(tmp_path / "purged", batches=5)  # Spark's cleanup went too far: offsets/3 gone
    for b in range(4):
        (purged / "offsets" / str(b)).unlink()
        (purged / "commits" / str(b)).unlink()
    w["purged"] = purged
    w["photos"] = tmp_path / "photos"
    w.photos.mkdir()
    (w.photos / "cat.jpg").write_bytes(b"\xff\xd8\xff")
    w["sp"] = tmp_path / "savepoints"
    w["other"] = tmp_path / "other-root"
    w["pointer"] = Path(take_savepoint(str(w.ckpt), "orders", savepoint_dir=str(w.sp)).pointer)
    manifest = json.loads((w.pointer / "_metadata").read_text())

    def variant(name: str, body: bytes) -> Path:  # a savepoint folder of the job whose _metadata is wrong
        target = w.sp / "orders" / f"savepoint-{name}-00000000000{len(name)}"
        shutil.copytree(w.pointer, target)
        (target / "_metadata").write_bytes(body)
        return target

    w["future"] = variant("future", json.dumps({**manifest, "format_version": 99}).encode())
    w["corrupt"] = variant("trunc", b'{"format": "airflow-savepoints/savepoint", "format_ver')
    w["foreign"] = variant("alien", json.dumps({"format": "flink-savepoint", "format_version": 1}).encode())
    w["negative"] = variant("neg", json.dumps({**manifest, "batch_id": -3}).encode())
    # A complete savepoint laid out like one, but under another root: dispose must refuse it.
    w["elsewhere"] = tmp_path / "elsewhere" / "orders" / w.pointer.name
    shutil.copytree(w.pointer, w.elsewhere)
    w["nonempty"] = tmp_path / "in-use"
    w.nonempty.mkdir()
    (w.nonempty / "offsets").mkdir()
    (w.nonempty / "offsets" / "0").write_text("v1\n{}\n")
    w["jobs"] = tmp_path / "jobs.yaml"
    w.jobs.write_text(f"jobs:\n  - name: orders\n    application: /bin/true\n    checkpoint: {tmp_path}/live\n"
                      f"    savepoint_dir: {w.sp}\n")
    w["badjobs"] = tmp_path / "bad-jobs.yaml"
    w.badjobs.write_text("jobs:\n  - {name: '../escape', application: /bin/true, checkpoint: /c}\n")
    w["negjobs"] = tmp_path / "neg-jobs.yaml"
    w.negjobs.write_text("jobs:\n  - {name: a, application: x, checkpoint: /c, retention: {max_periodic: -5}}\n")
    return w


def with_read_only(w: World, request) -> None:
    """``{ro}``: a read-only folder that holds a savepoint root with one savepoint (``{ro_pointer}``)."""
    ro = w.tmp / "read-only"
    w["ro_pointer"] = Path(take_savepoint(str(w.ckpt), "orders", savepoint_dir=str(ro / "sp")).pointer)
    w["ro"] = ro
    w["ro_how"] = make_read_only(ro, request)


def with_full_disk(w: World, request) -> None:
    """``{full}``: a 256 KiB filesystem holding a root with one small savepoint of ``orders``;
    ``{big}``: a checkpoint whose state (1.2 MB) cannot fit there, ``{big_pointer}`` a savepoint of it."""
    full = w.tmp / "full"
    w["full_how"] = make_full_disk(full, request)
    w["full"] = full
    take_savepoint(str(w.ckpt), "orders", savepoint_dir=str(full / "sp"))
    w["big"] = write_checkpoint(w.tmp / "big-checkpoint", batches=3, state_bytes=200_000)
    w["big_pointer"] = Path(take_savepoint(str(w.big), "big", savepoint_dir=str(w.tmp / "big-savepoints")).pointer)


def without_s3_credentials(w: World, request, monkeypatch) -> None:
    """``{bucket}``: a fresh bucket on the moto S3 server; then no credentials anywhere."""
    w["bucket"] = request.getfixturevalue("s3")
    import fsspec

    endpoint = os.environ["FSSPEC_S3_ENDPOINT_URL"]
    w["s3fs"] = lambda: fsspec.filesystem("s3", key="testing", secret="testing", endpoint_url=endpoint,
                                          skip_instance_cache=True)
    fs = w.s3fs()
    fs.pipe(f"{w.bucket}/sp/orders/keep.txt", b"already there")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(w.tmp / "no-such-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(w.tmp / "no-such-config"))
    fsspec.get_filesystem_class("s3").clear_instance_cache()


def snapshot(w: World) -> dict[str, Any]:
    """Every file of the case's tree with its bytes (and the bucket's objects). Folders are not compared:
    a failed restore may leave its (empty) target folder behind; no file is ever left."""
    state: dict[str, Any] = {"files": tree_snapshot(w.tmp)}
    if "bucket" in w:
        fs = w.s3fs()
        state["bucket"] = {p: fs.cat_file(p) for p in fs.find(w.bucket)}
    return state


# ---- the cases ------------------------------------------------------------------------------------------

@dataclass
class Case:
    id: str
    surface: str  # cli | api | operator
    action: Callable[[World], Any]  # cli: returns the argument list; else: makes the call
    code: str
    names: tuple[str, ...]  # what the message must name (formatted with the world's paths)
    needs: tuple[str, ...] = ()


def cli(*args: str) -> Callable[[World], list[str]]:
    return lambda w: [w.fmt(a) for a in args]


def op(cls_name: str, **kwargs: Any) -> Callable[[World], Any]:
    def run(w: World) -> Any:
        import airflow_savepoints.operators.job as job_ops
        import airflow_savepoints.operators.retention as retention_ops
        import airflow_savepoints.operators.savepoint as savepoint_ops

        cls = next(getattr(m, cls_name) for m in (savepoint_ops, job_ops, retention_ops) if hasattr(m, cls_name))
        args = {k: w.fmt(v) if isinstance(v, str) else v for k, v in kwargs.items()}
        return cls(task_id="bad_input", **args).execute({})

    return run


TRIGGER = ("trigger", "{ckpt}", "--job", "orders", "--dir", "{sp}")
CASES = [
    # -- CLI ----------------------------------------------------------------------------------------------
    Case("cli-trigger-missing-path", "cli", cli("trigger", "{tmp}/nope", "--job", "orders", "--dir", "{sp}"),
         "checkpoint_not_found", ("{tmp}/nope",)),
    Case("cli-trigger-relative-path", "cli", cli("trigger", "relative/ckpt", "--job", "orders", "--dir", "{sp}"),
         "invalid_path", ("relative/ckpt",)),
    Case("cli-trigger-not-a-checkpoint", "cli", cli("trigger", "{photos}", "--job", "orders", "--dir", "{sp}"),
         "not_a_checkpoint", ("{photos}",)),
    Case("cli-trigger-no-committed-batch", "cli", cli("trigger", "{uncommitted}", "--job", "orders", "--dir", "{sp}"),
         "no_committed_batch", ("{uncommitted}",)),
    Case("cli-trigger-job-slash", "cli", cli("trigger", "{ckpt}", "--job", "a/b", "--dir", "{sp}"),
         "invalid_job_name", ("'a/b'",)),
    Case("cli-trigger-job-dotdot", "cli", cli("trigger", "{ckpt}", "--job", "..", "--dir", "{sp}"),
         "invalid_job_name", ("'..'",)),
    Case("cli-trigger-job-empty", "cli", cli("trigger", "{ckpt}", "--job", "", "--dir", "{sp}"),
         "invalid_job_name", ("''",)),
    Case("cli-trigger-unknown-scheme", "cli", cli("trigger", "warp://bucket/ckpt", "--job", "orders", "--dir", "{sp}"),
         "unknown_scheme", ("warp",)),
    Case("cli-trigger-no-credentials", "cli", cli("trigger", "{ckpt}", "--job", "orders", "--dir", "s3://{bucket}/sp"),
         "missing_credentials", ("s3://{bucket}/sp",), needs=("s3",)),
    Case("cli-trigger-read-only-dir", "cli", cli("trigger", "{ckpt}", "--job", "orders", "--dir", "{ro}/new-root"),
         "permission_denied", ("{ro}/new-root",), needs=("ro",)),
    Case("cli-trigger-disk-full", "cli", cli("trigger", "{big}", "--job", "orders", "--dir", "{full}/sp"),
         "storage_full", ("{full}/sp/orders/savepoint-",), needs=("full",)),
    Case("cli-list-job-traversal", "cli", cli("list", "--job", "../orders", "--dir", "{sp}"),
         "invalid_job_name", ("'../orders'",)),
    Case("cli-status-job-absolute", "cli", cli("status", "--job", "/etc", "--dir", "{sp}"),
         "invalid_job_name", ("'/etc'",)),
    Case("cli-catalog-job-empty", "cli", cli("catalog", "--job", "", "--dir", "{sp}", "--rebuild"),
         "invalid_job_name", ("''",)),
    Case("cli-show-relative-pointer", "cli", cli("show", "savepoints/orders/x"), "invalid_path", ("savepoints/orders/x",)),
    Case("cli-verify-malformed-metadata", "cli", cli("verify", "{corrupt}"), "manifest_corrupt", ("{corrupt}/_metadata",)),
    Case("cli-restore-future-metadata", "cli", cli("restore", "{future}", "--to", "{tmp}/restored"),
         "manifest_version_unsupported", ("{future}/_metadata", "99")),
    Case("cli-restore-relative-target", "cli", cli("restore", "{pointer}", "--to", "restored"), "invalid_path", ("'restored'",)),
    Case("cli-restore-read-only-target", "cli", cli("restore", "{pointer}", "--to", "{ro}/restored"),
         "permission_denied", ("{ro}/restored",), needs=("ro",)),
    Case("cli-dispose-outside-root", "cli", cli("dispose", "{pointer}", "--dir", "{other}"), "outside_root",
         ("{pointer}", "{other}")),
    Case("cli-dispose-a-checkpoint", "cli", cli("dispose", "{ckpt}", "--dir", "{sp}"), "incomplete_savepoint", ("{ckpt}",)),
    Case("cli-retain-negative-count", "cli", cli("retain", "--job", "orders", "--dir", "{sp}", "--max-periodic", "-1"),
         "invalid_input", ("max_periodic", "-1")),
    Case("cli-retain-absurd-age", "cli", cli("retain", "--job", "orders", "--dir", "{sp}", "--max-age", "99999d"),
         "invalid_input", ("max_age_seconds",)),
    Case("cli-retain-negative-orphan-timeout", "cli",
         cli("retain", "--job", "orders", "--dir", "{sp}", "--orphan-timeout", "-10m"), "invalid_input", ("'-10m'",)),
    # -- Python API ---------------------------------------------------------------------------------------
    Case("api-take-missing-path", "api", lambda w: take_savepoint(f"{w.tmp}/gone", "orders", savepoint_dir=str(w.sp)),
         "checkpoint_not_found", ("{tmp}/gone",)),
    Case("api-take-relative-dir", "api", lambda w: take_savepoint(str(w.ckpt), "orders", savepoint_dir="sp"),
         "invalid_path", ("'sp'",)),
    Case("api-take-purged-checkpoint", "api", lambda w: take_savepoint(str(w.purged), "orders", savepoint_dir=str(w.sp)),
         "checkpoint_error", ("{purged}", "offsets/3")),
    Case("api-take-job-too-long", "api", lambda w: take_savepoint(str(w.ckpt), "j" * 200, savepoint_dir=str(w.sp)),
         "invalid_job_name", ("jjjj",)),
    Case("api-take-job-newline", "api", lambda w: take_savepoint(str(w.ckpt), "orders\n", savepoint_dir=str(w.sp)),
         "invalid_job_name", ("'orders\\n'",)),
    Case("api-take-unknown-type", "api",
         lambda w: take_savepoint(str(w.ckpt), "orders", savepoint_dir=str(w.sp), savepoint_type="hourly"),
         "invalid_input", ("'hourly'",)),
    Case("api-take-zero-attempts", "api",
         lambda w: take_savepoint(str(w.ckpt), "orders", savepoint_dir=str(w.sp), max_attempts=0),
         "invalid_input", ("max_attempts",)),
    Case("api-take-dir-inside-checkpoint", "api",
         lambda w: take_savepoint(str(w.ckpt), "orders", savepoint_dir=f"{w.ckpt}/savepoints"), "invalid_input",
         ("{ckpt}/savepoints", "{ckpt}")),
    Case("api-take-bucketless-url", "api", lambda w: take_savepoint(str(w.ckpt), "orders", savepoint_dir="s3://"),
         "invalid_path", ("s3://",)),
    Case("api-take-read-only-root", "api", lambda w: take_savepoint(str(w.ckpt), "orders", savepoint_dir=str(w.ro / "sp")),
         "permission_denied", ("{ro}/sp/orders",), needs=("ro",)),
    Case("api-restore-non-empty-target", "api", lambda w: restore_savepoint(str(w.pointer), str(w.nonempty)),
         "target_not_empty", ("{nonempty}", "offsets/0")),
    Case("api-restore-into-the-savepoint", "api", lambda w: restore_savepoint(str(w.pointer), f"{w.pointer}/restored"),
         "invalid_input", ("{pointer}/restored",)),
    Case("api-restore-relative-sink", "api",
         lambda w: restore_savepoint(str(w.pointer), f"{w.tmp}/restored", sink_path="out/sink"), "invalid_path", ("out/sink",)),
    Case("api-restore-disk-full", "api", lambda w: restore_savepoint(str(w.big_pointer), f"{w.full}/restored"),
         "storage_full", ("{full}/restored",), needs=("full",)),
    Case("api-restore-no-credentials", "api", lambda w: restore_savepoint(str(w.pointer), f"s3://{w.bucket}/restored"),
         "missing_credentials", ("s3://{bucket}/restored",), needs=("s3",)),
    Case("api-restore-negative-batch-metadata", "api", lambda w: restore_savepoint(str(w.negative), f"{w.tmp}/r"),
         "manifest_corrupt", ("{negative}/_metadata", "batch_id")),
    Case("api-dispose-lookalike-outside-root", "api", lambda w: dispose_savepoint(str(w.elsewhere), savepoint_dir=str(w.sp)),
         "outside_root", ("{elsewhere}", "{sp}")),
    Case("api-dispose-dotdot-pointer", "api",
         lambda w: dispose_savepoint(f"{w.sp}/orders/../../elsewhere/orders/{w.pointer.name}", savepoint_dir=str(w.sp)),
         "outside_root", ("{elsewhere}",)),
    Case("api-dispose-job-folder", "api", lambda w: dispose_savepoint(str(w.sp / "orders"), savepoint_dir=str(w.sp)),
         "incomplete_savepoint", ("{sp}/orders",)),
    Case("api-dispose-future-metadata", "api", lambda w: dispose_savepoint(str(w.future), savepoint_dir=str(w.sp)),
         "manifest_version_unsupported", ("{future}/_metadata",)),
    Case("api-verify-foreign-metadata", "api", lambda w: verify_savepoint(str(w.foreign)), "manifest_corrupt",
         ("{foreign}/_metadata", "flink-savepoint")),
    Case("api-verify-unknown-scheme", "api", lambda w: verify_savepoint("tape://vault/sp"), "unknown_scheme", ("tape",)),
    Case("api-retention-negative-count", "api", lambda w: RetentionPolicy.resolve(max_periodic=-1), "invalid_input",
         ("max_periodic", "-1")),
    Case("api-retention-absurd-count", "api", lambda w: RetentionPolicy.resolve(max_periodic=10**9), "invalid_input",
         ("max_periodic", "1000000000")),
    Case("api-retention-word-count", "api", lambda w: RetentionPolicy.resolve(max_periodic="ten"), "invalid_input", ("'ten'",)),
    Case("api-retention-negative-age", "api", lambda w: RetentionPolicy.resolve(max_age="-5m"), "invalid_input", ("'-5m'",)),
    Case("api-retention-unparsable-age", "api", lambda w: RetentionPolicy.resolve(max_age="forever"), "invalid_input",
         ("'forever'",)),
    Case("api-retain-job-traversal", "api", lambda w: retain(Store(str(w.sp)), "../savepoints", RetentionPolicy()),
         "invalid_job_name", ("'../savepoints'",)),
    Case("api-list-job-empty", "api", lambda w: list_savepoints(Store(str(w.sp)), ""), "invalid_job_name", ("''",)),
    Case("api-load-jobs-missing-file", "api", lambda w: load_jobs(w.tmp / "nope.yaml"), "invalid_input", ("{tmp}/nope.yaml",)),
    Case("api-load-jobs-traversal-name", "api", lambda w: load_jobs(w.badjobs), "invalid_job_name", ("'../escape'",)),
    Case("api-load-jobs-negative-retention", "api", lambda w: load_jobs(w.negjobs), "invalid_input",
         ("{negjobs}", "max_periodic")),
    # -- operators (execute() as Airflow calls it) ---------------------------------------------------------------
    Case("op-trigger-job-slash", "operator", op("TriggerSavepointOperator", job="a/b", checkpoint="{ckpt}", savepoint_dir="{sp}"),
         "invalid_job_name", ("'a/b'",)),
    Case("op-trigger-not-a-checkpoint", "operator",
         op("TriggerSavepointOperator", job="orders", checkpoint="{photos}", savepoint_dir="{sp}"),
         "not_a_checkpoint", ("{photos}",)),
    Case("op-trigger-no-checkpoint-known", "operator", op("TriggerSavepointOperator", job="orders", savepoint_dir="{sp}"),
         "invalid_input", ("'orders'", "{sp}")),
    Case("op-trigger-no-credentials", "operator",
         op("TriggerSavepointOperator", job="orders", checkpoint="{ckpt}", savepoint_dir="s3://{bucket}/sp"),
         "missing_credentials", ("s3://{bucket}/sp",), needs=("s3",)),
    Case("op-trigger-disk-full", "operator",
         op("TriggerSavepointOperator", job="orders", checkpoint="{big}", savepoint_dir="{full}/sp"),
         "storage_full", ("{full}/sp/orders/savepoint-",), needs=("full",)),
    Case("op-restore-missing-jobs-file", "operator", op("RestoreJobOperator", job="orders", jobs_file="{tmp}/none.yaml"),
         "invalid_input", ("{tmp}/none.yaml",)),
    Case("op-restore-unknown-job", "operator", op("RestoreJobOperator", job="payments", jobs_file="{jobs}"),
         "invalid_input", ("'payments'", "{jobs}")),
    Case("op-restore-future-metadata", "operator",
         op("RestoreJobOperator", job="orders", jobs_file="{jobs}", pointer="{future}", target_checkpoint="{tmp}/r"),
         "manifest_version_unsupported", ("{future}/_metadata",)),
    Case("op-restore-checkpoint-as-pointer", "operator",
         op("RestoreJobOperator", job="orders", jobs_file="{jobs}", pointer="{ckpt}", target_checkpoint="{tmp}/r"),
         "incomplete_savepoint", ("{ckpt}",)),
    Case("op-restore-negative-max-age", "operator",
         op("RestoreJobOperator", job="orders", jobs_file="{jobs}", pointer="{pointer}", max_age="-2h"),
         "invalid_input", ("'-2h'",)),
    Case("op-restore-relative-target", "operator",
         op("RestoreJobOperator", job="orders", jobs_file="{jobs}", pointer="{pointer}", target_checkpoint="ckpt-2"),
         "invalid_path", ("'ckpt-2'",)),
    Case("op-restore-fresh-start-non-empty", "operator",
         op("RestoreJobOperator", job="orders", jobs_file="{jobs}", fresh_start=True, target_checkpoint="{nonempty}"),
         "invalid_input", ("{nonempty}",)),
    Case("op-dispose-outside-root", "operator", op("DisposeSavepointOperator", pointer="{pointer}", savepoint_dir="{other}"),
         "outside_root", ("{pointer}", "{other}")),
    Case("op-dispose-not-a-savepoint", "operator", op("DisposeSavepointOperator", pointer="{photos}", savepoint_dir="{sp}"),
         "incomplete_savepoint", ("{photos}",)),
    Case("op-dispose-read-only-root", "operator",
         op("DisposeSavepointOperator", pointer="{ro_pointer}", savepoint_dir="{ro}/sp"),
         "permission_denied", ("{ro}/sp/orders",), needs=("ro",)),
    Case("op-retention-job-dotdot", "operator", op("ApplyRetentionOperator", job="..", savepoint_dir="{sp}"),
         "invalid_job_name", ("'..'",)),
    Case("op-retention-negative-count", "operator",
         op("ApplyRetentionOperator", job="orders", max_periodic="-3", savepoint_dir="{sp}"), "invalid_input", ("-3",)),
    Case("op-retention-absurd-orphan-timeout", "operator",
         op("ApplyRetentionOperator", job="orders", orphan_timeout="99999d", savepoint_dir="{sp}"),
         "invalid_input", ("orphan_timeout_seconds",)),
    Case("op-retention-relative-dir", "operator", op("ApplyRetentionOperator", job="orders", savepoint_dir="savepoints"),
         "invalid_path", ("'savepoints'",)),
]


def test_the_table_has_at_least_30_cases_on_every_surface():
    by_surface = {s: sum(c.surface == s for c in CASES) for s in ("cli", "api", "operator")}
    print(f"\nbad-input table: {len(CASES)} cases ({by_surface})")
    assert len(CASES) >= 30 and all(n >= 8 for n in by_surface.values()), by_surface
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_clearly_and_changes_nothing(case: Case, world: World, request, monkeypatch):
    if "ro" in case.needs:
        with_read_only(world, request)
    if "full" in case.needs:
        with_full_disk(world, request)
    if "s3" in case.needs:
        without_s3_credentials(world, request, monkeypatch)
    if case.surface == "operator":
        request.getfixturevalue("airflow_db")
    before = snapshot(world)

    if case.surface == "cli":
        result = runner.invoke(app, [*case.action(world), "--json"])
        assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
        error = json.loads(result.stdout)["error"]
    else:
        with pytest.raises(SavepointError) as caught:
            case.action(world)
        error = caught.value.to_dict()

    assert error["code"] == case.code, error
    for name in case.names:
        assert world.fmt(name) in error["message"], (name, error)
    assert error["hint"] and len(error["hint"]) > 10, error
    assert snapshot(world) == before, "a refused call changed files"
