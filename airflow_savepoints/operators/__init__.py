"""Airflow operators: thin wrappers over airflow_savepoints.core."""
