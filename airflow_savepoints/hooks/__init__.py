"""Airflow hooks: connections turned into storage objects."""
