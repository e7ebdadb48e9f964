"""Exclusive create between processes, on every store with an atomic one: 10 processes, each with its
own client, race for one job's lease; exactly one wins and the lease holds its bytes. The same 10
then each record a savepoint in the job's catalog at once (read-modify-write under the catalog
lock): all 10 records are there, none lost (local disk, moto's S3 server, fake-gcs-server,
Azurite, a NameNode through hdfs-native; a process spawns in seconds, hence slow)."""

from __future__ import annotations

import multiprocessing
import sys

import pytest

from airflow_savepoints.core.catalog import Catalog, SavepointState
from airflow_savepoints.core.models import SavepointType
from airflow_savepoints.core.names import CATALOG_LOCK
from airflow_savepoints.storage import Store
from tests.unit.storage.test_backends import AZURE, EMULATED, GCS, HDFS, S3


@pytest.fixture
def folder(request, tmp_path) -> str:
    """The URL of an empty folder on the store the test is parametrized with."""
    if request.param == "local":
        return str(tmp_path / "job")
    url, bucket = EMULATED[request.param]
    return url.format(request.getfixturevalue(bucket))


def savepoint_of(racer: int) -> str:
    return f"savepoint-racer{racer % 10}-{racer:012x}"


def _race_for_lease(url: str, racer: int, barrier, wins) -> None:
    """One racing process: create the lease once all racers are ready, then (all at once again)
    record its own savepoint in the catalog."""
    store = Store(url)
    barrier.wait(timeout=120)
    if store.create_exclusive("_lease.json", f'{{"owner": "racer {racer}"}}'.encode()):
        wins.put(racer)
    barrier.wait(timeout=120)
    Catalog(store, "job").begin(savepoint_of(racer), SavepointType.MANUAL, f"racer {racer}", None)


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["local", S3, GCS, AZURE, HDFS], indirect=True)
def test_ten_processes_racing_for_a_lease_have_one_winner_and_lose_no_catalog_update(folder):
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
    records = Catalog(Store(folder), "job").records()
    assert sorted(r.savepoint_id for r in records) == sorted(savepoint_of(i) for i in range(10))  # none lost
    assert {r.state for r in records} == {SavepointState.IN_PROGRESS} and not Store(folder).exists(CATALOG_LOCK)


@pytest.mark.s3
def test_the_s3_emulator_grants_a_racing_conditional_create_once(s3_endpoint):
    """The emulator keeps S3's promise that the lease and catalog lock rely on: of creates racing with
    ``If-None-Match: *``, exactly one succeeds (``conftest.atomic_conditional_puts``; moto alone let two through)."""
    import threading

    import botocore.session
    from botocore.exceptions import ClientError

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="testing",
        aws_secret_access_key="testing")
    client.create_bucket(Bucket="conditional-race")

    def create(key: str, racer: int, barrier: threading.Barrier, outcomes: list) -> None:
        barrier.wait(timeout=30)
        try:
            client.put_object(Bucket="conditional-race", Key=key, Body=str(racer).encode(), IfNoneMatch="*")
            outcomes.append(racer)
        except ClientError as exc:
            outcomes.append(exc.response["Error"]["Code"])

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the server's threads switch inside its check-then-write: a race shows
    try:
        for round_ in range(60):
            key, barrier, outcomes = f"lock-{round_}", threading.Barrier(8), []
            threads = [threading.Thread(target=create, args=(key, i, barrier, outcomes)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            granted = [o for o in outcomes if isinstance(o, int)]
            assert len(outcomes) == 8 and len(granted) == 1, (round_, outcomes)
            assert set(outcomes) - set(granted) == {"PreconditionFailed"}, outcomes
            assert client.get_object(Bucket="conditional-race", Key=key)["Body"].read() == str(granted[0]).encode()
    finally:
        sys.setswitchinterval(switch)
