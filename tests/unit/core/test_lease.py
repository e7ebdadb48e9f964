"""The lease module (``core/lease.py``) in one process: a lease's life, staleness by the store's
mtime, and the job's single-flight lease. Races between processes: tests/test_lease.py."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from airflow_savepoints.core.lease import LOCK_FILE, JobLock, Lease, owner_id, store_now
from airflow_savepoints.storage import Store


def age(path, seconds: float) -> None:
    """Set a file's mtime ``seconds`` into the past (the local store's clock is the disk's)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_owner_is_host_and_pid():
    assert owner_id() == f"{socket.gethostname()}:{os.getpid()}"


def test_store_now_is_the_stores_clock_and_leaves_no_probe(tmp_path):
    store = Store(str(tmp_path))
    assert abs(store_now(store, fresh=True) - time.time()) < 5
    assert os.listdir(tmp_path) == []


def test_acquire_read_renew_release(tmp_path):
    store = Store(str(tmp_path))
    lease = Lease(store, "x.lease", token="run-1", stale_after=30, facts={"a": 1})
    assert lease.try_acquire() is None and lease.held()
    state = Lease(store, "x.lease", stale_after=30).read()
    assert (state.token, state.owner, state.facts, state.stale, state.readable) == ("run-1", owner_id(), {"a": 1}, False, True)
    assert lease.renew(b=2) and Lease(store, "x.lease", stale_after=30).read().facts == {"a": 1, "b": 2}
    other = Lease(store, "x.lease", stale_after=30)
    assert other.try_acquire().token == "run-1"  # busy: the holder's state
    assert not other.release() and lease.held()  # not other's to release
    assert lease.release() and not (tmp_path / "x.lease").exists()
    assert not lease.renew()  # gone: nothing rewritten
    assert not (tmp_path / "x.lease").exists()


def test_a_lease_not_renewed_in_time_is_stale_and_broken(tmp_path):
    store = Store(str(tmp_path))
    dead = Lease(store, "x.lease", token="dead", stale_after=5)
    assert dead.try_acquire() is None
    age(tmp_path / "x.lease", 60)
    assert Lease(store, "x.lease", stale_after=5).read().stale
    taker = Lease(store, "x.lease", token="new", stale_after=5)
    assert taker.try_acquire() is None
    assert Lease(store, "x.lease", stale_after=5).read().token == "new"
    assert not dead.held() and not dead.renew()  # the old holder learns it lost the lease
    assert sorted(os.listdir(tmp_path)) == ["x.lease"]  # no break lock or temp file left


@pytest.mark.parametrize("garbage", [b"", b"[]", b"null", b"{", b'{"token": 5}'])
def test_an_unreadable_lease_is_judged_by_its_mtime_and_never_raises(tmp_path, garbage):
    (tmp_path / "x.lease").write_bytes(garbage)
    store = Store(str(tmp_path))
    state = Lease(store, "x.lease", stale_after=5).read()
    assert (state.token, state.readable, state.stale) == (None, False, False)
    age(tmp_path / "x.lease", 60)
    assert Lease(store, "x.lease", token="t", stale_after=5).try_acquire() is None


def test_a_lease_is_judged_by_its_holders_stale_time_not_the_readers(tmp_path):
    store = Store(str(tmp_path))
    short = Lease(store, "short.lease", token="short", stale_after=5)
    long = Lease(store, "long.lease", token="long", stale_after=600)
    assert short.try_acquire() is None and long.try_acquire() is None
    age(tmp_path / "short.lease", 10)
    age(tmp_path / "long.lease", 300)  # two of its holder's heartbeats (every 150 s) late at most: alive
    for reader_stale_after in (1, 120):
        assert Lease(store, "short.lease", stale_after=reader_stale_after).read().stale
        state = Lease(store, "long.lease", stale_after=reader_stale_after).read()
        assert not state.stale and state.stale_after == 600
    assert Lease(store, "long.lease", token="eager", stale_after=1).try_acquire().token == "long"  # not broken
    assert long.held()
    job = Store(str(tmp_path / "job"))
    dead = JobLock(job, request_id="req-1", stale_after=5)  # a trigger with a short lock_stale_after, killed
    assert dead.try_acquire() is None
    dead.set_savepoint("savepoint-abc-0123456789ab")
    dead.lease.stop_heartbeat()
    age(tmp_path / "job" / LOCK_FILE, 10)
    assert JobLock(job, request_id=None).live_savepoint() is None  # retention, dispose: default 120 s


