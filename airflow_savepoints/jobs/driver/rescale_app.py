"""The rescale of a restored checkpoint as a Spark application of its own, submitted through a job's submit path::

    spark-submit [the job's master, deploy mode and conf] rescale_app.py CHECKPOINT PARTITIONS BATCH RESULT [SINK]
    spark-submit [the same] rescale_app.py --standby FOLDER WAIT_SECONDS [OWNER]

Runs Spark's offline repartition on CHECKPOINT (an already restored copy, never a savepoint or a live
checkpoint) into PARTITIONS state partitions; it must commit BATCH. SINK: the job's file sink, whose log
gets the repartition batch. Writes ``result.json`` into the folder RESULT, read back by
:mod:`airflow_savepoints.jobs.workflows.rescale`: ``{"outcome": "rescaled", "partitions": {operator: count}}``,
or ``{"outcome": "failed", "error": {code, message, hint}}`` with Spark's error class mapped to our error
codes by :func:`airflow_savepoints.core.rescale.rewrite` (the in-process rescale's own mapping).
Imports pyspark and the package's core; no Airflow.

``--standby``: started before the job stops (an upgrade's rescale), it starts Spark, warms up, writes ``ready.json``
into FOLDER, then waits up to WAIT_SECONDS for ``request.json`` there (the four arguments above and the state store's
SQL conf) and carries it out as above, its ``result.json`` in FOLDER. ``{"cancel": true}`` ends it with nothing done;
so does the end of OWNER (``host:pid:start time``: the upgrade that started it), which also removes FOLDER: on
OWNER's host its process is watched; elsewhere (a driver in cluster mode) its sealed beats in ``owner.json``, and
:data:`OWNER_SILENCE` s without a new one end it (:class:`OwnerWatch`). Every file (and the result, in either mode)
is sealed with the secret the caller gave in the environment (``APP_SECRET_ENV`` of
:mod:`airflow_savepoints.jobs.description.trust`) or the redacted conf ``spark.savepoints.app.secret`` (a driver on
another host): a request (or beat) not sealed with it is ignored, with a log line, so a writer of the savepoint folder
cannot choose what is rewritten, nor what the caller believes was, nor keep a standby waiting.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

if __name__ == "__main__":  # run as a file: this folder's modules are no top-level modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from airflow_savepoints.core.names import RESCALE_OWNER_FILE, RESCALE_READY_FILE, RESCALE_REQUEST_FILE  # noqa: E402
from airflow_savepoints.errors import RescaleFailedError, StorageError  # noqa: E402
from airflow_savepoints.jobs.description import trust  # noqa: E402
from airflow_savepoints.jobs.description.files import process_started, same_process  # noqa: E402
from airflow_savepoints.jobs.driver.app_result import app_secret, run_and_report  # noqa: E402
from airflow_savepoints.storage import Store  # noqa: E402

log = logging.getLogger("airflow_savepoints.rescale_app")
STANDBY_FLAG = "--standby"
WARM_UP_FOLDER = "warm-up"
WARM_UP_BUDGET = 60.0  # seconds the warm-up may take (the upgrade waits up to 120 s for the standby to be ready)
EXECUTOR_WAIT = 10.0  # seconds the warm-up waits for a first executor on a cluster
SQL_CONF_PREFIX = "spark.sql."  # what a request may set in the running session: the state store's SQL settings
OWNER_BEAT_INTERVAL = 15.0  # seconds between an upgrade's beats to its standby on another host
OWNER_SILENCE = 120.0  # seconds without a new beat after which a standby on another host takes its upgrade for gone


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("airflow-savepoints-rescale").getOrCreate()
    if argv[1:2] == [STANDBY_FLAG]:
        return _standby(spark, Store(argv[2]), float(argv[3]), argv[4] if len(argv) > 4 else "")
    checkpoint, partitions, batch, result_folder, *sink = argv[1:]
    return _rescale(spark, checkpoint, int(partitions), int(batch), result_folder, sink[0] if sink else "")


def _rescale(spark, checkpoint: str, partitions: int, batch: int, result_folder: str, sink: str) -> int:
    from airflow_savepoints.core.rescale import rewrite

    destination = Store(checkpoint)

    def rescale() -> dict:
        after = rewrite(spark, destination, partitions, batch, Store(sink) if sink else None)
        return {"outcome": "rescaled", "batch_id": batch, "partitions": after}

    return run_and_report(spark, result_folder, rescale, lambda exc: RescaleFailedError(
        f"the rescale of {destination.url} failed: {type(exc).__name__}: {str(exc)[:2000]}",
        "nothing was restored; fix the cause and retry into a new, empty checkpoint location"))


def _warm_up(spark, scratch: Store, budget: float = WARM_UP_BUDGET) -> None:
    """A tiny stateful query's one batch and its rewrite into one more partition, in ``scratch`` (inside the standby's
    folder on the savepoint store, removed with it), with the job's state store settings: the first rewrite of a
    new application loads classes, generates code and loads RocksDB, here while the job still runs. Skipped when
    no executor has joined (a cluster whose cores the job holds: it would wait for the stop); Spark's jobs are
    cancelled after ``budget`` s. A failure is logged and changes nothing else."""
    from airflow_savepoints.core.rescale import rewrite

    began = time.monotonic()
    if not _executors_joined(spark, min(EXECUTOR_WAIT, budget)):
        print("airflow-savepoints: no executor yet (the job holds the cores?): no warm-up", file=sys.stderr, flush=True)
        return
    timer = threading.Timer(max(budget - (time.monotonic() - began), 1.0), spark.sparkContext.cancelAllJobs)
    timer.start()
    try:
        scratch.write_bytes_atomic("input/0.json", b'{"id": 1}\n{"id": 2}\n')
        query = (spark.readStream.schema("id long").json(scratch.child("input").spark_url_of()).dropDuplicates(["id"])
                 .writeStream.format("json").option("checkpointLocation", scratch.child("checkpoint").spark_url_of())
                 .trigger(availableNow=True).start(scratch.child("output").spark_url_of()))
        query.awaitTermination()
        rewrite(spark, scratch.child("checkpoint"), int(spark.conf.get("spark.sql.shuffle.partitions")) + 1, 1)
        print(f"airflow-savepoints: warmed up in {time.monotonic() - began:.1f}s", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - a warm-up only: the request is carried out all the same
        log.warning("the warm-up failed (the rewrite will start cold): %s", str(exc)[:500])
    finally:
        timer.cancel()


def owner_of_this_process() -> str:
    """``host:pid:start time`` of this process: what a standby it starts watches (:class:`OwnerWatch`)."""
    return f"{socket.gethostname()}:{os.getpid()}:{process_started(os.getpid())}"


class OwnerWatch:
    """Whether the upgrade ``owner`` (``host:pid:start time``) that started a standby still runs. On its host: its
    process (:func:`~airflow_savepoints.jobs.description.files.same_process`). Elsewhere (a driver in cluster mode):
    its beats, ``owner.json`` in ``folder`` sealed with ``secret``, read every ``check_every`` s; gone after
    ``silence`` s without a new one (timed by this process's clock from the first look: no clock is compared).
    No owner given: never gone."""

    def __init__(self, owner: str, folder: Store, secret: str, silence: float = OWNER_SILENCE, check_every: float = 5.0,
                 on_forged: Callable[[str], None] = lambda url: None):
        host, _, rest = owner.partition(":")
        pid, _, started = rest.partition(":")
        try:
            self.process = (int(pid), float(started)) if host == socket.gethostname() else None
        except ValueError:
            self.process, owner = None, ""
        self.watched = bool(owner)
        self.folder, self.secret, self.silence, self.check_every = folder, secret, silence, check_every
        self.on_forged = on_forged
        self.last_beat = 0  # the highest count heard: an old beat written again is no new one
        self.heard = self.looked = time.monotonic()

    def gone(self) -> bool:
        if not self.watched:
            return False
        if self.process is not None:
            return same_process(*self.process) is None
        now = time.monotonic()
        if now - self.looked >= self.check_every:
            self.looked = now
            with contextlib.suppress(StorageError):  # a read that failed heard nothing
                count = (trust.read_sealed(self.folder, RESCALE_OWNER_FILE, self.secret, self.on_forged) or {}).get("beat")
                if isinstance(count, int) and count > self.last_beat:
                    self.last_beat, self.heard = count, now
        return now - self.heard > self.silence


def _executors_joined(spark, wait: float) -> bool:
    """Whether an executor runs tasks for this application within ``wait`` s (a local master's driver does)."""
    if spark.sparkContext.master.startswith("local"):
        return True
    deadline = time.monotonic() + wait
    while spark.sparkContext._jsc.sc().getExecutorIds().isEmpty():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def _standby(spark, folder: Store, wait: float, owner: str = "") -> int:
    """Ready, then the one sealed request (or none within ``wait`` s, or a cancel: Spark stopped, nothing done).
    ``owner`` (``host:pid:start time``, see :func:`owner_of_this_process`): the upgrade that started it. When that
    process is gone (killed before it asked or cancelled), the standby stops Spark and removes its folder."""
    secret = app_secret(spark)
    if not secret:
        log.error("no secret given (%s or %s): nothing is done", trust.APP_SECRET_ENV, trust.APP_SECRET_CONF)
        spark.stop()
        return 1
    spark.streams  # noqa: B018 - the StateStoreCoordinator the rewrite needs, registered while the job still runs
    _warm_up(spark, folder.child(WARM_UP_FOLDER))
    trust.write_sealed(folder, RESCALE_READY_FILE, {"application_id": spark.sparkContext.applicationId,
                                                    "spark_version": spark.version}, secret)
    deadline = time.monotonic() + wait
    forged = trust.once_per_file(lambda url: log.warning("%s is not sealed with this standby's secret: ignored", url))
    watch = OwnerWatch(owner, folder, secret, on_forged=forged)
    while time.monotonic() < deadline:
        request = trust.read_sealed(folder, RESCALE_REQUEST_FILE, secret, forged)
        if request is not None:
            if request.get("cancel"):
                break
            for key, value in (request.get("conf") or {}).items():
                if key.startswith(SQL_CONF_PREFIX):
                    spark.conf.set(key, value)
            return _rescale(spark, request["checkpoint"], int(request["partitions"]), int(request["batch"]),
                            folder.url, request.get("sink") or "")
        if watch.gone():
            print(f"airflow-savepoints: the upgrade that started this standby ({owner}) is gone: ending",
                  file=sys.stderr, flush=True)
            spark.stop()
            folder.parent().remove_tree(folder.name)
            return 0
        time.sleep(folder.poll_interval)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
