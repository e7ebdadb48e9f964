"""Storage: one ``Store`` for every kind of store (local, S3/s3a, GCS, ADLS, HDFS), each kind served
by its back end (``storage/backends``)."""

from airflow_savepoints.storage.backends import LINK, SERVER_COPY, STREAM, FileStat
from airflow_savepoints.storage.store import Store, split_url

__all__ = ["LINK", "SERVER_COPY", "STREAM", "FileStat", "Store", "split_url"]
