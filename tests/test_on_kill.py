"""A task killed while it writes a savepoint leaves nothing behind: no partial location, no lease.

The operator runs in its own process; SIGTERM reaches it mid-copy and, as Airflow's task runner
does, the handler calls ``on_kill()`` before the process exits. The copy is slowed down (a sleep
before the real copy) so the signal lands while the location exists without its ``_metadata``.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from airflow_savepoints.core import list_savepoints, take_savepoint
from airflow_savepoints.storage import Store
from tests.conftest import ROOT, job_folder_entries, tree_snapshot

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import airflow_savepoints.core.savepoint as engine
    from airflow_savepoints.operators.{module} import {operator}

    real_copy = engine.copy_many
    def slow_copy(*args, **kwargs):
        print("COPYING", flush=True)
        time.sleep(120)
        return real_copy(*args, **kwargs)
    engine.copy_many = slow_copy

    operator = {operator}(task_id="t", {arguments})
    def terminated(signum, frame):  # what Airflow's task runner does on SIGTERM
        operator.on_kill()
        os._exit(143)
    signal.signal(signal.SIGTERM, terminated)
    operator.execute({{}})
""")


def run_and_kill(tmp_path, module: str, operator: str, arguments: str) -> int:
    process = subprocess.Popen([sys.executable, "-c", SCRIPT.format(module=module, operator=operator,
                                                                    arguments=arguments)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "COPYING" not in line and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                break
        assert "COPYING" in line, process.stdout.read()
        partial = [p for p in (tmp_path / "sp" / "demo").iterdir() if p.name.startswith("savepoint-")]
        assert len(partial) == 1 and not (partial[0] / "_metadata").exists()  # killed mid-copy
        assert (tmp_path / "sp" / "demo" / "_inflight.json").exists()
        process.send_signal(signal.SIGTERM)
        return process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("module,operator,arguments", [
    ("savepoint", "TriggerSavepointOperator", "job='demo', checkpoint='{ck}', savepoint_dir='{sp}', outlets=[]"),
    ("job", "StopJobWithSavepointOperator", "job='demo', jobs_file='{jobs}'"),
], ids=["trigger", "stop"])
def test_a_killed_task_leaves_no_partial_savepoint_and_no_lease(stopped_checkpoint, tmp_path, module, operator,
                                                                arguments):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(stopped_checkpoint, checkpoint)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - {{name: demo, application: /app.py, checkpoint: {checkpoint}, "
                    f"savepoint_dir: {tmp_path / 'sp'}}}\n")
    before = tree_snapshot(checkpoint)
    code = run_and_kill(tmp_path, module, operator,
                        arguments.format(ck=checkpoint, sp=tmp_path / "sp", jobs=jobs))
    assert code == 143
    assert job_folder_entries(tmp_path / "sp" / "demo") == []  # no location, no lease
    assert list_savepoints(Store(str(tmp_path / "sp")), "demo") == []  # no record left in progress
    assert tree_snapshot(checkpoint) == before  # the live checkpoint is untouched
    # the next trigger is not blocked by a dead task's lease, and succeeds
    info = take_savepoint(str(checkpoint), "demo", savepoint_dir=str(tmp_path / "sp"))
    assert [s.pointer for s in list_savepoints(Store(str(tmp_path / "sp")), "demo")] == [info.pointer]
