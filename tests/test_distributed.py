"""The distributed test bed (tests/support/distributed.py): Airflow 3.3 with the CeleryExecutor on
Postgres and Redis, two Celery workers each on a "host" of its own (PID and UTS namespaces), a Spark
standalone cluster. One test bed serves every test of this module and is torn down even when a test
fails."""

from __future__ import annotations

import time

import pytest

from tests.support.distributed import distributed_testbed, missing_parts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def bed(tmp_path_factory, s3_endpoint):
    reason = missing_parts()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    with distributed_testbed(tmp_path_factory.mktemp("testbed"), s3_endpoint) as testbed:
        print(f"test bed up in {time.monotonic() - started:.0f}s")
        yield testbed


def test_tasks_run_on_the_worker_their_queue_names(bed):
    bed.wait_for_dags("testbed_hosts")
    run_id = bed.run("testbed_hosts")
    tis = bed.task_instances("testbed_hosts", run_id)
    seen = {}
    for worker in ("worker-a", "worker-b"):
        task_id = f"on_{worker.replace('-', '_')}"
        answer = bed.xcom("testbed_hosts", run_id, task_id)
        assert answer["hostname"] == worker, answer["hostname"]
        assert tis[task_id]["hostname"] == worker and tis[task_id]["queue"] == worker, tis[task_id]
        seen[worker] = answer["processes"]
        # pid 1 of the task's "host" is its own Celery worker
        assert f"--queues {worker}" in seen[worker]["1"], seen[worker]["1"]
    # neither worker sees the other's processes, nor the Airflow and Spark processes of the real host
    for worker, other in (("worker-a", "worker-b"), ("worker-b", "worker-a")):
        commands = " | ".join(seen[worker].values())
        assert f"--queues {other}" not in commands, commands
        assert "scheduler" not in commands and "org.apache.spark.deploy" not in commands, commands
    # the host sees both namespaces' pid 1 as different processes of its own
    assert bed.workers["worker-a"].pid1 != bed.workers["worker-b"].pid1
    inside = bed.in_worker("worker-b", ["sh", "-c", "hostname; cat /proc/1/cmdline | tr '\\0' ' '"]).stdout.splitlines()
    assert inside[0] == "worker-b" and "--queues worker-b" in inside[1], inside
