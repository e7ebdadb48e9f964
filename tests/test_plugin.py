"""The savepoints plugin in a real Airflow 3.3 API server (SQLite, 127.0.0.1), over HTTP.

Savepoints are taken of a real checkpoint written by local PySpark; the API must report exactly
what storage holds, refuse unauthenticated calls, refuse every attempt to leave the savepoint root
(and touch nothing), and the Airflow UI page must show the savepoints after a real login in a
headless Chromium (skipped, with the reason, where Chromium is not installed).
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from airflow_savepoints.core import SavepointInfo, take_savepoint
from airflow_savepoints.errors import (
    CredentialsError,
    InvalidJobNameError,
    MissingBackendError,
    NoSavepointDirError,
    SavepointError,
    SavepointInFlightError,
    SavepointNotFoundError,
    StorageError,
)
from tests.conftest import ROOT, tree_snapshot
from tests.support.airflow_cluster import AirflowCluster, airflow_cluster, free_port, tail

API = "/savepoints/api"
SECRET = "plugin-test-secret-Zq81"  # the connection's password: must never be sent back
ACCESS_KEY = "AKIAPLUGINTESTKEY"  # the connection's login (an access key id): neither
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = ROOT / "test-artifacts"


# ---- pure parts (fast) -----------------------------------------------------------------------------

def test_error_statuses_and_scrubbing():
    from airflow_savepoints.plugins.api import ConfigurationError, Scrubber, http_status

    assert http_status(InvalidJobNameError("x")) == 400
    assert http_status(SavepointNotFoundError("x")) == 404
    assert http_status(NoSavepointDirError("x")) == 503 and http_status(ConfigurationError("x")) == 503
    assert http_status(SavepointInFlightError("x")) == 409
    assert http_status(CredentialsError("x")) == 502 and http_status(StorageError("x")) == 502
    assert http_status(MissingBackendError("x")) == 503  # e.g. HDFS without hdfs-native: configuration
    assert http_status(SavepointError("x")) == 500
    scrub = Scrubber({"secret": SECRET, "key": ACCESS_KEY, "endpoint_url": "http://minio:9000"})
    out = scrub({"pointer": f"s3://user:pw@bucket/{SECRET}", "list": [ACCESS_KEY, "http://minio:9000"]})
    assert out == {"pointer": "s3://***@bucket/***", "list": ["***", "http://minio:9000"]}


# ---- a real API server with real savepoints ---------------------------------------------------------

class Deployment:
    def __init__(self, cluster: AirflowCluster, base: Path, root: Path, outside: Path,
                 taken: dict[str, list[SavepointInfo]]):
        self.cluster, self.base, self.root, self.outside, self.taken = cluster, base, root, outside, taken

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        response = self.cluster.request("GET", path, **kwargs)
        assert SECRET not in response.text and ACCESS_KEY not in response.text, response.text
        return response

    def raw_get(self, raw_path: str, token: str | None) -> tuple[int, dict]:
        """GET a path exactly as written (httpx would normalise '..' and percent-escapes)."""
        port = int(self.cluster.base_url.rsplit(":", 1)[1])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", raw_path, headers={"Authorization": f"Bearer {token}"} if token else {})
            response = connection.getresponse()
            body = response.read().decode()
        finally:
            connection.close()
        assert SECRET not in body and ACCESS_KEY not in body, body
        try:
            return response.status, json.loads(body)
        except ValueError:
            raise AssertionError(f"GET {raw_path} -> {response.status}, not JSON: {body[:500]!r}") from None


def create_connection(cluster: AirflowCluster, root: Path) -> None:
    cluster.api("POST", "/api/v2/connections", expect=(201,), json={
        "connection_id": "savepoints_default", "conn_type": "savepoints", "host": str(root),
        "login": ACCESS_KEY, "password": SECRET,
    })


@pytest.fixture(scope="module")
def deployment(stopped_checkpoint, tmp_path_factory):
    base = tmp_path_factory.mktemp("plugin")
    checkpoint = base / "checkpoint"
    shutil.copytree(stopped_checkpoint, checkpoint)
    earlier = base / "checkpoint-earlier"  # the same query before batch 5 committed
    shutil.copytree(stopped_checkpoint, earlier)
    (earlier / "commits" / "5").unlink()
    root, outside = base / "savepoints", base / "outside"

    def take(source: Path, job: str, kind: str, reason: str, where: Path = root) -> SavepointInfo:
        return take_savepoint(str(source), job, savepoint_dir=str(where), savepoint_type=kind, reason=reason)

    taken = {
        "orders": [take(earlier, "orders", "periodic", "hourly"),
                   take(checkpoint, "orders", "manual", "<script>alert('x')</script> before upgrade")],
        "payments": [take(checkpoint, "payments", "stop", "decommissioned")],  # a job that has ended
    }
    take(checkpoint, "secret-job", "manual", "outside the root", where=outside)  # must stay unreachable
    (base / "dags").mkdir()
    with airflow_cluster(base / "airflow-home", base / "dags", components=("api-server",)) as cluster:
        create_connection(cluster, root)
        yield Deployment(cluster, base, root, outside, taken)


@pytest.mark.slow
def test_endpoints_return_what_storage_holds(deployment):
    d = deployment
    listing = d.get(f"{API}/jobs").json()
    assert listing == {"root": str(d.root), "jobs": ["orders", "payments"]}

    for job, infos in d.taken.items():
        answer = d.get(f"{API}/jobs/{job}/savepoints")
        assert answer.status_code == 200, answer.text
        records = answer.json()
        assert records["job"] == job
        assert [r["savepoint_id"] for r in records["savepoints"]] == [i.manifest.savepoint_id for i in infos]
        for record, info in zip(records["savepoints"], infos, strict=True):
            manifest = json.loads((Path(record["pointer"]) / "_metadata").read_text())  # storage itself
            assert record["pointer"] == info.pointer and Path(record["pointer"]).parent == d.root / job
            assert record["type"] == manifest["type"] == info.manifest.type.value
            assert record["batch_id"] == manifest["batch_id"]
            assert record["reason"] == manifest["reason"] and record["state"] == "completed"
            assert record["bytes"] == manifest["total_bytes"] and record["files"] == len(manifest["files"])
            assert record["query_id"] == manifest["query_id"]

            detail = d.get(f"{API}/jobs/{job}/savepoints/{record['savepoint_id']}").json()
            assert detail["savepoint"] == record and detail["manifest_error"] is None
            assert detail["manifest"]["savepoint_id"] == record["savepoint_id"]
            assert detail["manifest"]["source_offsets"] == manifest["source_offsets"]
            assert "files" not in detail["manifest"]
    orders = d.get(f"{API}/jobs/orders/savepoints").json()["savepoints"]
    assert [(r["type"], r["batch_id"]) for r in orders] == [("periodic", 4), ("manual", 5)]
    assert d.get(f"{API}/jobs/payments/savepoints").json()["savepoints"][0]["type"] == "stop"


@pytest.mark.slow
def test_every_route_requires_an_airflow_login(deployment):
    d = deployment
    sid = d.taken["orders"][0].manifest.savepoint_id
    routes = [f"{API}/jobs", f"{API}/jobs/orders/savepoints", f"{API}/jobs/orders/savepoints/{sid}", "/savepoints/ui"]
    forged = d.cluster.token()[:-6] + "AAAAAA"  # a bad signature
    for route in routes:
        anonymous = d.get(route, auth=False)
        assert anonymous.status_code == 401, (route, anonymous.text)
        assert anonymous.json()["error"]["code"] == "not_authenticated"
        bad = d.get(route, auth=False, headers={"Authorization": f"Bearer {forged}"})
        assert bad.status_code == 403 and bad.json()["error"]["code"] == "forbidden", (route, bad.text)
        assert d.get(route).status_code == 200, route  # bearer token
        with httpx.Client(base_url=d.cluster.base_url, cookies={"_token": d.cluster.token()}) as browser_like:
            assert browser_like.get(route).status_code == 200, route  # the UI's cookie


TRAVERSALS = [  # (raw path, expected status, expected error code or None for Starlette's own 404)
    (f"{API}/jobs/../savepoints", 400, "invalid_job_name"),
    (f"{API}/jobs/%2e%2e/savepoints", 400, "invalid_job_name"),
    (f"{API}/jobs/%2E%2E/savepoints/savepoint-000000-000000000000", 400, "invalid_job_name"),
    (f"{API}/jobs/.hidden/savepoints", 400, "invalid_job_name"),
    (f"{API}/jobs/orders%00/savepoints", 400, "invalid_job_name"),
    (f"{API}/jobs/~root/savepoints", 400, "invalid_job_name"),
    (f"{API}/jobs/..%2F..%2Foutside/savepoints", 404, "not_found"),
    (f"{API}/jobs/..%2foutside%2fsecret-job/savepoints", 404, "not_found"),
    (f"{API}/jobs/a/b/savepoints", 404, "not_found"),
    (f"{API}/jobs/a%2Fb/savepoints", 404, "not_found"),
    (f"{API}/jobs//tmp/savepoints", 404, "not_found"),
    (f"{API}/jobs/%2Ftmp/savepoints", 404, "not_found"),
    (f"{API}/jobs/orders/savepoints/%2e%2e", 400, "invalid_savepoint_id"),
    (f"{API}/jobs/orders/savepoints/..", 400, "invalid_savepoint_id"),
    (f"{API}/jobs/orders/savepoints/..%2F..%2F..%2Foutside", 404, "not_found"),
    (f"{API}/jobs/orders/savepoints/_catalog.json", 400, "invalid_savepoint_id"),
    (f"{API}/jobs/orders/savepoints/savepoint-000000-000000000000", 404, "savepoint_not_found"),
    (f"{API}/jobs/secret-job/savepoints", 404, "job_not_found"),
    (f"{API}/jobs/no-such-job/savepoints", 404, "job_not_found"),
    ("/savepoints/../api/v2/connections", 404, "not_found"),
]


@pytest.mark.slow
def test_paths_outside_the_root_are_refused_and_nothing_changes(deployment):
    d = deployment
    token = d.cluster.token()
    before = {p: tree_snapshot(p) for p in (d.root, d.outside)}
    paths = [*TRAVERSALS,
             (f"{API}/jobs/{quote(str(d.outside), safe='')}/savepoints", 404, "not_found"),
             (f"{API}/jobs/{quote(str(d.outside / 'secret-job'), safe='')}/savepoints", 404, "not_found")]
    for raw_path, status, code in paths:
        got_status, body = d.raw_get(raw_path, token)
        assert (got_status, body.get("error", {}).get("code")) == (status, code), (raw_path, got_status, body)
        assert set(body["error"]) == {"code", "message", "hint"}
        assert "secret-job" not in json.dumps(body) or code == "job_not_found", (raw_path, body)
        assert str(d.outside) not in json.dumps(body), (raw_path, body)
    status, body = d.raw_get(f"{API}/jobs?dir={quote(str(d.outside))}&root=/", token)  # no parameter names a place
    assert status == 200 and body == {"root": str(d.root), "jobs": ["orders", "payments"]}
    assert {p: tree_snapshot(p) for p in (d.root, d.outside)} == before


@pytest.mark.slow
def test_plugin_is_registered_in_airflow(deployment):
    d = deployment
    plugins = d.cluster.get("/api/v2/plugins")["plugins"]
    ours = next(p for p in plugins if p["name"] == "savepoints")
    assert [a["url_prefix"] for a in ours["fastapi_apps"]] == ["/savepoints"]
    assert ours["external_views"] == [{"name": "Savepoints", "href": "/savepoints/ui", "url_route": "savepoints",
                                       "destination": "nav", "category": "browse", "icon": None,
                                       "icon_dark_mode": None, "nav_top_level": False}]
    assert "airflow.plugins" in ours["source"]
    airflow = str(Path(sys.executable).parent / "airflow")
    listed = subprocess.run([airflow, "plugins", "--output", "json"], env=d.cluster.env, capture_output=True,
                            text=True, timeout=120, cwd=d.cluster.home)
    assert listed.returncode == 0, listed.stderr[-3000:]
    cli_plugins = json.loads(listed.stdout[listed.stdout.index("["):])
    assert [p["name"] for p in cli_plugins] == ["savepoints"], listed.stdout


@pytest.mark.slow
def test_without_a_usable_savepoint_root_the_api_says_what_to_configure(deployment):
    d = deployment
    d.cluster.api("DELETE", "/api/v2/connections/savepoints_default", expect=(204,))
    try:
        answer = d.get(f"{API}/jobs")
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "no_savepoint_dir" and "savepoint_dir" in error["hint"]

        d.cluster.api("POST", "/api/v2/connections", expect=(201,), json={
            "connection_id": "savepoints_default", "conn_type": "savepoints", "host": "nosuch://bucket/savepoints",
            "password": SECRET})
        answer = d.get(f"{API}/jobs/orders/savepoints")
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "unknown_scheme", answer.text
        d.cluster.api("DELETE", "/api/v2/connections/savepoints_default", expect=(204,))
    finally:
        create_connection(d.cluster, d.root)
    assert d.get(f"{API}/jobs").status_code == 200


# ---- the UI page in a real browser -----------------------------------------------------------------

class WebDriver:
    """The W3C WebDriver protocol spoken to chromedriver over HTTP (no client library needed)."""

    ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.log = workdir / "chromedriver.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([str(CHROMEDRIVER), f"--port={self.port}", "--allowed-ips=127.0.0.1"],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        self._wait(lambda: self.http.get("/status").json()["value"]["ready"], 30, "chromedriver did not start")
        options = {"binary": str(CHROMIUM), "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900",
            f"--user-data-dir={workdir / 'chromium-profile'}", "--no-first-run", "--disable-extensions"]}
        session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": options}}})
        self.session = f"/session/{session['sessionId']}"

    @staticmethod
    def _wait(predicate, timeout: float, what: str) -> Any:
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                if result := predicate():
                    return result
            except (httpx.HTTPError, ValueError, KeyError, AssertionError) as exc:
                last = exc
            time.sleep(0.2)
        raise AssertionError(f"{what} within {timeout:.0f}s (last error: {last!r})")

    def call(self, method: str, path: str, body: dict | None = None) -> Any:
        response = self.http.request(method, path, json=body if method == "POST" else None)
        if response.status_code != 200:
            raise AssertionError(f"WebDriver {method} {path} -> {response.status_code}: {response.text[:1000]}")
        return response.json()["value"]

    def go(self, url: str) -> None:
        self.call("POST", f"{self.session}/url", {"url": url})

    def find(self, css: str, timeout: float = 30) -> str:
        return self._wait(lambda: self.call("POST", f"{self.session}/element",
                                            {"using": "css selector", "value": css})[self.ELEMENT],
                          timeout, f"no element {css!r} on {self.url()}")

    def type(self, css: str, text: str) -> None:
        self.call("POST", f"{self.session}/element/{self.find(css)}/value", {"text": text})

    def click(self, css: str) -> None:
        self.call("POST", f"{self.session}/element/{self.find(css)}/click", {})

    def script(self, source: str) -> Any:
        return self.call("POST", f"{self.session}/execute/sync", {"script": source, "args": []})

    def url(self) -> str:
        return self.call("GET", f"{self.session}/url")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("GET", f"{self.session}/screenshot")))

    def close(self) -> None:
        try:
            if getattr(self, "session", None):
                self.http.delete(self.session)
        finally:
            self.http.close()
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


LOADED_IFRAME_DOM = """
const frame = document.querySelector('iframe');
const doc = frame && frame.contentDocument;
return doc && doc.body && doc.body.dataset.loaded === 'true' ? doc.documentElement.outerHTML : null;
"""
IFRAME_ROWS = """
const doc = document.querySelector('iframe').contentDocument;
return Array.from(doc.querySelectorAll('tr.savepoint')).map(
  row => [row.dataset.job, ...Array.from(row.cells).map(cell => cell.textContent), row.dataset.pointer]);
