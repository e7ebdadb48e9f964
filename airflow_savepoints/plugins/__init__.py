"""The Airflow plugin: a savepoint listing API and a page in the Airflow UI (see docs/api.md)."""
