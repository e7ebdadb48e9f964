"""What a writer of the savepoint folder cannot know: per-run secrets, and the proofs made with them.

Files on shared storage only describe a run; whoever may write the savepoint folder can forge
them. What this tool acts on is proven with a secret that never goes to shared storage:

* **run tokens** (:func:`run_token`): ``HMAC(host key, job, run id)``. The launcher puts it in the
  driver's environment (:data:`RUN_TOKEN_ENV`); the local runner signals a pid only when
  ``/proc/PID/environ`` holds the token expected for the recorded job and run id
  (:func:`process_holds_token`). A driver started by another tool holds none: never signalled.
  The host key is a file created ``0600`` on first use, ``$XDG_STATE_HOME/airflow-savepoints/run.key``
  (default ``~/.local/state/...``): the local runner signals only on its own host anyway.
* **sealed files** (:func:`seal`, :func:`sealed`): an HMAC over a file's content with a secret
  the reader holds. ``job check`` makes a fresh secret per check, keeps it in memory and hands it
  to its driver in its environment (:data:`CHECK_SECRET_ENV`), or a Spark conf Spark redacts
  (:data:`CHECK_SECRET_CONF`: its name says ``secret``) for a driver on another host; a job's one-off application
  (a rescale, a standby rescale's requests too, an inspection) gets its own the same way, for its result
  (:data:`APP_SECRET_ENV`, :data:`APP_SECRET_CONF`). A run's
  control files (heartbeats, stop requests and acknowledgements, failures, its announcement) are sealed with
  its channel secret (:func:`channel_secret`): ``HMAC(run key, job, run id)``, which ``job status``
  and ``job stop`` derive on any host holding the run key (``[savepoints] run_key``, else this
  host's key: one-host set-ups), and the launcher hands to its driver (:data:`RUN_SECRET_ENV`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from airflow_savepoints.storage import Store

log = logging.getLogger(__name__)

RUN_TOKEN_ENV = "SAVEPOINTS_RUN_TOKEN"  # the run's token, in the driver's environment
RUN_SECRET_ENV = "SAVEPOINTS_RUN_SECRET"  # "<run id>:<secret>": the run's channel secret, in the driver's environment
RUN_KEY_OPTION = "run_key"  # [savepoints] run_key / AIRFLOW__SAVEPOINTS__RUN_KEY: the channel key shared by hosts
CHECK_SECRET_ENV = "SAVEPOINTS_CHECK_SECRET"  # an upgrade check's result key, in its driver's environment
CHECK_SECRET_CONF = "spark.savepoints.check.secret"  # the same as Spark conf (a cluster-mode driver); redacted
APP_SECRET_ENV = "SAVEPOINTS_APP_SECRET"  # a job's one-off application's (rescale, inspection) result and request key
APP_SECRET_CONF = "spark.savepoints.app.secret"  # the same as Spark conf (a cluster-mode driver); redacted
MAC_FIELD = "mac"
KEY_FILE_ENV = "XDG_STATE_HOME"


def key_path() -> Path:
    """Where this host's run key is: ``$XDG_STATE_HOME/airflow-savepoints/run.key`` (default ``~/.local/state``)."""
    state = os.environ.get(KEY_FILE_ENV) or str(Path.home() / ".local" / "state")
    return Path(state) / "airflow-savepoints" / "run.key"


def host_key() -> bytes:
    """This host's (and user's) run key: 32 random bytes, created ``0600`` on first use (one creator wins)."""
    path = key_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_hex(32))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(draft, path)  # complete when visible; one creator wins
        except FileExistsError:
            pass
        finally:
            os.unlink(draft)
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor) as key_file:
        text = key_file.read().strip()
    if len(text) < 32:  # a damaged file
        raise OSError(f"the run key {path} is empty or too short; remove it and it is made afresh")
    return text.encode()


def run_token(job: str, run_id: str) -> str:
    """The token of run ``run_id`` of ``job``, as this host's launcher gives it to the driver."""
    return hmac.new(host_key(), f"run\0{job}\0{run_id}".encode(), hashlib.sha256).hexdigest()


