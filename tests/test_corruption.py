"""A damaged savepoint is refused by verify and restore (CLI and Python API), naming the damaged file.

Damage, in a completed savepoint on local disk and on a real S3 server (moto): one flipped byte in
a state file, a truncated offsets file, a flipped byte in the checkpoint's ``metadata`` (the query
id) and a truncated ``_metadata`` manifest. Every refusal leaves the restore target without a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_savepoints.cli.main import app
from airflow_savepoints.core import restore_savepoint, take_savepoint, verify_savepoint
from airflow_savepoints.errors import ManifestCorruptError, VerificationError
from airflow_savepoints.storage import Store
from tests.conftest import is_state_file

DAMAGE = {  # name -> (which file, what to do to its bytes, the error code verify and restore give)
    "flipped-state-byte": (lambda paths: sorted(p for p in paths if is_state_file(p))[-1],
                           lambda data: data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x01]) + data[len(data) // 2 + 1:],
                           "verification_failed"),
    "truncated-offsets": (lambda paths: sorted((p for p in paths if p.startswith("offsets/")), key=lambda p: int(p[8:]))[-1],
                          lambda data: data[: len(data) - 7], "verification_failed"),
    "flipped-query-id": (lambda paths: "metadata", lambda data: data.replace(b"-", b".", 1), "verification_failed"),
    "truncated-manifest": (lambda paths: "_metadata", lambda data: data[: len(data) // 2], "manifest_corrupt"),
}


def cli(*args: str) -> tuple[int, dict]:
    """The CLI in this process (as tests/test_cli.py runs it): no interpreter start per command."""
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


def damaged_savepoint(checkpoint: Path, root: str, damage: str) -> tuple[str, Store, str]:
    """A completed, verified savepoint with one file damaged: (pointer, its store, the damaged path)."""
    info = take_savepoint(str(checkpoint), "job", savepoint_dir=root, copy_mode="stream")
    verify_savepoint(info.pointer)
    location = Store(info.pointer)
    pick, change, _ = DAMAGE[damage]
    victim = pick([e.path for e in info.manifest.files])
    data = location.read_bytes(victim)
    if location.protocol == "file":
        Path(location.path_of(victim)).unlink()  # a new file: never write through to another link of it
    location.write_bytes_atomic(victim, change(data))
    assert location.read_bytes(victim) != data
    return info.pointer, location, victim


def target_files(target: str) -> dict:
    return Store(target).list_files()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_damaged_savepoint_is_refused_by_verify_and_restore_naming_the_file(stopped_checkpoint, tmp_path, request,
                                                                              where, damage):
    if where == "s3":
        bucket = request.getfixturevalue("s3")
        root, targets = f"s3://{bucket}/savepoints", (f"s3://{bucket}/restored-api", str(tmp_path / "restored-cli"))
    else:
        root, targets = str(tmp_path / "sp"), (str(tmp_path / "restored-api"), str(tmp_path / "restored-cli"))
    pointer, location, victim = damaged_savepoint(stopped_checkpoint, root, damage)
    code = DAMAGE[damage][2]
    expected = ManifestCorruptError if code == "manifest_corrupt" else VerificationError
    savepoint_before = {path: location.read_bytes(path) for path in location.list_files()}

    with pytest.raises(expected) as verified:
        verify_savepoint(pointer)
    assert victim in verified.value.message and verified.value.hint
    with pytest.raises(expected) as restored:
        restore_savepoint(pointer, targets[0])
    assert victim in restored.value.message
    assert target_files(targets[0]) == {}

    status, out = cli("verify", pointer)
    assert status == 1 and out["error"]["code"] == code and victim in out["error"]["message"], out
    status, out = cli("restore", pointer, "--to", targets[1])
    assert status == 1 and out["error"]["code"] == code and victim in out["error"]["message"], out
    assert target_files(targets[1]) == {}

    # refusing changed nothing in the savepoint (the damage is still there, for a person to inspect)
    assert {path: location.read_bytes(path) for path in location.list_files()} == savepoint_before
    print(f"\n{where} {damage} in {victim}: verify and restore refused ({code}): {verified.value.message[:160]}")


def test_a_restore_into_a_target_that_is_not_empty_is_refused_and_the_target_untouched(stopped_checkpoint, tmp_path):
    """A damaged savepoint and a non-empty target: refused before anything is written, target as it was."""
    pointer, _, _ = damaged_savepoint(stopped_checkpoint, str(tmp_path / "sp"), "flipped-state-byte")
    target = tmp_path / "target"
    (target / "offsets").mkdir(parents=True)
    (target / "offsets" / "0").write_text("v1\nmine\n")
    status, out = cli("restore", pointer, "--to", str(target))
    assert status == 1 and out["error"]["code"] == "target_not_empty"
    assert {str(p.relative_to(target)): p.read_text() for p in target.rglob("*") if p.is_file()} == {"offsets/0": "v1\nmine\n"}
