"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_savepoints import __version__
from airflow_savepoints.core.settings import OPTIONS


def get_provider_info() -> dict:
    integration = "Savepoints"
    return {
        "package-name": "airflow-savepoints",  # must equal the distribution's canonical name
        "name": "Savepoints",
        "description": "Flink-style savepoints for Spark Structured Streaming jobs.",
        "versions": [__version__],
        "integrations": [{"integration-name": integration, "external-doc-url": "https://spark.apache.org/",
                          "tags": ["apache"]}],
        "hooks": [{"integration-name": integration,
                   "python-modules": ["airflow_savepoints.hooks.savepoint", "airflow_savepoints.hooks.streaming_job"]}],
        "operators": [{"integration-name": integration,
                       "python-modules": ["airflow_savepoints.operators.savepoint", "airflow_savepoints.operators.job",
                                             "airflow_savepoints.operators.retention", "airflow_savepoints.operators.upgrade",
                                             "airflow_savepoints.operators.supervise",
                                             "airflow_savepoints.operators.autoscale",
                                             "airflow_savepoints.operators.inspect"]}],
        "sensors": [{"integration-name": integration, "python-modules": ["airflow_savepoints.sensors.savepoint"]}],
        "triggers": [{"integration-name": integration, "python-modules": ["airflow_savepoints.triggers.savepoint"]}],
        # a job's savepoints are announced as events of the asset x-savepoints://<job> (x-: no normalisation)
        "asset-uris": [{"schemes": ["x-savepoints"], "handler": None,
                        "factory": "airflow_savepoints.operators.savepoint.savepoint_asset"}],
        # the savepoint-writing operators link to the job's savepoints on the plugin's page
        "extra-links": ["airflow_savepoints.operators.links.SavepointsPageLink"],
        "plugins": [{"name": "savepoints", "plugin-class": "airflow_savepoints.plugins.savepoints.SavepointsPlugin"}],
        "connection-types": [
            {
                "hook-class-name": "airflow_savepoints.hooks.savepoint.SavepointStorageHook",
                "connection-type": "savepoints",
                "hook-name": "Savepoint Storage",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port"],
                    "relabeling": {"host": "Savepoint directory (URL)", "login": "Access key id",
                                   "password": "Secret access key", "extra": "fsspec storage options (JSON)"},
                    "placeholders": {"host": "s3://bucket/savepoints", "extra": '{"endpoint_url": "https://…"}'},
                },
                "conn-fields": {},
            }
        ],
        "config": {"savepoints": {"description": "Defaults of airflow-savepoints.", "options": {
            option.name: {"description": option.description, "version_added": "0.1.0", "type": option.type,
                          "example": option.example, "default": option.default,
                          **({"sensitive": True} if option.sensitive else {})}
            for option in OPTIONS
        }}},
    }
