"""The extra link from savepoint-writing operators to the plugin's Savepoints page, filtered to the task's job."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink, conf

from airflow_savepoints.plugins.routes import URL_PREFIX

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.sdk import BaseOperator

PAGE_PATH = f"{URL_PREFIX}/ui"  # the page of the plugin's app


def savepoints_page_url(job: str | None = None) -> str:
    """The Savepoints page below ``[api] base_url`` (a path when it is not set), showing ``job`` only."""
    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    if base and not urlsplit(base).scheme:
        base = "/" + base.lstrip("/")
    return f"{base}{PAGE_PATH}" + (f"?job={quote(job, safe='')}" if job else "")


class SavepointsPageLink(BaseOperatorLink):
    """"Savepoints": the job's savepoints on the plugin's page (the job as rendered for the task)."""

    name = "Savepoints"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return savepoints_page_url(getattr(operator, "job", None))
