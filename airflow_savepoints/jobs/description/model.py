"""The streaming-job model: what to run, where its checkpoint and savepoints live, how to keep them."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_serializer, model_validator

from airflow_savepoints.core.models import validate_job_name
from airflow_savepoints.core.redaction import REDACTED, redact_conf
from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.storage import Store


class RetentionSettings(BaseModel):
    """Bounds for periodic savepoints (None: the ``[savepoints]`` configuration applies)."""

    model_config = ConfigDict(extra="forbid")

    max_periodic: int | None = Field(default=None, ge=0, le=100_000)
    max_age: str | None = None  # "7d", "12h", "30m"


class SinkSettings(BaseModel):
    """The job's sink: every restore of the job reads what it recorded and says what it will see of the
    batches run again (``airflow_savepoints.sinks``): a file sink's log, a Delta table's transaction
    version, the repeats an at-least-once sink gets."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["file", "delta", "kafka", "foreach", "foreach_batch", "other"] = "other"
    path: str | None = None
    storage_options: dict[str, Any] | None = None  # fsspec options of the sink's store (default: the savepoints')
    app_id: str | None = None  # foreach_batch writing Delta with txnAppId: that appId ("query_id": the query id)

    @model_validator(mode="after")
    def _known_to_the_restore(self) -> SinkSettings:
        from airflow_savepoints.sinks import sink_for

        sink_for(self.kind, self.path, self.storage_options, self.app_id)  # a path missing, an app id misplaced
        return self


class KafkaSettings(BaseModel):
    """The brokers of the job's Kafka sources: a restore checks the records it starts at are still there, and
    the autoscaler asks them how many records the job has not read yet."""

    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str
    client_options: dict[str, Any] = Field(default_factory=dict)  # kafka-python's (security_protocol, sasl_*, ...)


class JobVersion(BaseModel):
    """What makes one version of a job: its application (path or artifact), arguments and Spark conf.

    ``hash`` is a short SHA-256 of the three, so two runs (or savepoints) tell at a glance whether
    they ran the same version; it is recorded in run records, the run lease and savepoint manifests.

    It holds the real Spark conf (what a launch passes), but is only ever written or answered
    redacted: the values of secret-looking keys and of keys set from ``${VAR}`` (``hidden``) read
    ``***``, in its dump, its JSON and its hash (a changed secret is not a new version)."""

    model_config = ConfigDict(extra="ignore")

    application: str
    application_args: list[str] = Field(default_factory=list)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    hash: str = ""
    _hidden: frozenset[str] = PrivateAttr(default=frozenset())

    @classmethod
    def of(cls, application: str, application_args: list[str], spark_conf: dict[str, str],
           hidden: frozenset[str] = frozenset()) -> JobVersion:
        """A version whose ``hidden`` conf keys (set from ``${VAR}``) are redacted like secret-looking ones."""
        return cls.model_validate({"application": application, "application_args": list(application_args),
                                   "spark_conf": dict(spark_conf)}, context={"hidden": hidden})

    def model_post_init(self, context: object) -> None:
        if isinstance(context, dict):
            self._hidden = frozenset(context.get("hidden") or ())
        canonical = json.dumps([self.application, self.application_args, self.shown_conf()], sort_keys=True)
        self.hash = hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def shown_conf(self) -> dict[str, str]:
        """The Spark conf as it may be written or shown (secrets ``***``)."""
        return redact_conf(self.spark_conf, self._hidden)

    def secrets(self) -> list[str]:
        """The real values that :meth:`shown_conf` hides (to hunt in command lines and logs)."""
        shown = self.shown_conf()
        return [value for key, value in self.spark_conf.items() if shown[key] == REDACTED and value != REDACTED]

    @model_serializer(mode="wrap")
    def _redacted(self, handler):
        data = handler(self)
        data["spark_conf"] = self.shown_conf()
        return data


UpgradeMode = Literal["savepoint", "last-state", "stateless"]


