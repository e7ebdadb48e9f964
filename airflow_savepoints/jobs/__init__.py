"""Streaming jobs: their model (loadable from YAML beside the DAGs), launcher and control channel.

The names below are imported on first use: a driver importing ``jobs.control``, or a savepoint
reading the run lease, does not load the jobs file's model and YAML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_savepoints._lazy import lazy_names

if TYPE_CHECKING:
    from airflow_savepoints.jobs.model import (
        JobVersion,
        RestartSettings,
        RetentionSettings,
        SinkSettings,
        StreamingJob,
        load_jobs,
    )

__all__ = ["JobVersion", "RestartSettings", "RetentionSettings", "SinkSettings", "StreamingJob", "load_jobs"]
__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(__all__, "model"))
