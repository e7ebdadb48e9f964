"""What happens to a job's live checkpoint when the job is cancelled or fails (Flink's policies).

| policy | cancelled | failed |
|---|---|---|
| RETAIN_ON_CANCELLATION | kept | kept |
| RETAIN_ON_FAILURE | deleted | kept |
| NEVER_RETAIN_AFTER_TERMINATION | deleted | deleted |

A kept checkpoint is also registered as a restorable ``retained_checkpoint`` savepoint of its last
committed batch (a self-contained copy in the savepoint directory), unless the run committed nothing
past the batch it started from (``started_at``): that batch is the savepoint it was restored from
(or its previous run's checkpoint), so a copy of it would only become the newest savepoint, the
restore default, for a run that never worked. Deleting the live checkpoint is
the only place the package deletes outside a savepoint directory, so it is guarded: the location
must be a Spark checkpoint, and must not overlap the savepoint directory.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, Literal

from airflow_savepoints.checkpoint.progress import checkpoint_progress
from airflow_savepoints.core.models import SavepointInfo, SavepointType
from airflow_savepoints.core.names import CHECKPOINT_METADATA
from airflow_savepoints.errors import InvalidInputError, NoCommittedBatchError, NotACheckpointError
from airflow_savepoints.storage import Store


class CheckpointRetentionPolicy(StrEnum):
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"
    RETAIN_ON_FAILURE = "RETAIN_ON_FAILURE"
    NEVER_RETAIN_AFTER_TERMINATION = "NEVER_RETAIN_AFTER_TERMINATION"

    def retains(self, termination: Literal["cancelled", "failed"]) -> bool:
        if self is CheckpointRetentionPolicy.RETAIN_ON_CANCELLATION:
            return True
        if self is CheckpointRetentionPolicy.RETAIN_ON_FAILURE:
            return termination == "failed"
        return False


def parse_policy(value: str | CheckpointRetentionPolicy) -> CheckpointRetentionPolicy:
    try:
        return CheckpointRetentionPolicy(str(value).upper())
    except ValueError:
        raise InvalidInputError(
            f"unknown checkpoint retention policy {value!r}",
            "use one of: " + ", ".join(p.value for p in CheckpointRetentionPolicy),
        ) from None


def apply_checkpoint_retention(
    checkpoint: str | Store,
    job: str,
    policy: str | CheckpointRetentionPolicy,
    termination: Literal["cancelled", "failed"],
    *,
    savepoint_dir: str | Store,
    storage_options: dict[str, Any] | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    started_at: int | None = None,
    **written_by: Any,
) -> dict[str, Any]:
    """Keep (and register) or delete the terminated job's live checkpoint, as ``policy`` says.

    ``started_at``: the newest committed batch when the run started (None: an empty checkpoint); a
    kept checkpoint with no commit past it is not registered (``retained_savepoint`` None, ``note``).
    ``written_by``: what the run that wrote the checkpoint ran (``spark_version``, the driver's;
    ``job_version``), for the retained checkpoint's manifest."""
    from airflow_savepoints.core.savepoint import check_apart, take_savepoint  # here: reading a run's state needs none

    policy = parse_policy(policy)
    source = checkpoint if isinstance(checkpoint, Store) else Store(checkpoint, storage_options)
    root = savepoint_dir if isinstance(savepoint_dir, Store) else Store(savepoint_dir, storage_options)
    check_apart(source, root)
    listing = source.list_files()
    if not listing:
        return {"policy": policy.value, "termination": termination, "checkpoint": source.url, "action": "absent"}
    if policy.retains(termination):
        retained: SavepointInfo | None = None
        last, _ = checkpoint_progress(source) if started_at is not None else (None, None)
        if started_at is not None and (last is None or last <= started_at):
            return {"policy": policy.value, "termination": termination, "checkpoint": source.url, "action": "retained",
                    "retained_savepoint": None,
                    "note": f"not registered as a savepoint: the run committed nothing past batch {started_at}, "
                            "the one it started from"}
        try:
            retained = take_savepoint(source, job, savepoint_dir=root, savepoint_type=SavepointType.RETAINED_CHECKPOINT,
                                      reason=f"checkpoint retained after the job was {termination}",
                                      on_event=on_event, **written_by)
        except NoCommittedBatchError:
            pass  # nothing committed yet: kept, but nothing to restore from
        return {"policy": policy.value, "termination": termination, "checkpoint": source.url, "action": "retained",
                "retained_savepoint": retained.summary() if retained else None}
    if CHECKPOINT_METADATA not in listing and not any(p.startswith("offsets/") for p in listing):
        raise NotACheckpointError(
            f"refusing to delete {source.url}: it is not a Spark streaming checkpoint",
            "check the job's checkpoint setting; nothing was deleted",
        )
    if "/" not in source.root.strip("/"):
        raise InvalidInputError(f"refusing to delete {source.url}: it is a bucket or filesystem root",
                                "keep checkpoints in a folder; nothing was deleted")
    source.parent().remove_tree(source.name)
    return {"policy": policy.value, "termination": termination, "checkpoint": source.url, "action": "deleted"}