class RestartSettings(BaseModel):
    """The watchdog's restart policy for a failed or lost job (Flink's ``job.restart.failed``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    max_restarts: int = Field(default=3, ge=0, le=1000)  # within ``window``; then the job stays down
    window: str = "1h"
    backoff: float = Field(default=10.0, ge=0, le=86400)  # seconds before the 2nd restart, doubled for each next one
    max_backoff: float = Field(default=600.0, ge=0, le=86400)
    last_state: bool = True  # restart on the live checkpoint when it passes the checks (else the newest savepoint)


class AutoscaleSettings(BaseModel):
    """The autoscaler's policy for a job (``autoscale:`` in jobs.yaml; docs/autoscale.md).

    ``target_utilization`` is the batch duration over the trigger interval the job should run at;
    the windows (``scale_up_after``, ``scale_down_after``) are how long, in seconds, a condition
    must hold before it is acted on; ``cooldown`` is how long after an action nothing else is
    decided. ``max_backlog``: a backlog above it (Kafka records) counts as falling behind, whatever
    the utilization. ``mode``: ``recommend`` only reports; ``act`` may change the job."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min_executors: int = Field(default=1, ge=1, le=10_000)  # cores a standalone job gets, executors elsewhere
    max_executors: int = Field(default=8, ge=1, le=10_000)
    executor_cores: int = Field(default=1, ge=1, le=1024)  # cores per executor (capacity = executors * this)
    min_partitions: int | None = Field(default=None, ge=1, le=100_000)  # state partitions; None: never changed
    max_partitions: int | None = Field(default=None, ge=1, le=100_000)
    target_utilization: float = Field(default=0.7, gt=0, le=1)
    utilization_band: float = Field(default=0.2, ge=0, lt=1)  # hysteresis: up above target + band, down below target - band
    scale_up_after: float = Field(default=300.0, gt=0, le=86400)
    scale_down_after: float = Field(default=1800.0, gt=0, le=7 * 86400)
    cooldown: float = Field(default=900.0, ge=0, le=7 * 86400)
    max_backlog: int | None = Field(default=None, ge=0)
    mode: Literal["act", "recommend"] = "recommend"

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSettings:
        if self.min_executors > self.max_executors:
            raise ValueError(f"min_executors ({self.min_executors}) is above max_executors ({self.max_executors})")
        if (self.min_partitions is None) != (self.max_partitions is None):
            raise ValueError("min_partitions and max_partitions go together: give both, or neither")
        if self.min_partitions is not None and self.max_partitions is not None and self.min_partitions > self.max_partitions:
            raise ValueError(f"min_partitions ({self.min_partitions}) is above max_partitions ({self.max_partitions})")
        return self


