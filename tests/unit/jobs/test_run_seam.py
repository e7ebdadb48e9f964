"""The run object is the one seam (issue 29, item 1), checked on the source itself.

Over every module of ``airflow_savepoints/``: a runner's ``kill`` and a stop request
(``request_stop``) are called only in ``jobs/run.py``; ``os.kill``/``killpg`` and ``send_signal``
only in the runner back ends behind it (and the demo console, on the web server it started
itself); a terminated job's checkpoint is kept or deleted (``apply_checkpoint_retention``) only in
``jobs/run.py``; the driver's own control files are written only in ``jobs/control.py``. And the
lifecycle, the run object and the launcher import one another one way only.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "airflow_savepoints"

# call name -> the modules that may call it (paths under airflow_savepoints/)
ALLOWED = {
    "kill": {"jobs/run.py"},  # Runner.kill: the run ends a run through its back end
    "request_stop": {"jobs/run.py"},  # the control file Airflow's side writes
    "apply_checkpoint_retention": {"jobs/run.py"},  # keep or delete a terminated job's checkpoint
    "os.kill": {"jobs/runners.py"},
    "os.killpg": {"jobs/runners.py", "demo/console.py"},  # demo/console.py: its own web server, started by it
    "send_signal": {"jobs/runners.py"},
    # the driver's side of the control folder, written by the driver's loop only
    **dict.fromkeys(("announce", "acknowledge_stop", "report_failure", "report_fenced", "beat"), {"jobs/control.py"}),
}


def _modules() -> dict[str, ast.Module]:
    return {path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(), str(path))
            for path in sorted(PACKAGE.rglob("*.py"))}


def _call_name(call: ast.Call) -> str | None:
    """``os.kill``/``os.killpg``; the method name of ``<something>.<method>(...)`` (not of ``self``:
    an operator's own ``announce`` is no control file); ``apply_checkpoint_retention`` called by name."""
    func = call.func
    if isinstance(func, ast.Attribute):
        receiver = func.value.id if isinstance(func.value, ast.Name) else None
        if receiver == "os" and func.attr in ("kill", "killpg"):
            return f"os.{func.attr}"
        return None if receiver == "self" else func.attr
    return func.id if isinstance(func, ast.Name) and func.id == "apply_checkpoint_retention" else None


def test_only_the_run_object_signals_deletes_a_checkpoint_or_writes_a_control_file():
    callers: dict[str, set[str]] = {name: set() for name in ALLOWED}
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (name := _call_name(node)) in ALLOWED:
                callers[name].add(module)
    wrong = {name: sorted(found - ALLOWED[name]) for name, found in callers.items() if found - ALLOWED[name]}
    assert not wrong, f"called outside the run object (jobs/run.py) and its back ends: {wrong}"
    assert callers["kill"] == callers["request_stop"] == callers["apply_checkpoint_retention"] == {"jobs/run.py"}


def _jobs_imports(tree: ast.Module, *, top_level_only: bool) -> set[str]:
    """The ``airflow_savepoints.jobs`` modules ``tree`` imports (anywhere in it, or at module level only)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "airflow_savepoints.jobs":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("airflow_savepoints.jobs."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[2] for alias in node.names if alias.name.startswith("airflow_savepoints.jobs."))
    return found


def test_lifecycle_run_and_launcher_import_one_another_one_way_only():
    modules = _modules()
    imports = {name: _jobs_imports(modules[f"jobs/{name}.py"], top_level_only=False)
               for name in ("lifecycle", "run", "launcher")}
    assert "run" in imports["lifecycle"] and "launcher" in imports["run"]  # lifecycle -> run -> launcher
    assert not {"lifecycle", "run"} & imports["launcher"], imports["launcher"]  # not even inside a function
    assert "lifecycle" not in imports["run"], imports["run"]

    graph = {path.removeprefix("jobs/").removesuffix(".py"): _jobs_imports(tree, top_level_only=True)
             for path, tree in modules.items() if path.startswith("jobs/")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(step == goal or (step not in seen and reaches(step, goal, seen | {step}))
                   for step in graph.get(start, ()))

    for lower in ("run", "launcher"):  # what loads when a module is imported never loads the lifecycle again
        assert not reaches(lower, "lifecycle", {lower}), lower
    assert not reaches("launcher", "run", {"launcher"})
