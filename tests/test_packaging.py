"""pyspark and pyspark-client (pulled in by the Spark provider) must be the same release as the jars."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pyspark


def test_pyspark_and_pyspark_client_agree_with_the_jars():
    jars = Path(pyspark.__file__).parent / "jars"
    core = [p.name for p in jars.glob("spark-core_*.jar")]
    assert len(core) == 1, core
    jar_version = re.search(r"spark-core_[0-9.]+-(.+)\.jar", core[0]).group(1)
    assert version("pyspark") == version("pyspark-client") == pyspark.__version__ == jar_version


def test_console_script_and_provider_entry_point_are_installed():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["airflow-savepoints"] == "airflow_savepoints.cli.main:main"
