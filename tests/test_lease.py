"""The one lease implementation (core/lease.py): real files, real processes racing, the moto S3 server."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from airflow_savepoints.core.lease import Lease, owner_id, store_now
from airflow_savepoints.storage import Store

FORK = multiprocessing.get_context("fork")
GARBAGE = [b"[]", b"null", b'{"token": "x", "owner": "h:1", "heartbeat_at": "soon"}', b'{"token": 7}', b"",
           b"\xff\xfe{", b'{"facts": [], "token": "t"}']


def _race(url: str, name: str, stale_after: float, start_at: float, queue, s3: bool) -> None:
    if s3:
        import fsspec

        fsspec.get_filesystem_class("s3").clear_instance_cache()  # no event loop inherited from the parent
    lease = Lease(Store(url), name, stale_after=stale_after)
    while time.time() < start_at:
        pass
    holder = lease.try_acquire()
    queue.put((lease.token, holder is None))
    time.sleep(0.5 if holder is None else 0)  # hold it while the others look


def race(url: str, name: str, processes: int = 10, stale_after: float = 30.0, s3: bool = False) -> list[str]:
    """``processes`` forked processes call try_acquire at the same instant; the tokens of the winners."""
    queue = FORK.Queue()
    start_at = time.time() + 0.5
    workers = [FORK.Process(target=_race, args=(url, name, stale_after, start_at, queue, s3)) for _ in range(processes)]
    for w in workers:
        w.start()
    results = [queue.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    return [token for token, won in results if won]


def test_ten_processes_racing_for_a_free_lease_one_wins(tmp_path):
    for round_ in range(3):
        winners = race(str(tmp_path), f"lease{round_}")
        assert len(winners) == 1, winners
        assert json.loads((tmp_path / f"lease{round_}").read_text())["token"] == winners[0]


def test_ten_processes_racing_to_break_a_stale_lease_one_wins(tmp_path):
    """Ten breakers judge the same dead lease stale at once: exactly one takes it; no breaker
    removes the fresh lease the winner took meanwhile."""
    for round_ in range(3):
        path = tmp_path / f"lease{round_}"
        path.write_text(json.dumps({"token": "dead", "owner": "gone:1"}))
        os.utime(path, (time.time() - 60, time.time() - 60))
        winners = race(str(tmp_path), path.name, stale_after=5.0)
        assert len(winners) == 1, winners
        assert json.loads(path.read_text())["token"] == winners[0]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".break") or p.name.endswith(".tmp")]


def test_a_breaker_that_judged_an_old_lease_never_removes_a_fresh_one(tmp_path):
    store = Store(str(tmp_path))
    (tmp_path / "lease").write_text(json.dumps({"token": "dead"}))
    os.utime(tmp_path / "lease", (time.time() - 60, time.time() - 60))
    slow, fast = Lease(store, "lease", stale_after=5), Lease(store, "lease", stale_after=5)
    judged = slow.read()
    assert judged is not None and judged.stale and judged.token == "dead"
    assert fast.try_acquire() is None  # breaks the dead lease and takes it
    assert slow._break(judged) is False  # the lease slow judged is gone: the fresh one stays
    assert fast.held() and slow.try_acquire().token == fast.token


def test_content_is_complete_the_moment_the_lease_is_visible(tmp_path):
    """A reader polling the lease path while others create and release it never sees it partial."""
    store = Store(str(tmp_path))
    stop = FORK.Event()

    def churn() -> None:
        lease = Lease(Store(str(tmp_path)), "lease", stale_after=30, facts={"pad": "x" * 20000})
        while not stop.is_set():
            if lease.try_acquire() is None:
                lease.release()

    workers = [FORK.Process(target=churn) for _ in range(3)]
    for w in workers:
        w.start()
    seen = partial = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            data = (tmp_path / "lease").read_bytes()
        except FileNotFoundError:
            continue
        seen += 1
        try:
            json.loads(data)
        except ValueError:
            partial += 1
    stop.set()
    for w in workers:
        w.join(30)
    assert seen > 50 and partial == 0, (seen, partial)
    assert store.list_files() == {}  # no temp file left behind


@pytest.mark.parametrize("garbage", GARBAGE, ids=repr)
def test_garbage_in_a_lease_never_crashes_and_goes_stale_on_time(tmp_path, garbage):
    (tmp_path / "lease").write_bytes(garbage)
    written = (tmp_path / "lease").stat().st_mtime
    lease = Lease(Store(str(tmp_path)), "lease", stale_after=1.0)
    holder = lease.try_acquire()
    assert holder is not None and not holder.stale and holder.token != lease.token
    assert lease.acquire(timeout=10, poll=0.1) is None  # taken within its 10 s
    assert time.time() - written >= 1.0  # and not before the garbage was 1 s old (a load only makes it later)
    assert json.loads((tmp_path / "lease").read_bytes())["token"] == lease.token


def test_a_lease_from_the_future_goes_stale_after_the_timeout(tmp_path):
    path = tmp_path / "lease"
    path.write_text(json.dumps({"token": "future", "owner": "skewed:1"}))
    os.utime(path, (time.time() + 3600, time.time() + 3600))
    lease = Lease(Store(str(tmp_path)), "lease", stale_after=1.5)
    started = time.monotonic()  # before its first sighting: it goes stale 1.5 s after that
    state = lease.read()
    assert state.age_s is None and not state.stale
    assert lease.acquire(timeout=10, poll=0.1) is None  # taken within its 10 s
    assert time.monotonic() - started >= 1.5


def test_staleness_reads_the_stores_clock_not_the_timestamps_in_the_file(tmp_path):
    """A live lease whose content claims an old heartbeat is not stale; a dead one that claims a
    heartbeat in the future is stale once its mtime is old."""
    store = Store(str(tmp_path))
    (tmp_path / "a").write_text(json.dumps({"token": "a", "heartbeat_at": 0, "at": 0}))
    (tmp_path / "b").write_text(json.dumps({"token": "b", "heartbeat_at": time.time() + 1e6, "at": time.time() + 1e6}))
    os.utime(tmp_path / "b", (time.time() - 100, time.time() - 100))
    assert not Lease(store, "a", stale_after=30).read().stale
    state = Lease(store, "b", stale_after=30).read()
    assert state.stale and 95 < state.age_s < 110
    assert abs(store_now(store, fresh=True) - time.time()) < 2  # one machine: the store's clock is ours


def test_renew_release_and_takeover(tmp_path):
    store = Store(str(tmp_path))
    first = Lease(store, "lease", token="run-1", stale_after=1.0, facts={"host": "a"})
    assert first.try_acquire() is None
    assert first.renew(application_id="app-7")
    state = Lease(store, "lease", stale_after=1.0).read()
    assert (state.token, state.owner, state.facts) == ("run-1", owner_id(), {"host": "a", "application_id": "app-7"})
    time.sleep(1.3)  # first stops renewing: its lease goes stale
    second = Lease(store, "lease", token="run-2", stale_after=1.0)
    assert second.try_acquire() is None
    assert first.renew() is False and first.release() is False  # the fencing token tells them apart
    assert Lease(store, "lease", stale_after=1.0).read().token == "run-2"
    assert second.release() and not (tmp_path / "lease").exists()


def test_a_heartbeat_keeps_the_lease_and_notices_a_takeover(tmp_path):
    store = Store(str(tmp_path))
    holder = Lease(store, "lease", stale_after=1.0)
    assert holder.try_acquire() is None
    holder.start_heartbeat()
    time.sleep(2.5)
    other = Lease(store, "lease", stale_after=1.0)
    assert other.try_acquire().token == holder.token  # renewed: never stale
    (tmp_path / "lease").write_text(json.dumps({"token": "intruder"}))  # someone else's lease now
    deadline = time.monotonic() + 3
    while not holder.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder.lost and not holder.release()
    assert json.loads((tmp_path / "lease").read_text())["token"] == "intruder"


@pytest.mark.s3
def test_on_s3_one_of_ten_wins_and_garbage_recovers(s3):
    url = f"s3://{s3}/leases"
    winners = race(url, "lease", processes=10, s3=True)
    assert len(winners) == 1
    store = Store(url)
    assert json.loads(store.read_bytes("lease"))["token"] == winners[0]
    before_write = time.time()
    store.write_bytes_atomic("garbage", b"[]")
    lease = Lease(store, "garbage", stale_after=2.0)
    assert lease.try_acquire() is not None  # fresh on the store's clock
    assert lease.acquire(timeout=15, poll=0.2) is None  # taken within its 15 s
    assert time.time() - before_write >= 1.0  # 2 s after its mtime, which S3 rounds down to the second
    assert lease.release() and not store.exists("garbage")
    assert not [n for n in store.listdir() if n.endswith(".tmp") or n.endswith(".break")]
