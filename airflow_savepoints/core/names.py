"""The names of the files the package writes, in one place.

Layout of a savepoint directory::

    <savepoint dir>/<job>/
        _catalog.json  _catalog.lock     the job's catalog and its short lock
        _inflight.json                   the single-flight lease of a savepoint being taken
        _lease.json  _run.json           the run lease and the run a start launched
        _watchdog.json                   the watchdog's restarts and last decision
        _metrics.json  _autoscale.json   the run's metric series and the autoscaler's decisions
        _autoscale.lease _autoscale.lock the acting autoscaler's lease and its decision history's short lock
        _control/<run id>/*.json         a run's control folder
        _state_summaries/<id>.json       a savepoint's state summary (InspectSavepointOperator)
        _check/<check id>/               an upgrade check's scratch copy and result, removed after the check
        _rescale/<id>/ _inspect/<id>/    a rescale's or an inspection's result, removed once read (any of these
                                         a killed process left: by the job's next of its kind, a day on)
        savepoint-<id6>-<random>/_metadata  a savepoint, complete once _metadata exists
"""

from __future__ import annotations

from airflow_savepoints.checkpoint.formats import METADATA_FILE

MANIFEST_FILE = "_metadata"  # a savepoint's manifest, written last
CHECKPOINT_METADATA = METADATA_FILE  # Spark's own file of a checkpoint (the query id), written last on restore

CATALOG_FILE = "_catalog.json"
CATALOG_LOCK = "_catalog.lock"
INFLIGHT_LEASE = "_inflight.json"  # single flight per job while a savepoint is taken
RUN_LEASE = "_lease.json"  # one live run per job
RUN_FILE = "_run.json"  # the run a start launched
WATCHDOG_FILE = "_watchdog.json"  # the watchdog's restarts and decisions (jobs/workflows/watchdog.py)
METRICS_FILE = "_metrics.json"  # the run's last batches' progress, bounded (jobs/description/metrics.py)
AUTOSCALE_FILE = "_autoscale.json"  # the autoscaler's last decisions, bounded (jobs/workflows/autoscale.py)
AUTOSCALE_LEASE = "_autoscale.lease"  # one acting autoscaler per job: held while it decides and acts
AUTOSCALE_LOCK = "_autoscale.lock"  # held while a decision is added to _autoscale.json (no lost record)
RESTORE_CLAIM = "_restore.lease"  # in a restore target while it is written

CONTROL_FOLDER = "_control"
ANNOUNCE_FILE = "job.json"
HEARTBEAT_FILE = "heartbeat.json"
STOP_REQUEST_FILE = "stop-request.json"
STOPPED_FILE = "stopped.json"
FAILED_FILE = "failed.json"
FENCED_FILE = "fenced.json"

CHECK_FOLDER = "_check"  # <job>/_check/<check id>/: an upgrade check's scratch (jobs/workflows/check.py)
CHECK_RESULT_FILE = "result.json"  # what the checked version's driver found, beside its scratch checkpoint
RESCALE_FOLDER = "_rescale"  # <job>/_rescale/<id>/: the result of a job's rescale application (jobs/workflows/rescale.py)
RESCALE_READY_FILE = "ready.json"  # a standby rescale application's Spark is up (jobs/driver/rescale_app.py)
RESCALE_OWNER_FILE = "owner.json"  # the upgrade that started a standby beats here while it lives, sealed
RESCALE_REQUEST_FILE = "request.json"  # what a standby rescale application is asked to rewrite, sealed
INSPECT_FOLDER = "_inspect"  # <job>/_inspect/<id>/: the summary a job's inspection application read (jobs/workflows/inspect.py)

LEASE_BREAK_SUFFIX = ".break"  # ``<lease>.break``: held while a stale lease is broken
CLOCK_PROBE_PREFIX = "._clock."  # ``._clock.<hex>.tmp``: a probe of the store's clock
STATE_SUMMARIES_FOLDER = "_state_summaries"  # ``<savepoint id>.json``: a savepoint's state summary, kept beside it
