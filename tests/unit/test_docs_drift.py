"""The reference docs checked against the code both ways, claim by claim, without Spark.

- cli.md: each command has its own section (``## trigger``, ``## job start``) whose synopsis names
  exactly the command's options, with the real defaults; the options its text names are the command's;
  its ``JSON:`` list is exactly the keys the command prints (run for real on a small checkpoint);
- api.md: the summary keys are ``SavepointSummary``'s fields;
- airflow.md: each operator's signature is the class's (``inspect.signature``), each example DAG's
  Params are the DAG's ``params``;
- the error codes documented are the codes of error classes some module raises, and every such code
  is documented; a row that names the commands answering a code names each command that does.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
from enum import Enum
from functools import cache
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core.models import SavepointSummary
from tests.conftest import ROOT

DOCS = ROOT / "docs"
PACKAGE = ROOT / "airflow_savepoints"
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


# --- cli.md: the commands ----------------------------------------------------------------------------
@cache
def commands() -> dict[str, object]:
    """Every command by its full name ("trigger", "job start"), as click sees it."""
    found: dict[str, object] = {}

    def walk(group, prefix):
        for name, command in group.commands.items():
            if getattr(command, "commands", None):
                walk(command, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = command

    walk(get_command(app), "")
    return found


def options(command) -> dict[str, object]:
    """Each option's spellings (``--x``, ``--no-x``) -> the option; ``--help`` left out."""
    return {opt: p for p in command.params if p.param_type_name == "option"
            for opt in p.opts + p.secondary_opts if opt.startswith("--")}


