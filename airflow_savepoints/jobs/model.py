"""The streaming-job model: what to run, where its checkpoint and savepoints live, how to keep them."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from airflow_savepoints.core.models import validate_job_name
from airflow_savepoints.errors import InvalidInputError


class RetentionSettings(BaseModel):
    """Bounds for periodic savepoints (None: the ``[savepoints]`` configuration applies)."""

    model_config = ConfigDict(extra="forbid")

    max_periodic: int | None = Field(default=None, ge=0, le=100_000)
    max_age: str | None = None  # "7d", "12h", "30m"


class SinkSettings(BaseModel):
    """The job's sink, for restore safety checks (a file sink's log must not be past a savepoint)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["file", "delta", "kafka", "foreach", "other"] = "other"
    path: str | None = None


class KafkaSettings(BaseModel):
    """The brokers of the job's Kafka sources: a restore checks the records it starts at are still there."""

    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str
    client_options: dict[str, Any] = Field(default_factory=dict)  # kafka-python's (security_protocol, sasl_*, ...)


class JobVersion(BaseModel):
    """What makes one version of a job: its application (path or artifact), arguments and Spark conf.

    ``hash`` is a short SHA-256 of the three, so two runs (or savepoints) tell at a glance whether
    they ran the same version; it is recorded in run records, the run lease and savepoint manifests."""

    model_config = ConfigDict(extra="ignore")

    application: str
    application_args: list[str] = Field(default_factory=list)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    hash: str = ""

    def model_post_init(self, _context: object) -> None:
        canonical = json.dumps([self.application, self.application_args, self.spark_conf], sort_keys=True)
        self.hash = hashlib.sha256(canonical.encode()).hexdigest()[:12]


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


class StreamingJob(BaseModel):
    """One long-running Spark Structured Streaming job."""

    model_config = ConfigDict(extra="forbid")

    name: str
    application: str
    application_args: list[str] = Field(default_factory=list)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    master: str = "local[2]"
    master_ui: str | None = None  # a standalone master's web UI (default http://<master host>:8080)
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
    upgrade_mode: UpgradeMode = "savepoint"  # how an upgrade carries the state (see jobs/upgrade.py)
    restart: RestartSettings = Field(default_factory=RestartSettings)  # the watchdog's (jobs/watchdog.py)
    progress_timeout: float | None = Field(default=None, gt=0, le=7 * 86400)  # seconds a batch may run uncommitted

    def version(self) -> JobVersion:
        """This job's version (application, arguments, Spark conf and their hash)."""
        return JobVersion(application=self.application, application_args=self.application_args,
                          spark_conf=self.spark_conf)

    def with_version(self, version: JobVersion) -> StreamingJob:
        """The same job running ``version``."""
        return self.model_copy(update={"application": version.application,
                                       "application_args": list(version.application_args),
                                       "spark_conf": dict(version.spark_conf)})

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_job_name(value)


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_variables(text: str) -> str:
    """Replace ``${VAR}`` and ``${VAR:-default}`` with the environment's values."""
    return _VARIABLE.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), text)


def load_jobs(path: str | Path) -> dict[str, StreamingJob]:
    """Jobs from a YAML file (``jobs: [{name: …}, …]``); ``${VAR}``/``${VAR:-default}`` are expanded."""
    path = Path(path)
    try:
        raw = yaml.safe_load(expand_variables(path.read_text())) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"cannot read jobs file {path}: {exc}", "fix the YAML or the path") from exc
    entries = raw.get("jobs") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise InvalidInputError(f"{path} has no 'jobs:' list", "write 'jobs:' followed by a list of jobs")
    jobs: dict[str, StreamingJob] = {}
    for index, entry in enumerate(entries):
        try:
            job = StreamingJob.model_validate(entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise InvalidInputError(f"{path}: job #{index + 1}: {where}: {first['msg']}",
                                    "see docs/airflow.md for the job fields") from exc
        if job.name in jobs:
            raise InvalidInputError(f"{path}: job name '{job.name}' appears twice", "give every job its own name")
        jobs[job.name] = job
    return jobs
