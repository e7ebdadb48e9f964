"""The reference tables in docs/ checked against the code, so they cannot drift: every ``[savepoints]``
option and example DAG in airflow.md, every manifest field in savepoint-format.md, every module path
architecture.md names. The commands, their JSON, the operators and the error codes: test_docs_drift.py."""

from __future__ import annotations

import re

import pytest

from airflow_savepoints.core.models import SavepointManifest
from airflow_savepoints.core.settings import OPTIONS
from tests.conftest import ROOT

DOCS = ROOT / "docs"


def section(doc: str, heading: str) -> str:
    """The text of ``doc`` from ``heading`` to the next heading of the same level."""
    text = (DOCS / doc).read_text()
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n{level} ", body, maxsplit=1)[0]


def test_every_savepoints_option_has_a_row_in_airflow_md():
    text = (DOCS / "airflow.md").read_text()
    missing = [o.name for o in OPTIONS if f"| `{o.name}` | {f'`{o.default}`' if o.default else '(empty)'} |" not in text]
    assert not missing, f"docs/airflow.md's [savepoints] table lacks (or has another default for): {missing}"


def test_every_example_dag_is_in_the_tables():
    dag_ids = sorted(re.search(r'dag_id="([^"]+)"', p.read_text()).group(1) for p in (ROOT / "dags").glob("*.py"))
    table = section("airflow.md", "## Example DAGs (`dags/`)")
    install = section("cli.md", "## dags install")
    assert len(dag_ids) >= 7
    assert [d for d in dag_ids if f"| `{d}` |" not in table] == []
    assert [d for d in dag_ids if f"`{d}`" not in install] == []


def test_every_manifest_field_is_in_savepoint_format_md():
    text = (DOCS / "savepoint-format.md").read_text()
    missing = [name for name in SavepointManifest.model_fields if f"`{name}`" not in text]
    assert not missing, f"docs/savepoint-format.md does not describe: {missing}"


@pytest.mark.parametrize("doc", ["architecture.md"])
def test_every_module_path_named_exists(doc):
    text = (DOCS / doc).read_text()
    named = set(re.findall(r"`((?:airflow_savepoints/)?(?:core|cli|jobs|storage|checkpoint|hooks|operators|sensors|triggers|plugins|"
                           r"demo)/[\w/]+\.py)`", text))
    assert named
    missing = sorted(p for p in named if not (ROOT / p).exists() and not (ROOT / "airflow_savepoints" / p).exists())
    assert not missing, f"docs/{doc} names modules that do not exist: {missing}"