@cache
def cli_sections() -> dict[str, str]:
    """cli.md's text by ``## <command>`` heading (the heading's first words up to a colon)."""
    text = (DOCS / "cli.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {heading.split(":")[0].strip(): body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


def synopsis(name: str) -> str:
    """The command's synopsis: the first code block of its section, ``[COMMON]`` spelled out."""
    section = cli_sections()[name]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, f"docs/cli.md ## {name} has no synopsis block"
    lines = block.group(1).split("\n")
    assert re.sub(r" +", " ", lines[0]).startswith(f"airflow-savepoints {name}"), \
        f"docs/cli.md ## {name}: the synopsis starts with {lines[0]!r}"
    text = " ".join(line.strip() for line in lines)
    if "[COMMON]" in text:
        common = re.search(r"COMMON: (.*?)```", cli_sections()["job"], re.S)
        text = text.replace("[COMMON]", " ".join(common.group(1).split()))
    return text


def prose(name: str) -> str:
    """The section's text outside code blocks."""
    return re.sub(r"```.*?```", "", cli_sections()[name], flags=re.S)


def test_every_command_has_its_own_section_and_every_section_is_a_command():
    documented = {name for name in cli_sections() if name.split(" ")[0] in {n.split(" ")[0] for n in commands()}}
    assert set(commands()) - documented == set(), "commands without a ## section in docs/cli.md"
    assert documented - set(commands()) - {"job", "dags"} == set(), "## sections naming no command"


@pytest.mark.parametrize("name", sorted(commands()))
def test_the_synopsis_names_exactly_the_commands_options(name):
    real = options(commands()[name])
    shown = set(FLAG.findall(synopsis(name)))
    assert sorted(shown - set(real)) == [], f"docs/cli.md ## {name} shows options `{name}` does not have"
    missing = sorted({p.opts[0] for p in real.values()} - {p.opts[0] for o, p in real.items() if o in shown})
    assert missing == [], f"docs/cli.md ## {name}'s synopsis lacks options of `{name}`"


def _real_default(param) -> str | None:
    value = param.default
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return None if value is None or isinstance(value, bool) else str(value)


@pytest.mark.parametrize("name", sorted(commands()))
def test_the_defaults_shown_are_the_real_defaults(name):
    """``[--grace 60]`` claims 60 is the default; ``[--grace N]`` (a placeholder in capitals) claims none;
    ``--type manual|periodic|stop`` lists the choices (the first one the default, when there is one)."""
    real = options(commands()[name])
    wrong = []
    for flag, value in re.findall(r"(--[a-z][a-z0-9-]*)[ =]([^\s\]\[]+)", synopsis(name)):
        if flag not in real or value.startswith("-") or value == "|":
            continue
        param, default = real[flag], _real_default(real[flag])
        if "|" in value and value == value.lower():
            choices = value.split("|")
            if isinstance(param.default, Enum):
                if set(choices) != {c.value for c in type(param.default)} or choices[0] != param.default.value:
                    wrong.append(f"{flag} {value}: the choices are {[c.value for c in type(param.default)]}, "
                                 f"default {param.default.value}")
            continue
        if re.fullmatch(r"[A-Z][A-Z0-9_=:,.]*|[A-Z].*\|.*", value):
            continue  # a placeholder: no default claimed
        if value != default:
            wrong.append(f"{flag} {value}: the default is {default!r}")
    assert wrong == [], f"docs/cli.md ## {name}: {wrong}"


OTHER_COMMAND = re.compile(r"`(?:airflow-savepoints )?(?:job |dags )?([a-z]+) --")


@pytest.mark.parametrize("name", sorted(commands()))
def test_the_options_the_text_names_are_the_commands(name):
    """An option in backticks in a command's section is that command's, unless the backticks name another
    command (`restore --state-partitions`)."""
    real = options(commands()[name])
    foreign = []
    for quoted in re.findall(r"`([^`]+)`", prose(name)):
        other = OTHER_COMMAND.match(f"`{quoted}")
        if other and other.group(1) != name.split(" ")[-1]:
            continue
        foreign += [f for f in FLAG.findall(quoted) if quoted.lstrip("`").startswith(("--", name.split(" ")[-1]))
                    and f not in real]
    assert foreign == [], f"docs/cli.md ## {name} names options `{name}` does not have"


# --- cli.md: the JSON each command prints -------------------------------------------------------------
def json_keys(text: str) -> list[str]:
    """The keys a ``JSON: `a`, `b` (…), `c`.`` (or ``{"a", "b": […]}``) line lists, outside parentheses."""
    match = re.search(r"JSON(?: \(`\w+`\))?: ", text)
    assert match, "no JSON: line"
    keys, depth, i, rest = [], 0, 0, text[match.end():]
    while i < len(rest):
        ch = rest[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and (ch == "}" or (ch == "." and rest[i + 1 : i + 2] in ("", " ", "\n")) or rest[i : i + 2] == "\n\n"):
            break
        elif ch in "`\"":
            end = rest.index(ch, i + 1)
            if depth == 0 and re.fullmatch(r"[a-z_]+", rest[i + 1 : end]):
                keys.append(rest[i + 1 : end])
            i = end
        i += 1
    return keys


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, dict]:
    """Each command that needs no Spark and no running job, run for real with --json; its answer."""
    from tests.support.synthetic import write_checkpoint

    base = tmp_path_factory.mktemp("cli")
    checkpoint = write_checkpoint(base / "ckpt")
    root = base / "savepoints"
    root.mkdir()
    jobs = base / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - name: orders\n    application: app.py\n    checkpoint: {checkpoint}\n    savepoint_dir: {root}\n")
    runner = CliRunner()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__SAVEPOINTS", "AIRFLOW_CONN_"))}

    def run(*args: str) -> dict:
        result = runner.invoke(app, [*args, "--json"], env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    out = {"trigger": run("trigger", str(checkpoint), "--job", "orders", "--dir", str(root), "--type", "periodic")}
    pointer = out["trigger"]["pointer"]
    out["trigger-2"] = run("trigger", str(checkpoint), "--job", "orders", "--dir", str(root))
    out |= {
        "list": run("list", "--job", "orders", "--dir", str(root)),
        "show": run("show", pointer),
        "verify": run("verify", pointer),
        "offsets": run("offsets", pointer),
        "restore": run("restore", pointer, "--to", str(base / "restored")),
        "catalog": run("catalog", "--job", "orders", "--dir", str(root)),
        "retain": run("retain", "--job", "orders", "--dir", str(root), "--dry-run"),
        "status": run("status", "--job", "orders", "--dir", str(root)),
        "job status": run("job", "status", "orders", "--jobs-file", str(jobs)),
        "dags install": run("dags", "install", str(base / "dags")),
        "version": run("version"),
    }
    out["dispose"] = run("dispose", pointer, "--dir", str(root))
    return out


@pytest.mark.parametrize("name", ["trigger", "list", "show", "verify", "offsets", "restore", "catalog", "retain",
                                  "status", "job status", "dags install", "version", "dispose"])
def test_the_json_keys_listed_are_the_keys_printed(printed, name):
    documented = json_keys(prose(name))
    assert len(documented) == len(set(documented)), f"docs/cli.md ## {name} lists a key twice: {documented}"
    assert sorted(documented) == sorted(printed[name]), f"docs/cli.md ## {name}'s JSON keys"


def test_retains_decision_keys_are_the_keys_printed(printed):
    each = re.search(r"`decisions` \(each: ([^)]*)\)", prose("retain"))
    assert each and printed["retain"]["decisions"], "retain's JSON: no `decisions` (each: …) list, or no decision printed"
    assert sorted(re.findall(r"`(\w+)`", each.group(1))) == sorted(printed["retain"]["decisions"][0])


def test_inspects_json_keys_are_the_state_summarys_fields():
    from airflow_savepoints.core.state_summary import StateSummary  # no Spark imported

    assert sorted(json_keys(prose("inspect"))) == sorted(StateSummary.model_fields)


def test_api_mds_summary_keys_are_the_summary_models_fields():
    text = (DOCS / "api.md").read_text()
    assert sorted(json_keys(text[text.index("A summary is the record"):])) == sorted(SavepointSummary.model_fields)


# --- airflow.md: operators and example DAGs -----------------------------------------------------------
def operator_rows() -> dict[str, str]:
    text = (DOCS / "airflow.md").read_text()
    return dict(re.findall(r"^\| `(\w+(?:Operator|Sensor))\((.*?)\)` \|", text, re.M))


def _operator_class(name: str):
    import airflow_savepoints.operators as operators
    import airflow_savepoints.sensors as sensors

    for package in (operators, sensors):
        for module in Path(package.__file__).parent.glob("*.py"):
            if re.search(rf"^class {name}\(", module.read_text(), re.M):
                imported = __import__(f"{package.__name__}.{module.stem}", fromlist=[name])
                return getattr(imported, name)
    raise AssertionError(f"docs/airflow.md names {name}, which no module defines")


def _documented_params(signature: str) -> dict[str, object]:
    call = ast.parse(f"f({signature})", mode="eval").body
    params = {a.id: inspect.Parameter.empty for a in call.args}
    params |= {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    return params


def operator_params(cls) -> dict[str, object]:
    """The keyword arguments the operator takes: its ``__init__``'s and its project bases' (the first definer's
    default), less those a subclass passes to its base itself (``SuperviseJobsOperator`` passes ``job``)."""
    params: dict[str, object] = {}
    fixed: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("airflow_savepoints") or "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                params.setdefault(p.name, p.default)
        init = ast.parse(inspect.getsource(klass.__init__).strip().replace("\n    ", "\n"))
        fixed |= set(re.findall(r'kwargs\.setdefault\("(\w+)"', inspect.getsource(klass.__init__)))
        fixed |= {k.arg for call in ast.walk(init) if isinstance(call, ast.Call)
                  and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__" for k in call.keywords if k.arg}
    return {k: v for k, v in params.items() if k not in fixed}


# the bases' arguments, documented once: every operator's (the Operators intro), the job operators' (the list
# below the table), the sensors' (the Sensors intro)
BASE_ARGUMENTS = ("savepoints_conn_id", "savepoint_dir", "checkpoint_conn_id", "deferrable")


def test_the_bases_arguments_are_documented_once():
    text = (DOCS / "airflow.md").read_text()
    operators = text.split("\n## Operators\n", 1)[1].split("\n| operator |", 1)[0]
    job_operators = text.split("Every job operator takes these connection arguments:", 1)[1].split("\n\n", 2)[1]
    sensors = text.split("\n## Sensors\n", 1)[1].split("\n\n", 1)[0]
    assert "`savepoints_conn_id`" in operators and "`savepoint_dir`" in operators
    assert "`checkpoint_conn_id`" in job_operators and "`deferrable`" in sensors


@pytest.mark.parametrize("name", sorted(operator_rows()))
def test_each_operator_signature_is_the_classes(name):
    """Each documented parameter exists with its default; each parameter of the class is documented, in its
    row or (the job operators' connection arguments, ``allow_foreign_savepoint``) in the text below."""
    real = operator_params(_operator_class(name))
    documented = _documented_params(operator_rows()[name])
    assert {k: v for k, v in documented.items() if real.get(k, "missing") != v} == {}, \
        f"docs/airflow.md: {name}'s documented parameters differ from the class's {real}"
    text = (DOCS / "airflow.md").read_text()
    elsewhere = set(BASE_ARGUMENTS) | set(re.findall(rf"`{name}\((\w+)=", text))
    assert sorted(set(real) - set(documented) - elsewhere) == [], f"docs/airflow.md does not document {name}'s"


def dag_params() -> dict[str, list[str]]:
    found = {}
    for path in (ROOT / "dags").glob("*.py"):
        tree = ast.parse(path.read_text())
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and any(k.arg == "dag_id" for k in call.keywords):
                dag_id = next(k.value.value for k in call.keywords if k.arg == "dag_id")
                params = next((k.value for k in call.keywords if k.arg == "params"), None)
                found[dag_id] = [k.value for k in params.keys] if isinstance(params, ast.Dict) else []
    return found


@pytest.mark.parametrize("dag_id", sorted(dag_params()))
def test_each_example_dags_params_are_the_dags(dag_id):
    text = (DOCS / "airflow.md").read_text()
    row = re.search(rf"^\| `{dag_id}` \| ([^|]*) \|", text, re.M)
    assert row, f"docs/airflow.md's example DAG table has no row for {dag_id}"
    shown = re.search(r"Params? (.*)", row.group(1))
    assert sorted(re.findall(r"`(\w+)`", shown.group(1)) if shown else []) == sorted(dag_params()[dag_id])


def test_the_trigger_operators_checkpoint_precedence_is_the_codes(tmp_path):
    """airflow.md states in which order the checkpoint is chosen; the operator's own resolution agrees."""
    from airflow_savepoints.operators.savepoint import TriggerSavepointOperator

    source = inspect.getsource(TriggerSavepointOperator.execute)
    order = re.search(r"checkpoint = self\.checkpoint or recorded_checkpoint\(store, self\.job, self\.fallback_checkpoint\)",
                      source)
    assert order, "TriggerSavepointOperator no longer chooses: checkpoint, else the recorded run's, else fallback"
    row = operator_rows()["TriggerSavepointOperator"]
    assert row
    text = (DOCS / "airflow.md").read_text()
    cell = re.search(r"^\| `TriggerSavepointOperator\(.*?\)` \| ([^|]*) \|", text, re.M).group(1)
    named = [n for n in re.findall(r"`(checkpoint|fallback_checkpoint)`|(recorded run)", cell) for n in n if n]
    assert named[:3] == ["checkpoint", "recorded run", "fallback_checkpoint"], \
        f"docs/airflow.md: TriggerSavepointOperator's checkpoint, in the order it states: {named}"


# --- errors: documented both ways ---------------------------------------------------------------------
@cache
def error_classes() -> dict[str, tuple[str, str]]:
    """Every error class in the package with a code: class name -> (code, its base class's name)."""
    classes: dict[str, tuple[str, str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.Assign) and [t.id for t in item.targets if isinstance(t, ast.Name)] == ["code"]:
                        base = node.bases[0]
                        classes[node.name] = (item.value.value, base.id if isinstance(base, ast.Name) else base.attr)
    return classes


@cache
def raised_codes() -> set[str]:
    """The codes of the error classes some module raises (or builds: a call, or a mapping that raises it later)."""
    used: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                used.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                    used.add(func.value.id)  # a constructor classmethod: UnexpectedError.wrap(exc)
            elif isinstance(node, (ast.Dict, ast.Tuple)) and not isinstance(getattr(node, "ctx", None), ast.Store):
                for value in (node.values if isinstance(node, ast.Dict) else node.elts):
                    used.add(getattr(value, "id", getattr(value, "attr", "")))
    return {code for name, (code, _) in error_classes().items() if name in used} - {"error"}  # the root


def kinds() -> set[str]:
    """The codes of classes other error classes derive from (``pointer_error``: scripts may match on a kind)."""
    bases = {base for _, base in error_classes().values()}
    return {code for name, (code, _) in error_classes().items() if name in bases}


def documented_codes() -> set[str]:
    cli = (DOCS / "cli.md").read_text().split("\n## Errors\n", 1)[1]
    api = (DOCS / "api.md").read_text()
    api = api[api.index("### Errors"):api.index("## The console")]
    return set(re.findall(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)*)`", cli + api)) & (set(c for c, _ in error_classes().values())
                                                                               | {"usage_error"})


def test_every_raised_error_code_is_documented():
    missing = sorted(raised_codes() - documented_codes())
    assert len(raised_codes()) > 40
    assert missing == [], f"docs/cli.md ## Errors (or api.md's Errors) does not name: {missing}"


def test_every_documented_error_code_is_raised_somewhere():
    text = (DOCS / "cli.md").read_text().split("\n## Errors\n", 1)[1]
    rows = dict(re.findall(r"^\| (`[^|]+`) \| ([^\n]*) \|$", text, re.M))
    codes = {x for x, _ in error_classes().values()}
    named_codes = {c for cell in rows for c in re.findall(r"`(\w+)`", cell)} | {
        c for c in re.findall(r"`(\w+)`", text.split("Not answered by the CLI", 1)[1]) if c in codes}
    assert "usage_error" in named_codes and "usage_error" in (PACKAGE / "cli" / "main.py").read_text()
    unknown = sorted(named_codes - {c for c, _ in error_classes().values()} - {"usage_error"})
    assert unknown == [], f"docs/cli.md ## Errors names codes no error class has: {unknown}"
    never = sorted(named_codes - raised_codes() - kinds() - {"usage_error"})
    assert never == [], f"docs/cli.md ## Errors names codes nothing raises: {never}"


# --- errors: the commands a row names, and the history's failed attempt -------------------------------
@pytest.fixture(scope="module")
def answered(tmp_path_factory) -> dict:
    """Failures caused for real (no Spark): (command, code) -> the error message the command printed."""
    from airflow_savepoints.core.savepoint import take_savepoint
    from airflow_savepoints.errors import SavepointRetriesExhaustedError
    from tests.support.synthetic import write_checkpoint

    base = tmp_path_factory.mktemp("failures")
    runner = CliRunner()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__SAVEPOINTS", "AIRFLOW_CONN_"))}
    seen: dict[tuple[str, str], str] = {}

    def run(command: str, *args: str) -> None:
        result = runner.invoke(app, [*command.split(" "), *args, "--json"], env=env)
        assert result.exit_code == 1, result.output
        error = json.loads(result.output)["error"]
        seen[command, error["code"]] = error["message"]

    root = base / "savepoints"
    linked = write_checkpoint(base / "linked")
    (linked / "state/0/0/2.delta").unlink()
    (linked / "state/0/0/2.delta").symlink_to(base / "outside")
    run("trigger", str(linked), "--job", "orders", "--dir", str(root))
    gap = write_checkpoint(base / "gap")  # Spark purged a file-source log entry the batch still needs
    (gap / "sources/0/1").unlink()
    run("trigger", str(gap), "--job", "orders", "--dir", str(root))
    taken = runner.invoke(app, ["trigger", str(write_checkpoint(base / "ckpt")), "--job", "orders", "--dir", str(root),
                                "--json"], env=env)
    pointer = Path(json.loads(taken.output)["pointer"])
    (base / "outside").mkdir()
    (pointer / "state/0/evil").symlink_to(base / "outside")
    run("verify", str(pointer))
    run("restore", str(pointer), "--to", str(base / "restored"))
    run("dispose", str(pointer), "--dir", str(root))
    run("trigger", str(base / "missing"), "--job", "orders", "--dir", str(root))
    moving = write_checkpoint(base / "moving")

    def spark_purges_a_planned_file(event: str, _: dict) -> None:
        if event == "planned":
            (moving / "state/0/1/3.delta").unlink()

    with pytest.raises(SavepointRetriesExhaustedError):
        take_savepoint(str(moving), "orders", savepoint_dir=str(root), max_attempts=1, on_event=spark_purges_a_planned_file)
    seen["history"] = json.loads((root / "orders" / "_catalog.json").read_text()).get("history", [])
    return seen


def error_rows() -> dict[str, str]:
    text = (DOCS / "cli.md").read_text().split("\n## Errors\n", 1)[1]
    rows = {}
    for codes, when in re.findall(r"^\| (`[^|]+`) \| ([^\n]*) \|$", text, re.M):
        for code in re.findall(r"`(\w+)`", codes):
            rows[code] = when
    return rows


def test_a_code_a_command_answers_is_documented_with_that_command(answered):
    """Each (command, code) caused above: the code's row in ## Errors names the command."""
    pairs = sorted(k for k in answered if isinstance(k, tuple))
    assert ("trigger", "checkpoint_race") in pairs and ("verify", "symlink_refused") in pairs, pairs
    missing = [f"{code}: `{command}`" for command, code in pairs if code not in {"checkpoint_not_found"}
               and f"`{command}`" not in error_rows().get(code, "") and not re.search(rf"`{command} --", error_rows().get(code, ""))]
    assert missing == [], f"docs/cli.md ## Errors: a row does not name a command that answers its code: {missing}"


def test_the_history_examples_failed_attempt_is_one_the_code_keeps(answered):
    """api.md's example of a failed attempt is one the catalog keeps: its error (``…`` standing for any text,
    numbers for any number) is the error of a failure caused above and kept (Spark purged a planned file during
    the copy), and its keys are a history entry's. Bad input (a missing checkpoint) is no attempt: not kept."""
    from airflow_savepoints.core.catalog import HistoryEntry

    kept = [h["error"] for h in answered["history"] if h["outcome"] == "failed"]
    assert len(kept) == 1 and "consistent savepoint" in kept[0], kept
    text = (DOCS / "api.md").read_text().split("### History", 1)[1]
    example = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    failed = re.findall(r'"outcome": "failed".*?"error": "([^"]*)"', example, re.S)
    assert failed, "api.md's History example shows no failed attempt"
    for error in failed:
        pattern = ".*".join(re.sub(r"\d+", r"\\d+", re.escape(part.strip())) for part in
                            re.sub(r"\S+://\S+", "…", error).split("…"))
        assert any(re.match(pattern, k) for k in kept), \
            f"api.md's History example shows a failed attempt {error!r}; failures kept read {kept}"
    first = re.search(r'\{"savepoint_id".*?\},?\n', example, re.S)
    assert first
    keys = set(re.findall(r'"(\w+)":', first.group(0)))
    assert keys <= set(HistoryEntry.model_fields) | {"duration_s", "error_reason"}, keys


# --- links between the docs ---------------------------------------------------------------------------
def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_section_finds_it():
    pages = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
    anchors = {p.name: {_slug(h) for h in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", p.read_text(), flags=re.S),
                                                     re.M)} for p in pages}
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(((?:docs/)?[\w-]*\.md)?#([\w-]+)\)", page.read_text()):
            name = Path(target).name if target else page.name
            if name in anchors and anchor not in anchors[name]:
                broken.append(f"{page.name} -> {name}#{anchor}")
    assert broken == []


def test_every_relative_link_finds_its_file():
    pages = sorted(DOCS.glob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks/results/README.md"]
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages
              for target in re.findall(r"\]\((?!https?:|#|mailto:)([^)#\s]+)", page.read_text())
              if not (page.parent / target).exists()]
    assert broken == []


def test_performance_md_is_todays_page_and_the_history_is_in_benchmarks_results():
    """Today's method and figures, at most 300 lines; the dated record is benchmarks/results/README.md."""
    text = (DOCS / "performance.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "benchmarks/results/README.md" in text
    assert (ROOT / "benchmarks/results/README.md").exists()
