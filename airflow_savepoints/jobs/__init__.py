"""Streaming jobs: their model (loadable from YAML beside the DAGs), launcher and control channel."""

from airflow_savepoints.jobs.model import RetentionSettings, SinkSettings, StreamingJob, load_jobs

__all__ = ["RetentionSettings", "SinkSettings", "StreamingJob", "load_jobs"]
