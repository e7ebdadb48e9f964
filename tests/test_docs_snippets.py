"""Code in the docs between ``<!-- [START name] path -->`` and ``<!-- [END name] -->`` is the region of
``path`` between ``# [START name]`` and ``# [END name]`` (dedented), as Airflow's providers pull example
DAG snippets into their docs: the docs cannot drift from the DAGs."""

from __future__ import annotations

import re
import textwrap

from tests.conftest import ROOT

DOC_BLOCK = re.compile(r"<!-- \[START (\S+)\] (\S+) -->\n```python\n(.*?)\n```\n<!-- \[END \1\] -->", re.S)


def source_region(path: str, name: str) -> str:
    text = (ROOT / path).read_text()
    start, end = f"# [START {name}]\n", f"# [END {name}]"
    assert start in text and end in text, f"{path} has no {name} markers"
    region = text.split(start, 1)[1].split(end, 1)[0]
    return textwrap.dedent(region.rsplit("\n", 1)[0]).rstrip("\n")  # without the END marker's indentation


def test_doc_snippets_are_the_marked_regions_of_the_example_dags():
    found = 0
    for doc in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for name, path, code in DOC_BLOCK.findall(doc.read_text()):
            found += 1
            assert code == source_region(path, name), f"{doc.name}: snippet {name} differs from {path}; copy it again"
    assert found >= 1
