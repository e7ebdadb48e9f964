"""Streaming jobs: their model (loadable from YAML beside the DAGs), launcher and control channel."""

from airflow_savepoints.jobs.model import (
    JobVersion,
    RestartSettings,
    RetentionSettings,
    SinkSettings,
    StreamingJob,
    load_jobs,
)

__all__ = ["JobVersion", "RestartSettings", "RetentionSettings", "SinkSettings", "StreamingJob", "load_jobs"]
