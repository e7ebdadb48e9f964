"""Storage faults between s3fs and a real S3 server: transient ones are retried, persistent ones fail clearly.

A fault-injecting proxy (tests/support/fault_proxy.py) sits between s3fs and moto's server on
127.0.0.1. It answers chosen requests with S3 errors (503 SlowDown, 500 InternalError) or cuts the
server's response off mid-way after the server acted on the request. Retries are botocore's own
(s3fs calls through it): each injected fault is followed by the same request again, which the
proxy's log shows. Nothing is mocked: real checkpoint, real uploads, real server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from airflow_savepoints.core import list_savepoints, restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.errors import StorageError
from airflow_savepoints.storage import Store
from tests.conftest import ROOT
from tests.support.fault_proxy import FaultProxy, Rule

pytestmark = pytest.mark.s3
PERSISTENT_BOUND = 90.0  # seconds: a persistent fault must fail the trigger well within this
SAVEPOINT_PUTS = r"/savepoints/job/savepoint-"  # object writes into a savepoint location
MANIFEST = SAVEPOINT_PUTS + r"[^/]+/_metadata$"  # the savepoint's own manifest (not Spark's state/*/_metadata/)


@pytest.fixture
def proxy(s3_endpoint):
    running = FaultProxy(s3_endpoint).start()
    yield running
    running.stop()


@pytest.fixture
def bucket(s3, stopped_checkpoint):
    """The bucket with the real Spark checkpoint uploaded to ``checkpoint/`` (directly, no faults)."""
    direct = Store(f"s3://{s3}/checkpoint")
    direct.fs.put(str(stopped_checkpoint), direct.root, recursive=True)
    return s3


def through(proxy: FaultProxy) -> dict[str, str]:
    return {"endpoint_url": proxy.url}


def retried(proxy: FaultProxy) -> int:
    """Faults whose request the client sent again until it succeeded (a request faulted twice in a
    row, then answered, counts both faults)."""
    pending: dict[tuple[str, str], int] = {}
    done = 0
    for method, target, outcome in proxy.log:
        key = (method, target.split("?")[0])
        if isinstance(outcome, str):
            pending[key] = pending.get(key, 0) + 1
        elif pending.get(key):
            done += pending[key]
            pending[key] = 0
    return done


def savepoint_folders(bucket: str) -> dict[str, set[str]]:
    """Every savepoint location in the bucket with its file names (read directly, not through the proxy)."""
    store = Store(f"s3://{bucket}/savepoints/job")
    folders: dict[str, set[str]] = {}
    for path in store.list_files():
        folder, _, rest = path.partition("/")
        if folder.startswith("savepoint-"):
            folders.setdefault(folder, set()).add(rest)
    return folders


def assert_nothing_complete_unless_verified(bucket: str) -> None:
    """No location has a _metadata unless it verifies (every file there, every checksum right)."""
    for folder, files in savepoint_folders(bucket).items():
        if "_metadata" in files:
            verify_savepoint(f"s3://{bucket}/savepoints/job/{folder}")


def test_transient_s3_errors_are_retried_and_the_savepoint_completes_verifies_and_restores(bucket, proxy, tmp_path):
    """Every 7th request of the trigger, of verify and of restore is answered 503 SlowDown, every 11th
    500 InternalError (a trigger makes some 50-65 requests, so at least 5 faults land in it)."""
    options = through(proxy)
    proxy.set_rules(Rule(code="SlowDown", every=7), Rule(code="InternalError", every=11))
    started = time.monotonic()
    info = take_savepoint(f"s3://{bucket}/checkpoint", "job", savepoint_dir=f"s3://{bucket}/savepoints",
                          storage_options=options, checkpoint_storage_options=options, parallelism=4)
    took = time.monotonic() - started
    trigger_figures, trigger_faults, trigger_retries = proxy.figures(), proxy.total_faults, retried(proxy)
    verify_savepoint(info.pointer, storage_options=options)
    restored = tmp_path / "restored"
    restore_savepoint(info.pointer, str(restored), storage_options=options)
    print(f"\ntransient errors: trigger {took:.1f}s, {trigger_figures}, {trigger_retries} retried requests succeeded; "
          f"with verify and restore: {proxy.figures()}, {retried(proxy)} retried requests succeeded")
    assert trigger_faults >= 5 and trigger_retries >= trigger_faults * 0.8  # the faults were real and retried
    assert proxy.total_faults > trigger_faults  # verify and restore met faults too
    for entry in info.manifest.files:
        assert (restored / entry.path).stat().st_size == entry.size
    assert savepoint_folders(bucket).keys() == {info.manifest.savepoint_id}  # no leftover location


def test_responses_cut_off_mid_way_are_retried_and_the_streamed_savepoint_completes(stopped_checkpoint, bucket, proxy,
                                                                                     tmp_path):
    """A local checkpoint streamed to S3; every 7th response is cut off after the server acted (PUTs
    land, GET bodies arrive half), the lease and catalog writes included. (Every 11th gave 2 faults
    in the savepoint where Spark had compacted the checkpoint to ~26 files: its file count varies.)"""
    options = through(proxy)
    proxy.set_rules(Rule(action="drop", every=7))
    started = time.monotonic()
    info = take_savepoint(str(stopped_checkpoint), "job", savepoint_dir=f"s3://{bucket}/savepoints",
                          storage_options=options, parallelism=4)
    took = time.monotonic() - started
    trigger_faults = proxy.total_faults
    verify_savepoint(info.pointer, storage_options=options)
    restored = tmp_path / "restored"
    restore_savepoint(info.pointer, str(restored), storage_options=options)
    print(f"\ncut-off responses: trigger {took:.1f}s; with verify and restore: {proxy.figures()}, "
          f"{retried(proxy)} retried requests succeeded")
    assert trigger_faults >= 3 and any(m == "GET" and o == "drop" for m, _, o in proxy.log)  # 3-7 of ~26-50 requests
    on_locks = [(m, t, o) for m, t, o in proxy.log if t.endswith(("_inflight.json", "_catalog.lock"))]
    print(f"requests on the locks: {len(on_locks)}")
    # counted, not timed: one waiting for a lock to go stale would read it every 0.2 s for 30 s
    assert len(on_locks) <= 40, on_locks
    for entry in info.manifest.files:
        assert (restored / entry.path).read_bytes() == (stopped_checkpoint / entry.path).read_bytes()


@pytest.mark.parametrize("lock", ["_inflight.json", "_catalog.lock"])
def test_a_lost_response_to_a_lock_creation_does_not_block_the_trigger(bucket, proxy, lock):
    """The conditional PUT that creates a lock reaches S3 but its response is lost: botocore sends it
    again and gets 412 (the object exists: its own). The trigger must recognise its own lock, not
    report itself as "already in progress" (and block the job for 120 s) or wait 30 s for it to go stale."""
    options = through(proxy)
    proxy.set_rules(Rule(action="drop", methods={"PUT"}, path=lock, times=1))
    started = time.monotonic()
    info = take_savepoint(f"s3://{bucket}/checkpoint", "job", savepoint_dir=f"s3://{bucket}/savepoints",
                          storage_options=options, checkpoint_storage_options=options)
    took = time.monotonic() - started
    on_lock = [(method, outcome) for method, target, outcome in proxy.log if lock in target]
    print(f"\nlost {lock} response: trigger {took:.1f}s, {proxy.figures()}; requests on the lock: {on_lock}")
    assert proxy.total_faults == 1
    # counted, not timed: 7-9 requests on the lock (its create, the resend's 412, reads, release); one waiting
    # for it to go stale would read it every 0.2 s for 30 s, one refused as in flight would raise
    assert len(on_lock) <= 12, on_lock
    verify_savepoint(info.pointer, storage_options=options)
    assert not Store(f"s3://{bucket}/savepoints/job").exists("_inflight.json")  # released


@pytest.mark.parametrize("fault", [
    # every copy into the location failing is the CLI test's case below
    Rule(code="InternalError", methods={"PUT"}, path=MANIFEST),  # only the manifest
    # the manifest lands on the server every time, but every response is lost: 5 x 5 attempts (s3fs x botocore)
    pytest.param(Rule(action="drop", methods={"PUT"}, path=MANIFEST), marks=pytest.mark.slow),
], ids=["manifest-500", "manifest-response-lost"])
def test_persistent_s3_faults_fail_clearly_in_bounded_time_and_leave_nothing_complete(bucket, proxy, fault):
    options = through(proxy)
    proxy.set_rules(fault)
    started = time.monotonic()
    with pytest.raises(StorageError) as failure:
        take_savepoint(f"s3://{bucket}/checkpoint", "job", savepoint_dir=f"s3://{bucket}/savepoints",
                       storage_options=options, checkpoint_storage_options=options, parallelism=4)
    took = time.monotonic() - started
    print(f"\npersistent {fault.action} {fault.code if fault.action == 'error' else ''} on {fault.path}: "
          f"failed after {took:.1f}s with {failure.value.code}: {failure.value.message}; {proxy.figures()}")
    assert took < PERSISTENT_BOUND
    assert failure.value.code == "storage_error" and failure.value.hint
    assert f"s3://{bucket}/savepoints/job/savepoint-" in failure.value.message  # names the store and the file
    assert proxy.total_faults >= 2  # retried before giving up
    assert_nothing_complete_unless_verified(bucket)
    assert not any("_metadata" in files for files in savepoint_folders(bucket).values())
    assert [r.state.value for r in list_savepoints(Store(f"s3://{bucket}/savepoints"), "job")] in ([], ["failed"])
    proxy.set_rules()  # the store recovers: the next trigger works and is not blocked by a lease
    info = take_savepoint(f"s3://{bucket}/checkpoint", "job", savepoint_dir=f"s3://{bucket}/savepoints",
                          storage_options=options, checkpoint_storage_options=options)
    verify_savepoint(info.pointer, storage_options=options)


@pytest.mark.slow
def test_cli_reports_a_persistent_fault_as_an_error_code_and_a_restore_under_faults_leaves_the_target_empty(
        bucket, proxy, tmp_path):
    """The CLI, in its own process through the proxy: trigger fails with a JSON error naming the
    store; restore with every GET of the savepoint failing stops, and its target stays empty."""
    env = {**os.environ, "FSSPEC_S3_ENDPOINT_URL": proxy.url}
    cli = [sys.executable, "-m", "airflow_savepoints.cli.main"]
    root = f"s3://{bucket}/savepoints"
    proxy.set_rules(Rule(code="InternalError", methods={"PUT"}, path=SAVEPOINT_PUTS))
    started = time.monotonic()
    run = subprocess.run(cli + ["trigger", f"s3://{bucket}/checkpoint", "--job", "job", "--dir", root, "--json"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=PERSISTENT_BOUND + 30)
    took = time.monotonic() - started
    print(f"\nCLI trigger under persistent 500s: exit {run.returncode} after {took:.1f}s: {run.stdout.strip()}")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    error = json.loads(run.stdout)["error"]
    assert error["code"] == "storage_error" and f"{root}/job/savepoint-" in error["message"] and error["hint"]
    assert not any("_metadata" in files for files in savepoint_folders(bucket).values())

    proxy.set_rules()
    done = subprocess.run(cli + ["trigger", f"s3://{bucket}/checkpoint", "--job", "job", "--dir", root, "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    pointer = json.loads(done.stdout)["pointer"]
    proxy.set_rules(Rule(code="InternalError", methods={"GET"}, path=r"/savepoints/job/savepoint-.*/(state|offsets)/"))
    target = tmp_path / "restored"
    run = subprocess.run(cli + ["restore", pointer, "--to", str(target), "--json"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=PERSISTENT_BOUND + 30)
    print(f"CLI restore under persistent GET 500s: exit {run.returncode}: {run.stdout.strip()}; {proxy.figures()}")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    error = json.loads(run.stdout)["error"]
    assert error["code"] == "storage_error" and pointer in error["message"]
    assert not target.exists() or [p for p in target.rglob("*") if p.is_file()] == []
    shutil.rmtree(target, ignore_errors=True)
