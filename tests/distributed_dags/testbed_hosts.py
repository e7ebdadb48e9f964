"""Test bed DAG: one task per worker queue, each saying where it ran, what it can see and whether it
and a process it executes can import pyspark."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from datetime import datetime

from airflow.sdk import dag, task

WORKERS = ("worker-a", "worker-b")


def where_am_i() -> dict:
    """The host name, this process's pid and every process this task can see (pid: command line)."""
    seen = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    seen[entry] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue  # ended meanwhile
    return {"hostname": socket.gethostname(), "pid": os.getpid(), "processes": seen,
            "pyspark": pyspark_import(), "pyspark_in_subprocess": subprocess.run(
                [sys.executable, "-c", "import pyspark; print(pyspark.__version__)"], capture_output=True, text=True).stdout.strip()}


def pyspark_import() -> str:
    """pyspark's version, or why it cannot be imported here."""
    try:
        return importlib.import_module("pyspark").__version__
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"


@dag(dag_id="testbed_hosts", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, tags=["testbed"])
def testbed_hosts():
    for worker in WORKERS:
        task(task_id=f"on_{worker.replace('-', '_')}", queue=worker)(where_am_i)()


testbed_hosts()
