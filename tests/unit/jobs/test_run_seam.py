"""The run object is the one seam (issue 29, item 1), checked on the source itself.

Over every module of ``airflow_savepoints/``: a runner's ``kill`` and a stop request
(``request_stop``) are called only in ``jobs/workflows/run.py``; ``os.kill``/``killpg`` and ``send_signal``
only in the runner back ends behind it (and the demo console, on the web server it started
itself); a terminated job's checkpoint is kept or deleted (``apply_checkpoint_retention``) only in
``jobs/workflows/run.py``; the driver's own control files are written only in ``jobs/driver/control.py``. (That
imports run one way is tests/unit/test_import_layers.py's.)
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "airflow_savepoints"

# call name -> the modules that may call it (paths under airflow_savepoints/)
ALLOWED = {
    "kill": {"jobs/workflows/run.py"},  # Runner.kill: the run ends a run through its back end
    "request_stop": {"jobs/workflows/run.py"},  # the control file Airflow's side writes
    "apply_checkpoint_retention": {"jobs/workflows/run.py"},  # keep or delete a terminated job's checkpoint
    "os.kill": {"jobs/launch/runners.py"},
    "os.killpg": {"jobs/launch/runners.py", "demo/console.py"},  # demo/console.py: its own web server, started by it
    "send_signal": {"jobs/launch/runners.py"},
    # the driver's side of the control folder, written by the driver's loop only
    **dict.fromkeys(("announce", "acknowledge_stop", "report_failure", "report_fenced", "beat"), {"jobs/driver/control.py"}),
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
    assert not wrong, f"called outside the run object (jobs/workflows/run.py) and its back ends: {wrong}"
    assert callers["kill"] == callers["request_stop"] == callers["apply_checkpoint_retention"] == {"jobs/workflows/run.py"}