class StreamingJob(BaseModel):
    """One long-running Spark Structured Streaming job."""

    model_config = ConfigDict(extra="forbid")

    name: str
    application: str
    application_args: list[str] = Field(default_factory=list)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    master: str = "local[2]"
    master_ui: str | None = None  # a standalone master's web UI (default http://<master host>:8080)
    app_name: str | None = None  # the application's name at the master when it sets its own (appName); default: name
    deploy_mode: Literal["client", "cluster"] = "client"
    spark_conn_id: str | None = None
    checkpoint: str
    savepoint_dir: str | None = None
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    checkpoint_retention: Literal["RETAIN_ON_CANCELLATION", "RETAIN_ON_FAILURE", "NEVER_RETAIN_AFTER_TERMINATION"] = (
        "RETAIN_ON_CANCELLATION"  # never delete a live checkpoint unless configured to
    )
    sink: SinkSettings | None = None
    kafka: KafkaSettings | None = None
    heartbeat_interval: float | None = Field(default=None, gt=0, le=3600)  # seconds (default 5)
    lease_timeout: float | None = Field(default=None, gt=0, le=86400)  # seconds without a heartbeat: lost (30)
    upgrade_mode: UpgradeMode = "savepoint"  # how an upgrade carries the state (see jobs/workflows/upgrade.py)
    restart: RestartSettings = Field(default_factory=RestartSettings)  # the watchdog's (jobs/workflows/watchdog.py)
    progress_timeout: float | None = Field(default=None, gt=0, le=7 * 86400)  # seconds a batch may run uncommitted
    autoscale: AutoscaleSettings | None = None  # the autoscaler's policy (jobs/workflows/autoscale.py); None: off
    _expanded_conf: frozenset[str] = PrivateAttr(default=frozenset())  # spark_conf keys set from the environment

    def version(self) -> JobVersion:
        """This job's version (application, arguments, Spark conf and their hash)."""
        return JobVersion.of(self.application, self.application_args, self.spark_conf, self._expanded_conf)

    def with_version(self, version: JobVersion) -> StreamingJob:
        """The same job running ``version``; a conf value recorded as ``***`` is this job's real one."""
        conf = {key: self.spark_conf.get(key, value) if value == REDACTED else value
                for key, value in version.spark_conf.items()}
        job = self.model_copy(update={"application": version.application,
                                      "application_args": list(version.application_args), "spark_conf": conf})
        recorded_hidden = {key for key, value in version.spark_conf.items() if value == REDACTED}
        job._expanded_conf = self._expanded_conf & (version._hidden | recorded_hidden)  # still from the environment
        return job

    def variant(self, application: str | None = None, application_args: list[str] | None = None,
                spark_conf: dict[str, str] | None = None) -> StreamingJob:
        """This job with the given fields replaced (None: keep); ``spark_conf`` is set on top of its
        own, and a key given there is no longer one set from the environment."""
        variant = self.model_copy(update={"application": application or self.application,
                                          "application_args": self.application_args if application_args is None
                                          else list(application_args),
                                          "spark_conf": {**self.spark_conf, **(spark_conf or {})}})
        variant._expanded_conf = self._expanded_conf - set(spark_conf or {})
        return variant

    def secrets(self) -> list[str]:
        """The real values of this job's secret conf (what must never be written or shown)."""
        return self.version().secrets()

    def redacted(self, version: dict[str, Any] | None) -> dict[str, Any] | None:
        """A recorded version (a dict) with its Spark conf redacted by this job's rules (records of older releases)."""
        if not isinstance(version, dict) or not isinstance(version.get("spark_conf"), dict):
            return version
        return {**version, "spark_conf": redact_conf(version["spark_conf"], self._expanded_conf)}

    def owns_checkpoint(self, location: str | None) -> bool:
        """Whether ``location`` is this job's configured checkpoint, or a sibling named after it
        (``<checkpoint>-<suffix>``: where a start restores, by default ``<checkpoint>-<UTC time>``):
        the only checkpoints its lifecycle deletes, keeps or copies, whatever a run's files say
        (:func:`load_jobs` refuses a job whose checkpoint is so named after another's)."""
        if not location:
            return False
        own, given = self.checkpoint.rstrip("/"), location.rstrip("/")
        return given == own or (given.startswith(own + "-") and _DERIVED_CHECKPOINT.fullmatch(given[len(own) + 1:]) is not None)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_job_name(value)


_DERIVED_CHECKPOINT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._]*(-[A-Za-z0-9._]+)*")  # <checkpoint>-<this>: one folder name
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _from_environment(text: str) -> bool:
    """Whether ``text`` takes a value from the environment (a ``${VAR}`` that is set, not its default)."""
    return any(os.environ.get(match.group(1)) for match in _VARIABLE.finditer(text))


def expand_variables(text: str) -> str:
    """Replace ``${VAR}`` and ``${VAR:-default}`` with the environment's values."""
    return _VARIABLE.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), text)


