"""Test bed DAG: one task per worker queue, each saying where it ran and what it can see."""

from __future__ import annotations

import os
import socket
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
    return {"hostname": socket.gethostname(), "pid": os.getpid(), "processes": seen}


@dag(dag_id="testbed_hosts", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, tags=["testbed"])
def testbed_hosts():
    for worker in WORKERS:
        task(task_id=f"on_{worker.replace('-', '_')}", queue=worker)(where_am_i)()


testbed_hosts()
