"""Airflow triggers: the deferrable halves of the sensors, run in the triggerer."""