@pytest.mark.parametrize("declared", [0, -5, 1e12, "30", True, None])
def test_a_lease_that_declares_no_usable_stale_time_is_judged_by_the_readers(tmp_path, declared):
    body = {"format": "airflow-savepoints/lease", "token": "t", "owner": "h:1", "facts": {}, "stale_after": declared}
    (tmp_path / "x.lease").write_text(json.dumps(body))
    age(tmp_path / "x.lease", 60)
    state = Lease(Store(str(tmp_path)), "x.lease", stale_after=30).read()
    assert (state.stale, state.stale_after, state.readable) == (True, 30, True)
    assert not Lease(Store(str(tmp_path)), "x.lease", stale_after=90).read().stale


def test_the_job_lease_names_its_request_and_location(tmp_path):
    job = Store(str(tmp_path / "job"))
    lock = JobLock(job, request_id="req-1", stale_after=30)
    assert lock.current() is None and JobLock.is_stale(None)
    assert lock.try_acquire() is None
    lock.set_savepoint("savepoint-abc-0123456789ab")
    holder = JobLock(job, request_id="req-2").current()
    assert (holder.request_id, holder.savepoint_id, holder.owner, holder.stale) == (
        "req-1", "savepoint-abc-0123456789ab", owner_id(), False)
    assert abs(holder.started_at - time.time()) < 60 and not JobLock.is_stale(holder)
    busy = JobLock(job, request_id="req-2").try_acquire()
    assert busy is not None and busy.request_id == "req-1"
    assert lock.still_held()
    lock.release()
    assert not (tmp_path / "job" / LOCK_FILE).exists()


def test_abandon_removes_only_this_process_lease_for_that_location(tmp_path):
    job = Store(str(tmp_path / "job"))
    lock = JobLock(job, request_id=None)
    assert lock.try_acquire() is None
    lock.set_savepoint("savepoint-abc-0123456789ab")
    lock.lease.stop_heartbeat()
    assert not JobLock.abandon(job, "savepoint-abc-ffffffffffff")  # another location: kept
    path = tmp_path / "job" / LOCK_FILE
    body = json.loads(path.read_bytes())
    path.write_text(json.dumps({**body, "owner": "elsewhere:1"}))
    assert not JobLock.abandon(job, "savepoint-abc-0123456789ab")  # another process: kept
    path.write_text(json.dumps(body))
    assert JobLock.abandon(job, "savepoint-abc-0123456789ab") and not path.exists()


def test_a_lease_read_gone_is_no_longer_believed_its_holders_own(tmp_path):
    """A lease removed by hand (its holder judged dead) and taken by a second run: the first run's check
    before ``_metadata`` reads it gone, and its release then reads before it removes: the second run's lease stays."""
    job = Store(str(tmp_path / "job"))
    first = JobLock(job, request_id="first")
    assert first.try_acquire() is None
    first.set_savepoint("savepoint-abc-0123456789ab")
    (tmp_path / "job" / LOCK_FILE).unlink()
    second = JobLock(job, request_id="second")
    assert second.try_acquire() is None
    assert first.lease.recent and not first.still_held()
    assert not first.lease.recent
    first.release()
    assert JobLock(job, request_id=None).current().request_id == "second"
    second.release()


def test_a_lease_removed_for_its_holder_in_this_process_is_no_longer_believed_its_own(tmp_path):
    """A holder trusts its own recent write (its release removes the lease without reading it first), but not
    once ``JobLock.abandon`` removed it for the holder (a killed task's clean-up): a new holder's lease stays."""
    job = Store(str(tmp_path / "job"))
    first = JobLock(job, request_id="first")
    assert first.try_acquire() is None
    first.set_savepoint("savepoint-abc-0123456789ab")
    assert first.lease.recent
    assert JobLock.abandon(job, "savepoint-abc-0123456789ab")
    second = JobLock(job, request_id="second")
    assert second.try_acquire() is None
    assert not first.lease.recent
    first.release()
    assert JobLock(job, request_id=None).current().request_id == "second"
    second.release()
