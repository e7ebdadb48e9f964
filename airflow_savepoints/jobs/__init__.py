"""Streaming jobs: their model (loadable from YAML beside the DAGs) and, later, their launcher."""

from airflow_savepoints.jobs.model import RetentionSettings, SinkSettings, StreamingJob, load_jobs

__all__ = ["RetentionSettings", "SinkSettings", "StreamingJob", "load_jobs"]
