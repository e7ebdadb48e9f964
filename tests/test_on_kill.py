"""A task killed while it writes a savepoint leaves nothing behind: no partial location, no lease.

The operator runs in its own process; SIGTERM reaches it mid-copy and, as Airflow's task runner
does, the handler calls ``on_kill()`` before the process exits. The kill is driven by the product's
own ``on_event`` hook (the operator's, wrapped, still tracking the location): after ``COPIED`` files
are reported copied (``file_done``), the copy is held there until the signal comes, so ``on_kill``
has copied files to remove.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from airflow_savepoints.core import list_savepoints, take_savepoint
from airflow_savepoints.storage import Store
from tests.conftest import ROOT, job_folder_entries, tree_snapshot

COPIED = 3  # files copied into the location when the task is killed

SCRIPT = textwrap.dedent("""
    import os, signal, time
    from airflow_savepoints.operators.{module} import {operator}

    operator = {operator}(task_id="t", {arguments})
    events = operator.savepoint_events

    def observed(root, job):  # the operator's own hook, reporting each copied file, held after the Nth
        track, copied = events(root, job), []
        def on_event(event, data):
            track(event, data)
            if event == "file_done":
                copied.append(data["path"])
                print("FILE_DONE", len(copied), flush=True)
                if len(copied) == {copied}:
                    time.sleep(120)  # the kill lands here: {copied} files copied, no _metadata
        return on_event

    operator.savepoint_events = observed
    def terminated(signum, frame):  # what Airflow's task runner does on SIGTERM
        operator.on_kill()
        os._exit(143)
    signal.signal(signal.SIGTERM, terminated)
    operator.execute({{}})
""")


def run_and_kill(tmp_path, module: str, operator: str, arguments: str) -> tuple[int, int]:
    """Run the operator, SIGTERM it once ``COPIED`` files are copied; (exit code, files in the location then)."""
    process = subprocess.Popen([sys.executable, "-c", SCRIPT.format(module=module, operator=operator,
                                                                    arguments=arguments, copied=COPIED)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        lines = []
        while not lines or lines[-1] != f"FILE_DONE {COPIED}":
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                break
            lines.append(line.strip())
        assert lines[-1] == f"FILE_DONE {COPIED}", "\n".join(lines) + process.stdout.read()
        partial = [p for p in (tmp_path / "sp" / "demo").iterdir() if p.name.startswith("savepoint-")]
        assert len(partial) == 1 and not (partial[0] / "_metadata").exists()  # killed mid-copy
        assert (tmp_path / "sp" / "demo" / "_inflight.json").exists()
        copied = sum(1 for p in partial[0].rglob("*") if p.is_file())
        process.send_signal(signal.SIGTERM)
        return process.wait(30), copied
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
    code, copied = run_and_kill(tmp_path, module, operator,
                                arguments.format(ck=checkpoint, sp=tmp_path / "sp", jobs=jobs))
    assert code == 143 and copied >= COPIED  # files were copied when the task was killed
    assert job_folder_entries(tmp_path / "sp" / "demo") == []  # no location, no lease
    assert list_savepoints(Store(str(tmp_path / "sp")), "demo") == []  # no record left in progress
    assert tree_snapshot(checkpoint) == before  # the live checkpoint is untouched
    # the next trigger is not blocked by a dead task's lease, and succeeds
    info = take_savepoint(str(checkpoint), "demo", savepoint_dir=str(tmp_path / "sp"))
    assert [s.pointer for s in list_savepoints(Store(str(tmp_path / "sp")), "demo")] == [info.pointer]
