"""Airflow sensors: wait for savepoints and for streaming-job progress."""
