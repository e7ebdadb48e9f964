"""Flink-style savepoints for Spark Structured Streaming, driven by Apache Airflow."""

__version__ = "0.1.0"