"""
PAGE_JOBS = """
return document.body && document.body.dataset.loaded === 'true'
  ? Array.from(document.querySelectorAll('tr.job')).map(row => row.dataset.job) : null;
"""


def ui_route() -> str:
    """Where Airflow's UI shows the plugin's external view: 3.3.2 puts the view's ``href`` after the
    ``url_route`` (``/plugin/savepoints/savepoints/ui``), 3.3.0 and 3.3.1 the ``url_route`` alone."""
    from airflow import __version__
    from packaging.version import Version

    return "/plugin/savepoints/savepoints/ui" if Version(__version__) >= Version("3.3.2") else "/plugin/savepoints"


@pytest.mark.slow
@pytest.mark.usefixtures("chromium")  # tests/conftest.py: the browser part
def test_ui_page_lists_the_savepoints_after_login(deployment, tmp_path):
    d = deployment
    ARTIFACTS.mkdir(exist_ok=True)
    browser = WebDriver(tmp_path)
    try:
        browser.go(f"{d.cluster.base_url}/plugin/savepoints")  # not logged in: Airflow sends us to its login page
        browser.type("input[name=username]", d.cluster.username)
        browser.type("input[name=password]", d.cluster.password)
        browser.click("button[type=submit]")
        dom = browser._wait(lambda: browser.script(LOADED_IFRAME_DOM), 60,
                            f"the savepoints page did not load in the UI's iframe (at {browser.url()})")
        (ARTIFACTS / "plugin-savepoints-page.html").write_text(dom)
        browser.screenshot(ARTIFACTS / "plugin-savepoints-page.png")
        assert browser.url() == f"{d.cluster.base_url}{ui_route()}"
        rows = browser.script(IFRAME_ROWS)
        # the operators' extra link opens the page for one job: only that job is shown
        only = next(iter(d.taken))
        browser.go(f"{d.cluster.base_url}/savepoints/ui?job={quote(only, safe='')}")
        shown = browser._wait(lambda: browser.script(PAGE_JOBS), 60, "the page for one job did not load")
    except BaseException:
        print(f"chromedriver log:\n{tail(browser.log, 40)}")
        raise
    finally:
        browser.close()

    assert 'banner error' not in dom, dom
    assert shown == [only] and len(d.taken) > 1, (shown, list(d.taken))
    expected = []
    for job, infos in d.taken.items():
        for info in reversed(infos):  # newest first in each job's table
            s = info.summary()
            expected.append([job, s["savepoint_id"], s["type"], "completed", s["reason"], str(s["batch_id"])])
    assert [row[:6] for row in rows] == expected, rows
    assert all(row[9] == info.pointer for row, info in
               zip(rows, [i for infos in d.taken.values() for i in reversed(infos)], strict=True))
    assert all(row[6].endswith(("B", "KiB", "MiB")) and row[7].endswith(("s ago", "m ago", "h ago")) for row in rows), rows
    assert "&lt;script&gt;alert('x')&lt;/script&gt; before upgrade" in dom  # shown as text, never as markup
    assert "secret-job" not in dom
