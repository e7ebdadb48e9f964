"""Code in the docs between ``<!-- [START name] path -->`` and ``<!-- [END name] -->`` is the region of
``path`` between ``# [START name]`` and ``# [END name]`` (dedented), as Airflow's providers pull example
DAG snippets into their docs: the docs cannot drift from the DAGs."""

from __future__ import annotations

import re
import shlex
import textwrap

import pytest

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


SHELL_BLOCK = re.compile(r"```(?:bash|console)\n(.*?)\n```", re.S)


def documented_commands(doc: str) -> list[list[str]]:
    """Each ``airflow-savepoints ...`` command of ``doc``'s bash and console blocks, as its arguments (a ``$``
    prompt, backslash continuations and trailing comments handled; shell words such as ``$PWD`` kept as written)."""
    commands = []
    for block in SHELL_BLOCK.findall((ROOT / doc).read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").split("  #", 1)[0]
            if line.startswith("airflow-savepoints "):
                commands.append(shlex.split(line)[1:])
    return commands


@pytest.mark.parametrize("doc", ["docs/getting-started.md", "README.md"])
def test_the_commands_a_new_user_copies_parse(doc):
    """Every command of the first pages names a command and options the CLI has, with values it accepts."""
    from typer.main import get_command

    from airflow_savepoints.cli.main import app

    commands = documented_commands(doc)
    assert len(commands) >= 7
    for args in commands:
        command, name = get_command(app), "airflow-savepoints"
        while getattr(command, "commands", None):  # a group (Typer's own click): its subcommand
            assert args and args[0] in command.commands, f"{doc}: {name} has no command {args[:1]}"
            name, command, args = f"{name} {args[0]}", command.commands[args[0]], args[1:]
        try:
            command.make_context(name, list(args))
        except Exception as error:  # noqa: BLE001 - Typer's click errors (a usage error, a bad value), whichever class
            raise AssertionError(f"{doc}: {name} {shlex.join(args)}: {error}") from error
