"""Option groups: a command takes related options as one dataclass, the command line stays flat.

A parameter annotated with a dataclass decorated by :func:`option_group` is shown to typer as that
dataclass's fields (each an ordinary ``Annotated[..., typer.Option(...)]`` with its default); the
command receives one instance built from them. ``--jobs-file``, ``--dir`` and the rest keep their
names and places on the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

T = TypeVar("T")
_GROUP_MARK = "__cli_option_group__"

# options that more than one command (or group) takes, declared once
MaxAgeOption = Annotated[str | None, typer.Option(help="Refuse a savepoint older than this (12h, 7d).")]
SkipMissingInputOption = Annotated[bool, typer.Option(
    help="Restore even if input files a file source will read again, or Kafka records it starts at, are gone.")]
StatePartitionsOption = Annotated[int | None, typer.Option(
    help="Rescale the state into N partitions (Spark 4.2+ with [spark] installed here, RocksDB state).")]


def option_group(cls: type[T]) -> type[T]:
    """Make ``cls`` a (frozen) dataclass whose fields are command-line options."""
    group = dataclasses.dataclass(frozen=True)(cls)
    setattr(group, _GROUP_MARK, True)
    return group


def _group_fields(group: type) -> list[inspect.Parameter]:
    hints = get_type_hints(group, include_extras=True)
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
            for f in dataclasses.fields(group)]


def with_option_groups(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Flatten ``fn``'s option-group parameters into their fields for typer; rebuild the groups per call."""
    hints = get_type_hints(fn, include_extras=True)
    visible: list[inspect.Parameter] = []
    groups: dict[str, type] = {}
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name)
        if getattr(annotation, _GROUP_MARK, False):
            groups[param.name] = annotation
            visible += _group_fields(annotation)
        else:
            visible.append(param.replace(annotation=hints.get(param.name, param.annotation),
                                         kind=inspect.Parameter.KEYWORD_ONLY if param.default is not param.empty
                                         else param.kind))
    positional = [p for p in visible if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    names = [p.name for p in visible]
    if len(names) != len(set(names)):
        raise TypeError(f"{fn.__name__}: an option group repeats a parameter name: {names}")

    @functools.wraps(fn)
    def command(*args: Any, **values: Any) -> Any:
        for name, group in groups.items():
            values[name] = group(**{f.name: values.pop(f.name) for f in dataclasses.fields(group)})
        return fn(*args, **values)

    command.__signature__ = inspect.Signature(positional + [p for p in visible if p not in positional])
    command.__annotations__ = {p.name: p.annotation for p in visible}  # resolved: typer reads them too
    return command
