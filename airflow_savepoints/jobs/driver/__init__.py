"""What runs inside a streaming job's Spark driver: the in-job helper (``control``: import
:func:`run_until_stopped` from here in a job), an upgrade check's sink swap (``check_sink``), and
the job's one-off applications, the rescale (``rescale_app``) and the inspection (``inspect_app``),
with the result they leave (``app_result``). Imports only the run's description, the core and pyspark;
never Airflow."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_savepoints._lazy import lazy_names

if TYPE_CHECKING:
    from airflow_savepoints.jobs.driver.control import RunHandle, claim_run, run_until_stopped

__all__ = ["RunHandle", "claim_run", "run_until_stopped"]
__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(__all__, "control"))
