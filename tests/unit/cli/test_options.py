"""Option groups: a flat command line, one dataclass per group inside the command."""

from __future__ import annotations

from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from airflow_savepoints.cli.options import option_group, with_option_groups


@option_group
class Window:
    start: Annotated[int, typer.Option(help="First index.")] = 0
    stop: Annotated[int | None, typer.Option("--until", help="Last index.")] = None


def make_app(seen: list) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @with_option_groups
    def show(name: Annotated[str, typer.Argument()], *, window: Window,
             loud: Annotated[bool, typer.Option("--loud")] = False) -> None:
        seen.append((name, window, loud))

    @app.command()
    def other() -> None:  # a second command, so "show" is a subcommand
        pass

    return app


def test_a_group_is_flat_options_on_the_command_line_and_one_object_in_the_command():
    seen: list = []
    app = make_app(seen)
    result = CliRunner().invoke(app, ["show", "orders", "--until", "7", "--loud"])
    assert result.exit_code == 0, result.output
    assert seen == [("orders", Window(start=0, stop=7), True)]
    helped = CliRunner().invoke(app, ["show", "--help"])
    assert "--start" in helped.output and "--until" in helped.output and "--window" not in helped.output


def test_an_unknown_option_is_still_a_usage_error():
    result = CliRunner().invoke(make_app([]), ["show", "orders", "--window", "3"])
    assert result.exit_code == 2


def test_a_field_named_like_another_parameter_is_refused_at_definition():
    def clash(*, start: int = 1, window: Window) -> None: ...

    with pytest.raises(TypeError, match="repeats a parameter name"):
        with_option_groups(clash)
