"""Streaming jobs, by role: the run's description (description/), what runs in the Spark driver
(driver/), launching (launch/) and the lifecycle workflows (workflows/).

The names below are imported on first use: a driver importing ``jobs.driver.control``, or a savepoint
reading the run lease, does not load the jobs file's model and YAML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_savepoints._lazy import lazy_names

if TYPE_CHECKING:
    from airflow_savepoints.jobs.description.model import (
        JobVersion,
        RestartSettings,
        RetentionSettings,
        SinkSettings,
        StreamingJob,
        load_jobs,
    )

__all__ = ["JobVersion", "RestartSettings", "RetentionSettings", "SinkSettings", "StreamingJob", "load_jobs"]
__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(__all__, "description.model"))