class _Mapping(dict):
    """A YAML mapping that remembers the keys it was given more than once."""

    duplicates: list[str]


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice is remembered (plain YAML keeps the last silently)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> _Mapping:
    mapping = _Mapping()
    mapping.duplicates = []
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            mapping.duplicates.append(str(key))
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _duplicates(value: object, where: str = "") -> list[str]:
    """Every key given twice in ``value`` (nested mappings and lists), as a dotted path."""
    found: list[str] = []
    if isinstance(value, dict):
        found += [f"{where}{key}" for key in getattr(value, "duplicates", [])]
        for key, item in value.items():
            found += _duplicates(item, f"{where}{key}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _duplicates(item, f"{where}{index}.")
    return found


def _expanded(value: object) -> object:
    """``value`` with ``${VAR}`` expanded in every string (keys and values)."""
    if isinstance(value, str):
        return expand_variables(value)
    if isinstance(value, dict):
        return {_expanded(key): _expanded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_expanded(item) for item in value]
    return value


def _check_locations(path: Path, jobs: dict[str, StreamingJob]) -> None:
    """No savepoint_dir at a root, no checkpoint in its savepoint folder, no checkpoint shared with another job."""
    for job in jobs.values():
        where = f"{path}: job '{job.name}'"
        if job.savepoint_dir and Store.is_store_root(job.savepoint_dir):
            raise InvalidInputError(f"{where}: savepoint_dir {job.savepoint_dir} is a filesystem or bucket root",
                                    "give the savepoints a folder of their own")
        if job.savepoint_dir and Store.overlapping(job.checkpoint, job.savepoint_dir):
            raise InvalidInputError(f"{where}: checkpoint {job.checkpoint} and savepoint_dir {job.savepoint_dir} overlap",
                                    "keep the checkpoint outside the savepoint folder (and the other way round)")
        for other in jobs.values():
            shared = Store.overlapping(job.checkpoint, other.checkpoint) or other.owns_checkpoint(job.checkpoint)
            if other.name != job.name and shared:
                raise InvalidInputError(f"{where}: checkpoint {job.checkpoint} is (or lies within, or is named after) "
                                        f"job '{other.name}''s checkpoint {other.checkpoint}",
                                        "give every job a checkpoint folder of its own, not named <other checkpoint>-...")


def load_jobs(path: str | Path) -> dict[str, StreamingJob]:
    """Jobs from a YAML file (``jobs: [{name: …}, …]``); ``${VAR}``/``${VAR:-default}`` are expanded.

    Refused, naming the job and the key: a key given twice, a savepoint_dir at a filesystem or
    bucket root, a checkpoint overlapping its savepoint_dir or another job's checkpoint."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_StrictLoader) or {}  # noqa: S506 - a SafeLoader
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"cannot read jobs file {path}: {exc}", "fix the YAML or the path") from exc
    entries = raw.get("jobs") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise InvalidInputError(f"{path} has no 'jobs:' list", "write 'jobs:' followed by a list of jobs")
    if isinstance(raw, dict) and "jobs" in getattr(raw, "duplicates", []):
        raise InvalidInputError(f"{path}: key 'jobs' appears twice", "write one 'jobs:' list")
    jobs: dict[str, StreamingJob] = {}
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        label = f"job '{name}'" if isinstance(name, str) else f"job #{index + 1}"
        if duplicated := _duplicates(entry):
            raise InvalidInputError(f"{path}: {label}: key '{duplicated[0]}' appears twice",
                                    "give every key once (YAML would silently keep the last)")
        try:
            job = StreamingJob.model_validate(_expanded(entry))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise InvalidInputError(f"{path}: {label}: {where}: {first['msg']}",
                                    "see docs/autoscale.md for the autoscale: policy's fields and bounds"
                                    if where.startswith("autoscale") else "see docs/airflow.md for the job fields") from exc
        conf = entry.get("spark_conf") if isinstance(entry, dict) else None
        job._expanded_conf = frozenset(key for key, value in (conf or {}).items() if _from_environment(str(value)))
        if job.name in jobs:
            raise InvalidInputError(f"{path}: job name '{job.name}' appears twice", "give every job its own name")
        jobs[job.name] = job
    _check_locations(path, jobs)
    return jobs
