"""The CLI's savepoint directory, opened in the console script's process (``freeze_after_open``)."""

from __future__ import annotations

import gc

import pytest

from airflow_savepoints.cli import storage
from airflow_savepoints.errors import NoSavepointDirError


@pytest.fixture
def console_script(monkeypatch):
    """open_root as the console script runs it; the collector's state put back afterwards."""
    monkeypatch.setattr(storage, "freeze_after_open", True)
    monkeypatch.delenv("AIRFLOW__SAVEPOINTS__SAVEPOINT_DIR", raising=False)
    yield
    gc.unfreeze()
    gc.enable()


def test_the_console_script_collects_nothing_while_the_store_is_opened_and_freezes_what_it_imported(
        console_script, tmp_path, monkeypatch):
    seen: list[bool] = []
    opened = storage.open_root
    monkeypatch.setattr(storage, "storage_hook", lambda conn_id: seen.append(gc.isenabled()))
    root = opened(None, str(tmp_path))
    assert seen == [False] and gc.isenabled() and gc.get_freeze_count() > 0
    assert root is not None and root.root == str(tmp_path)
    gc.unfreeze()
    with pytest.raises(NoSavepointDirError):  # a failed open leaves the collector on as well
        opened(None, None)
    assert gc.isenabled()
