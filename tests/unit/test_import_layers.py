"""Imports run one way (the contracts in pyproject.toml's ``[tool.importlinter]``, run by import-linter):
the CLI and Airflow's side over ``jobs/``, over the core, the checkpoint logic and storage; inside
``jobs/`` the workflows over launching and the driver side, over the run's description; the core
never imports Airflow; and no two modules or folders anywhere import each other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's package, whatever the venv installed
    done = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[report.find("Broken contracts"):] or report
    assert "Contracts: 5 kept, 0 broken." in report, report