def process_holds_token(pid: int, token: str) -> bool:
    """Whether process ``pid`` was started with ``token`` in its environment (read from /proc/PID/environ).
    An environment read empty is read again for up to a second: a process still inside its exec has none yet
    (the kernel lets a vfork parent run on before the new image's environment is set up)."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            environment = psutil.Process(pid).environ()
        except psutil.Error:
            return False
        if environment or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return hmac.compare_digest(environment.get(RUN_TOKEN_ENV, "").encode(), token.encode())


def run_key() -> bytes:
    """The key run channel secrets are made with: ``[savepoints] run_key`` when configured (every host
    that runs or judges the job's runs needs the same), else this host's key (:func:`host_key`)."""
    from airflow_savepoints.core.settings import configured_option

    configured = configured_option(RUN_KEY_OPTION)
    return configured.encode() if configured else host_key()


def channel_secret(job: str, run_id: str) -> str:
    """The secret run ``run_id`` of ``job`` seals its control files with (heartbeats, stop
    acknowledgements, failures): derivable with :func:`run_key`, never written anywhere."""
    return hmac.new(run_key(), f"channel\0{job}\0{run_id}".encode(), hashlib.sha256).hexdigest()


def folder_secret(job: str, run_id: str) -> str | None:
    """The channel secret of a control folder ``<job>/_control/<run id>``: the one the launcher gave
    this driver (:data:`RUN_SECRET_ENV`) for that run, else derived; None when no key can be read."""
    given_run, _, given = os.environ.get(RUN_SECRET_ENV, "").partition(":")
    if given and given_run == run_id:
        return given
    try:
        return channel_secret(job, run_id)
    except OSError as exc:
        log.warning("no run key to check run %s's control files with: %s", run_id, exc)
        return None


def new_secret() -> str:
    return secrets.token_hex(32)


def _mac(content: dict[str, Any], secret: str) -> str:
    body = json.dumps({k: v for k, v in content.items() if k != MAC_FIELD}, sort_keys=True, separators=(",", ":"),
                      default=str)
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()


def seal(content: dict[str, Any], secret: str) -> dict[str, Any]:
    """``content`` with its HMAC under ``secret`` (the :data:`MAC_FIELD` field)."""
    return {**content, MAC_FIELD: _mac(content, secret)}


def sealed(content: dict[str, Any] | None, secret: str) -> bool:
    """Whether ``content`` carries the HMAC of its content under ``secret``."""
    if not isinstance(content, dict) or not isinstance(content.get(MAC_FIELD), str):
        return False
    return hmac.compare_digest(content[MAC_FIELD].encode(), _mac(content, secret).encode())


def write_sealed(store: Store, name: str, content: dict[str, Any], secret: str) -> None:
    """``content`` sealed with ``secret``, written to ``name`` of ``store`` (whole or not at all)."""
    store.write_bytes_atomic(name, json.dumps(seal(content, secret)).encode())


def once_per_file(say: Callable[[str], None]) -> Callable[[str], None]:
    """An ``on_forged`` for a reader that polls (:func:`read_sealed`): ``say(url)`` the first time each file is found
    not sealed, not on every read."""
    said: set[str] = set()

    def once(url: str) -> None:
        if url not in said:
            said.add(url)
            say(url)

    return once


def read_sealed(store: Store, name: str, secret: str,
                on_forged: Callable[[str], None] = lambda url: None) -> dict[str, Any] | None:
    """The JSON object in ``name`` of ``store`` if it is sealed with ``secret`` (its seal taken off); None when it
    is absent or no JSON object, or, with ``on_forged(its URL)``, when it is not sealed with it (forged, or
    written by another holder of the folder)."""
    try:
        value = json.loads(store.read_bytes(name))
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(value, dict):
        return None
    if not sealed(value, secret):
        on_forged(store.url_of(name))
        return None
    return {key: item for key, item in value.items() if key != MAC_FIELD}
