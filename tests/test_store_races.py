"""Exclusive create between processes, on every store with an atomic one: 10 processes, each with its
own client, race for one job's lease; exactly one wins and the lease holds its bytes (local disk,
moto's S3 server, fake-gcs-server, Azurite; a process spawns in seconds, hence slow)."""

from __future__ import annotations

import multiprocessing

import pytest

from airflow_savepoints.storage import Store
from tests.unit.storage.test_backends import AZURE, EMULATED, GCS, S3


@pytest.fixture
def folder(request, tmp_path) -> str:
    """The URL of an empty folder on the store the test is parametrized with."""
    if request.param == "local":
        return str(tmp_path / "job")
    url, bucket = EMULATED[request.param]
    return url.format(request.getfixturevalue(bucket))


def _race_for_lease(url: str, racer: int, barrier, wins) -> None:
    """One racing process: create the lease once all racers are ready."""
    store = Store(url)
    barrier.wait(timeout=120)
    if store.create_exclusive("_lease.json", f'{{"owner": "racer {racer}"}}'.encode()):
        wins.put(racer)


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["local", S3, GCS, AZURE], indirect=True)
def test_ten_processes_racing_for_a_lease_have_exactly_one_winner(folder):
    context = multiprocessing.get_context("spawn")  # each racer its own client and connections
    barrier, wins = context.Barrier(10), context.Queue()
    racers = [context.Process(target=_race_for_lease, args=(folder, i, barrier, wins)) for i in range(10)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=300)
    assert [racer.exitcode for racer in racers] == [0] * 10
    winners = [wins.get(timeout=10) for _ in range(wins.qsize())] if wins.qsize() else []
    assert len(winners) == 1, winners
    assert Store(folder).read_bytes("_lease.json") == f'{{"owner": "racer {winners[0]}"}}'.encode()
