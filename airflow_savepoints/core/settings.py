"""Where savepoints go by default, read without importing Airflow.

Order: a directory given for one call, then the environment variable
``AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR``, then ``savepoint_dir`` in the ``[savepoints]`` section of
``$AIRFLOW_HOME/airflow.cfg``. Inside Airflow the same option is the provider's configuration.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from pathlib import Path

from airflow_savepoints.errors import InvalidInputError, NoSavepointDirError

SECTION = "savepoints"
DIR_OPTION = "savepoint_dir"
DIR_ENV = "AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR"
CONN_OPTION = "conn_id"


@dataclass(frozen=True)
class Option:
    """One option of the ``[savepoints]`` section, as the provider declares it to Airflow."""

    name: str
    type: str
    default: str
    example: str
    description: str
    sensitive: bool = False  # Airflow hides its value (airflow config list, the UI)


# The one place of the defaults: retention reads them, and get_provider_info declares them to Airflow.
OPTIONS = (
    Option(DIR_OPTION, "string", "", "s3://bucket/savepoints",
           "Default savepoint directory (a path or URL); a directory given to an operator or on the command line wins."),
    Option(CONN_OPTION, "string", "", "savepoints_default",
           "The connection the airflow-savepoints CLI uses without --conn-id; empty: savepoints_default when "
           "AIRFLOW_CONN_SAVEPOINTS_DEFAULT defines it, else none."),
    Option("run_key", "string", "", "a long random string",
           "The key a run's control files (heartbeats, stop acknowledgements) are sealed with, the same on every "
           "host that starts, stops or judges jobs; empty: a key file of each host's own (one-host set-ups).", sensitive=True),
    Option("max_periodic_savepoints", "integer", "10", "10", "How many periodic savepoints of a job retention keeps."),
    Option("max_savepoint_age", "string", "7d", "7d",
           "Periodic savepoints older than this are removed by retention (e.g. 7d, 12h); none for no age limit."),
    Option("max_manual_savepoints", "string", "none", "20",
           "How many manual, stop and retained-checkpoint savepoints of a job retention keeps; none for no limit."),
    Option("orphan_timeout", "string", "1h", "1h",
           "Savepoint locations without _metadata (a trigger that crashed) older than this are removed by retention."),
    # read by the console in the API server (airflow_savepoints.plugins)
    Option("api_timeout", "float", "10", "10", "Seconds the console and its API wait for the store before answering 504."),
    Option("jobs_file", "string", "", "/opt/airflow/dags/jobs.yaml",
           "The jobs.yaml whose jobs the console lists before their first savepoint; empty: the DAGs folder's jobs.yaml."),
    Option("periodic_interval", "string", "", "15m",
           "The periodic savepoint interval; the console flags a job whose newest savepoint is older than twice this."),
    Option("console_savepoint_dag", "string", "periodic_savepoints", "periodic_savepoints",
           "The DAG the console's 'Savepoint now' triggers."),
    Option("console_stop_dag", "string", "stop_job_with_savepoint", "stop_job_with_savepoint",
           "The DAG the console's 'Stop with savepoint' triggers (conf: job)."),
    Option("console_restore_dag", "string", "restore_from_savepoint", "restore_from_savepoint",
           "The DAG the console's 'Restore' triggers (conf: job, pointer)."),
)
DEFAULTS = {option.name: option.default for option in OPTIONS}


def _airflow_cfg_value(option: str) -> str | None:
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    path = Path(os.environ.get("AIRFLOW_CONFIG") or Path(home) / "airflow.cfg")
    if not path.is_file():
        return None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error:
        return None
    value = parser.get(SECTION, option, fallback=None)
    return value.strip() if value and value.strip() else None


def configured_option(option: str) -> str | None:
    """``[savepoints] <option>`` from ``AIRFLOW__SAVEPOINTS__<OPTION>`` or airflow.cfg, if set."""
    value = os.environ.get(f"AIRFLOW__{SECTION.upper()}__{option.upper()}", "").strip()
    return value or _airflow_cfg_value(option)


def configured_savepoint_dir() -> str | None:
    """The default savepoint directory from the environment or airflow.cfg, if any."""
    return configured_option(DIR_OPTION)


def resolve_savepoint_dir(explicit: str | None) -> str:
    """The directory for this call: ``explicit`` beats the configured default."""
    if explicit and explicit.strip():
        return explicit.strip()
    configured = configured_savepoint_dir()
    if configured:
        return configured
    raise NoSavepointDirError(
        "no savepoint directory given and none configured",
        f"pass --dir (savepoint_dir=...) or set {DIR_ENV}, or [{SECTION}] {DIR_OPTION} in airflow.cfg",
    )


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``12h``, ``7d`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = str(text).strip().lower()
    try:
        if text[-1] in units:
            value = float(text[:-1]) * units[text[-1]]
        else:
            value = float(text)
    except (ValueError, IndexError) as exc:
        raise InvalidInputError(f"invalid duration {text!r}", "write e.g. 90s, 15m, 12h or 7d") from exc
    if value < 0:
        raise InvalidInputError(f"negative duration {text!r}", "use a positive duration")
    return value
