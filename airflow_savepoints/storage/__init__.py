"""Storage: one fsspec-backed module for every store (local, S3/s3a, GCS, ADLS, HDFS)."""

from airflow_savepoints.storage.store import FileStat, Store, split_url

__all__ = ["FileStat", "Store", "split_url"]
