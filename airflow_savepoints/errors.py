"""Every failure the package reports on purpose.

Each error names the thing at fault and says how to fix it (``hint``). The CLI prints both and exits
non-zero; operators re-raise them. ``code`` is a stable short name for scripts and JSON output.
"""

from __future__ import annotations


class SavepointError(Exception):
    """Base class: a failure with a message for humans and a hint on how to fix it."""

    code = "error"

    def __init__(self, message: str, hint: str | None = None, cause: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.cause = cause  # what another system said, as it said it (Spark's error class and message)

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def to_dict(self) -> dict[str, str | None]:
        found = {"code": self.code, "message": self.message, "hint": self.hint}
        return found if self.cause is None else {**found, "cause": self.cause}


def reported(error: dict, default: type[SavepointError], family: type[SavepointError] = SavepointError,
             unnamed: str | None = None) -> SavepointError:
    """The typed error another process reported as its ``to_dict()``: the error of ``family`` with its code
    (``default`` for any other code), its message (``unnamed``, else ``<code> without a message``, when it gave none)."""
    def subclasses(kind: type[SavepointError]):
        for sub in kind.__subclasses__():
            yield sub
            yield from subclasses(sub)

    kind = next((k for k in subclasses(family) if k.code == error.get("code")), default)
    cause = error.get("cause")
    return kind(str(error.get("message") or unnamed or f"{default.code} without a message"), error.get("hint"),
                cause=str(cause) if cause is not None else None)


# --- bad input -------------------------------------------------------------------------------------
class InvalidInputError(SavepointError):
    code = "invalid_input"


class InvalidJobNameError(InvalidInputError):
    code = "invalid_job_name"


class InvalidPathError(InvalidInputError):
    code = "invalid_path"


class NoSavepointDirError(InvalidInputError):
    code = "no_savepoint_dir"


# --- storage ---------------------------------------------------------------------------------------
class StorageError(SavepointError):
    code = "storage_error"


class StorageUnreachableError(StorageError):
    """Nothing answered at the store's address (connection refused, no route, timed out)."""

    code = "storage_unreachable"


class UnknownSchemeError(StorageError):
    code = "unknown_scheme"


class MissingBackendError(StorageError):
    code = "missing_backend"


class CredentialsError(StorageError):
    code = "missing_credentials"


class StoragePermissionError(StorageError):
    code = "permission_denied"


class StorageFullError(StorageError):
    code = "storage_full"


class OutsideRootError(StorageError):
    code = "outside_root"


class UnsafeFileError(StorageError):
    """A file of a known name (``storage/known_files.py``) that is no plain, small, well-formed file:
    whoever may write the savepoint folder put something else there. Nothing was read past its cap."""

    code = "unsafe_file"


class NotARegularFileError(UnsafeFileError):
    """A folder, FIFO, socket or device (an object store: a key prefix) where a file is expected."""

    code = "not_a_regular_file"


class FileTooLargeError(UnsafeFileError):
    code = "file_too_large"


class MalformedFileError(UnsafeFileError):
    """Not UTF-8, not JSON, or JSON nested deeper than any file of ours."""

    code = "malformed_file"


# --- the live checkpoint ---------------------------------------------------------------------------
class CheckpointError(SavepointError):
    code = "checkpoint_error"


class CheckpointNotFoundError(CheckpointError):
    code = "checkpoint_not_found"


class NotACheckpointError(CheckpointError):
    code = "not_a_checkpoint"


class NoCommittedBatchError(CheckpointError):
    code = "no_committed_batch"


class CheckpointRaceError(CheckpointError):
    """The checkpoint changed under the copy (Spark replaced or purged a planned file). Retried."""

    code = "checkpoint_race"


class SavepointRetriesExhaustedError(CheckpointError):
    code = "retries_exhausted"


# --- savepoints and pointers -----------------------------------------------------------------------
class PointerError(SavepointError):
    code = "pointer_error"


class SavepointNotFoundError(PointerError):
    code = "savepoint_not_found"


class SavepointRootMissingError(SavepointNotFoundError):
    code = "savepoint_root_not_found"


class IncompleteSavepointError(PointerError):
    code = "incomplete_savepoint"


class ManifestUnreadableError(PointerError):
    code = "manifest_unreadable"


class ManifestCorruptError(PointerError):
    code = "manifest_corrupt"


class ManifestVersionError(PointerError):
    code = "manifest_version_unsupported"


class SavepointInFlightError(SavepointError):
    code = "savepoint_in_flight"


class SavepointPinnedError(SavepointError):
    """Dispose refused: a restore in progress holds the savepoint."""

    code = "savepoint_pinned"


class VerificationError(SavepointError):
    code = "verification_failed"


# --- restore ---------------------------------------------------------------------------------------
class RestoreError(SavepointError):
    code = "restore_error"


class TargetNotEmptyError(RestoreError):
    code = "target_not_empty"


class TargetClaimedError(TargetNotEmptyError):
    code = "target_claimed"


class SymlinkError(InvalidInputError):
    code = "symlink_refused"


class LinkedFileError(UnsafeFileError, SymlinkError):
    """A file of a known name that is a symbolic link: never followed."""

    code = "symlink_refused"


class SinkAheadError(RestoreError):
    """The sink recorded batches past the savepoint (a file sink's log, a Delta table's txn version): the restored
    run would re-run them and the sink would skip them, dropping their output. Ways out: restore a later
    savepoint; for Delta, ``reprocess`` once those batches' rows are gone from the table."""

    code = "sink_ahead"


class SinkRepeatsError(RestoreError):
    """An at-least-once sink (Kafka, ``foreach``, ``foreachBatch`` without a txn id) would get batches N+1..M again.
    Ways out: restore a later savepoint, or accept the duplicates (``allow_repeats``)."""

    code = "sink_repeats"


class SavepointTooOldError(RestoreError):
    code = "savepoint_too_old"


class MissingInputError(RestoreError):
    code = "missing_input"


class KafkaOffsetsGoneError(MissingInputError):
    """Records the restored query must read first were deleted from Kafka (retention, delete-records, a topic
    deleted or made again)."""

    code = "kafka_offsets_gone"


class InputCheckFailedError(RestoreError):
    """The input could not be checked (Kafka unreachable, its client not installed): nothing was restored."""

    code = "input_check_failed"


class SavepointDirNotFoundError(InvalidInputError):
    code = "savepoint_dir_not_found"


# --- rescale through a savepoint (Spark's offline state repartition, core/rescale.py) ---------------
class RescaleError(RestoreError):
    """A restore with ``state_partitions`` that could not rescale the state; nothing was restored."""

    code = "rescale_error"


class RescaleUnavailableError(RescaleError):
    """No Spark that can rescale here: pyspark missing or older than 4.2."""

    code = "rescale_unavailable"


class RescaleUnsupportedStateError(RescaleError):
    """The savepoint's state store provider cannot be repartitioned (HDFS-backed state)."""

    code = "rescale_unsupported_state"


class RescaleUnsupportedOperatorError(RescaleError):
    """A stateful operator (or transformWithState variable type) Spark cannot repartition."""

    code = "rescale_unsupported_operator"


class RescaleRefusedError(RescaleError):
    """Spark's repartition refused the checkpoint (its STATE_REPARTITION_* error class, message kept)."""

    code = "rescale_refused"


class RescaleFailedError(RescaleError):
    """Spark's repartition failed while it rewrote the restored copy."""

    code = "rescale_failed"


# --- streaming jobs --------------------------------------------------------------------------------
class JobFailedError(SavepointError):
    code = "job_failed"


class NoSavepointError(SavepointError):
    code = "no_savepoint"


class JobRunningError(InvalidInputError):
    """A start refused: another run of the job lives (it would write the same sink)."""

    code = "job_running"


class JobNotStoppedError(SavepointError):
    """A stop or cancel could not end the run from here (and its lease did not lapse)."""

    code = "job_not_stopped"


class NotLiveCheckpointError(InvalidInputError):
    """A savepoint asked of a checkpoint its job has left: the job's recorded run writes another one.
    Nothing was copied."""

    code = "not_live_checkpoint"


class JobNotRunningError(InvalidInputError):
    """A savepoint of a job's live query asked while the job has no live run. Nothing was copied."""

    code = "job_not_running"


class UntrustedRunFileError(SavepointError):
    """A run's files (``_run.json``, the run lease) name something the job's configuration does not
    allow (another checkpoint): the command refused before it changed anything."""

    code = "untrusted_run_file"


class ForeignSavepointError(InvalidInputError):
    """A start from a savepoint of another job, or outside the job's folder of its savepoint root,
    without the explicit switch (``--from-other-job``, ``allow_foreign_savepoint=True``)."""

    code = "foreign_savepoint"


class JobFencedError(SavepointError):
    """Another run of the job holds its run lease: this driver stopped its query and must not write."""

    code = "job_fenced"


class UpgradeRefusedError(InvalidInputError):
    """An upgrade (or its check) refused before anything was stopped or written."""

    code = "upgrade_refused"


class UpgradeCheckFailedError(SavepointError):
    """The new version failed its check on a scratch copy of the running version's state (Spark's
    own message); the running version was left untouched."""

    code = "upgrade_check_failed"


class UpgradeCheckTimeoutError(UpgradeCheckFailedError):
    """The new version's check committed no batch in time (no new input, or a slow start)."""

    code = "upgrade_check_timeout"


class AutoscaleNotConfiguredError(InvalidInputError):
    """``job autoscale`` of a job with no ``autoscale:`` policy in the jobs file."""

    code = "autoscale_not_configured"


class AutoscaleRolledBackError(SavepointError):
    """The autoscaler's action (an upgrade to the same version with new executors or state partitions) failed
    its check, or its health after the restart: the job runs its previous configuration. Recorded
    ``rolled_back``; the next decision waits out the cooldown."""

    code = "autoscale_rolled_back"


class AutoscaleActFailedError(SavepointError):
    """The autoscaler's action was refused before anything stopped, or failed and its rollback too. Recorded
    ``failed``; the next decision waits out the cooldown."""

    code = "autoscale_act_failed"


# --- retention and the API -------------------------------------------------------------------------
class RetentionFailedError(SavepointError):
    code = "retention_failed"


class JobNotFoundError(SavepointNotFoundError):
    code = "job_not_found"


class InvalidSavepointIdError(InvalidInputError):
    code = "invalid_savepoint_id"


class ConfigurationError(SavepointError):
    """The deployment's savepoint root is unusable (a bad connection extra or URL): not the caller's fault."""

    code = "invalid_configuration"


class YarnNotConfiguredError(ConfigurationError):
    """A ``master: yarn`` job started where no yarn-site.xml (YARN_CONF_DIR, HADOOP_CONF_DIR) tells where the
    ResourceManager is."""

    code = "yarn_not_configured"


class YarnQueueError(ConfigurationError):
    """A ``master: yarn`` job names a queue the ResourceManager's capacity scheduler has no running leaf queue for."""

    code = "yarn_queue_unusable"


class InterruptedBySignalError(SavepointError):
    """The command was stopped by SIGTERM or SIGINT, after it cleaned up."""

    code = "interrupted"


# --- the unexpected --------------------------------------------------------------------------------
class UnexpectedError(SavepointError):
    """A failure no check anticipated (a bug, or an environment fault with no typed error yet)."""

    code = "unexpected_error"

    @classmethod
    def wrap(cls, exc: BaseException) -> UnexpectedError:
        where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
        return cls(f"{type(exc).__name__}{where}: {exc}",
                   "nothing was reported complete by this command; run it again with AIRFLOW_SAVEPOINTS_DEBUG=1 "
                   "for the traceback and report it at the project's issue tracker")


# --- signals between the storage back ends and the engine -------------------------------------------
class SourceChangedError(Exception):
    """A server-side copy found the source replaced since it was listed (its ETag changed): the
    savepoint engine retries on a newer batch, the copier falls back to the checkpoint's file."""


# --- reading a savepoint's state (inspect) ---------------------------------------------------------
class StateUnreadableError(SavepointError):
    """Spark could not read a store of the savepoint's state (its error class and message in ``cause``)."""

    code = "state_unreadable"


class SparkNotInstalledError(SavepointError):
    """Reading state needs Spark's state data sources: pyspark 4.0 or newer in this environment."""

    code = "spark_not_installed"
