"""The files a run leaves in its job folder, read and validated in one place.

``_run.json`` (the run record), the run lease's facts and a run's heartbeat can be damaged by a
crash, an older release, a hand edit or anyone who may write the savepoint folder. Every reader
goes through :func:`tolerant`: a field of the wrong type is dropped (its default applies) and a file
that cannot be read at all counts as absent, each with a warning naming the file, so no such file
wedges a command. What the files say only describes a run: which checkpoint may be touched, which
control folder is written and which process is signalled are decided from the job's
configuration (see :meth:`StreamingJob.owns_checkpoint`, :func:`control_folder` and the local
runner's start-time check).
"""

from __future__ import annotations

import logging
import re
from typing import Any, TypeVar

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airflow_savepoints.core.names import CONTROL_FOLDER
from airflow_savepoints.errors import UnsafeFileError
from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

Model = TypeVar("Model", bound=BaseModel)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # what new_run_id makes, and a driver's own ids
MAX_TIMEOUT_S = 86400.0


def safe_run_id(run_id: object) -> bool:
    """Whether ``run_id`` can name a control folder (one path segment, no ``..``)."""
    return isinstance(run_id, str) and RUN_ID.fullmatch(run_id) is not None and ".." not in run_id


def control_folder(job_folder: Store, run_id: str | None) -> Store | None:
    """The control folder of run ``run_id``: always ``<job folder>/_control/<run id>``, never a
    location read from a file; None for a run id that is no safe folder name."""
    return job_folder.child(CONTROL_FOLDER).child(run_id) if safe_run_id(run_id) else None


def tolerant(model: type[Model], data: Any, where: str, warnings: list[str] | None = None) -> Model | None:
    """``data`` validated as ``model``; the fields that fail are dropped (their defaults apply), and
    None when it is no object or a required field is unusable. Each problem is logged and added to
    ``warnings``, naming ``where`` (the file)."""
    def warn(text: str) -> None:
        log.warning("%s", text)
        if warnings is not None:
            warnings.append(text)

    if not isinstance(data, dict):
        warn(f"{where} is not a JSON object: ignored")
        return None
    data = dict(data)
    for _ in range(len(data) + 1):
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            bad = {str(error["loc"][0]) for error in exc.errors() if error.get("loc")}
            required = {name for name in bad if name not in data or model.model_fields.get(name) is None
                        or model.model_fields[name].is_required()}
            if required or not bad & data.keys():
                warn(f"{where} is unusable ({exc.errors()[0].get('msg')} at {', '.join(sorted(bad)) or 'its top'}): "
                     "treated as absent")
                return None
            warn(f"{where}: field(s) {', '.join(sorted(bad))} of the wrong type or out of range: ignored")
            data = {key: value for key, value in data.items() if key not in bad}
    return None


def read_json(store: Store, name: str, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The JSON object in ``name`` of ``store``; None if it is absent, or (with a warning) not a JSON
    object, not a regular file (a folder, a FIFO: never waited on), a link, over its cap or too deep."""
    try:
        value = store.read_json(name, "run_file")
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        text, value = f"{exc.message}: ignored", None
    else:
        text = f"{store.url_of(name)} is not a JSON object (damaged or foreign): ignored"
    if not isinstance(value, dict):
        log.warning("%s", text)
        if warnings is not None:
            warnings.append(text)
        return None
    return value


class Heartbeat(BaseModel):
    """A run's ``heartbeat.json``, as far as the lifecycle reads it (other fields are kept as they are)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    run_id: str | None = None
    state: str | None = None
    last_committed_batch: int | None = Field(default=None, ge=-1)
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    interval_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    spark_version: str | None = None
    application_id: str | None = None
    error: str | None = None


# How far one process's start time, read twice, may differ: psutil adds the kernel's boot time, whole seconds that
# move with the wall clock, so a second read can be 1 s off (plus a float's rounding at 1.8e9). A pid reused within
# 2 s would take pid_max process starts in those 2 s.
PID_START_TOLERANCE_S = 2.0


def process_started(pid: int) -> float | None:
    """A process's start time as psutil gives it (recorded with the pid to tell a reused pid)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def same_process(pid: int, started: float) -> psutil.Process | None:
    """Process ``pid`` on this host if it is still the one that started at ``started`` (within
    :data:`PID_START_TOLERANCE_S`) and no zombie; None if it exited or the pid now names a later process. One this
    user may not read counts as that process while its pid exists."""
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - started) > PID_START_TOLERANCE_S:
            return None  # the pid was reused by a later process
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return psutil.Process(pid) if psutil.pid_exists(pid) else None
