"""Runner back ends: what the system that runs a job's driver can tell about it, and its forced stop.

A run that answers its control folder is stopped cooperatively (:mod:`airflow_savepoints.jobs.driver.control`);
a runner is the fallback for a run that does not (no helper, hung, or too slow), and the only
source of status for a job without the helper.

* ``local`` (a ``local[...]`` master, and the client-mode driver of any master): status from the
  driver process, on its own host only; forced stop: SIGTERM, then SIGKILL, to its process group.
  A process is signalled only when host, pid and its recorded start time all match (psutil's), so
  a reused pid, or a pid with no start time recorded (a damaged or forged file), is never signalled;
  and only when its environment holds the run's token (:mod:`airflow_savepoints.jobs.description.trust`),
  which this host's launcher gave it, so a pid a run file names is never signalled unless this tool
  started it. From another host it says so (the caller then waits for the run lease to lapse).
* ``standalone`` (``spark://``): status from the master's ``/json/``; forced stop: ``POST /app/kill/``
  (``id``, ``terminate=true``) on the master's web UI, only for an application the master names
  after the job. The master's addresses are the job's configuration's, never a run file's.
* ``yarn``: status from the ResourceManager's REST API (``/ws/v1/cluster/apps/<id>``: state, final status,
  YARN's diagnostics); forced stop: ``PUT .../apps/<id>/state`` ``{"state": "KILLED"}``, only for an
  application the ResourceManager names after the job. The ResourceManager's web address is the job's
  configuration's (``master_ui``, else ``yarn.resourcemanager.webapp.address`` of the yarn-site.xml in
  YARN_CONF_DIR or HADOOP_CONF_DIR), never a run file's. Tested on a real ResourceManager (tests/test_yarn.py).
* ``k8s``: through the Spark provider's SparkSubmitHook delete of the driver pod (registered by
  :mod:`airflow_savepoints.hooks.streaming_job`; not tested here: no such cluster runs on this machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from airflow_savepoints.errors import YarnNotConfiguredError, YarnQueueError
from airflow_savepoints.jobs.description import trust
from airflow_savepoints.jobs.description.files import same_process
from airflow_savepoints.jobs.description.record import RunTarget

RunnerState = Literal["running", "ended", "unknown"]


@dataclass
class RunnerView:
    state: RunnerState
    detail: str


class Runner:
    name = "none"

    def status(self, target: RunTarget) -> RunnerView:
        return RunnerView("unknown", f"no runner can tell the state of master {target.master!r}")

    def kill(self, target: RunTarget, grace: float) -> dict[str, Any]:
        """Force the run to end. Returns ``{"method", "killed", "detail"}``; killed is False when
        this runner could not do it from here (the caller then waits for the lease to lapse)."""
        return {"method": "none", "killed": False, "detail": self.status(target).detail}


def _driver_process(target: RunTarget) -> psutil.Process | None:
    """The run's driver process on this host; None if it exited or the pid now names another process."""
    if not target.pid or target.pid_started is None:
        return None  # no start time recorded: nothing tells the driver from another process with that pid
    return same_process(target.pid, target.pid_started)


class LocalRunner(Runner):
    """The driver's process (group) on the host that launched it."""

    name = "local"

    def on_this_host(self, target: RunTarget) -> bool:
        return target.host == socket.gethostname()

    def status(self, target: RunTarget) -> RunnerView:
        if not target.pid:
            return RunnerView("unknown", "no driver process is recorded")
        if not self.on_this_host(target):
            return RunnerView("unknown", f"the driver (pid {target.pid}) runs on {target.host}; its process can be "
                                         f"seen only there")
        if target.pid_started is None:
            return RunnerView("unknown", unverifiable(target))
        if _driver_process(target) is None:
            return RunnerView("ended", f"its process (pid {target.pid}) has exited")
        return RunnerView("running", f"its process (pid {target.pid}) is alive")

    def kill(self, target: RunTarget, grace: float) -> dict[str, Any]:
        if not self.on_this_host(target):
            return {"method": "signal", "killed": False,
                    "detail": f"the driver (pid {target.pid}) runs on {target.host}, not here ({socket.gethostname()}): "
                              "no signal sent"}
        if target.pid and target.pid_started is None:
            return {"method": "signal", "killed": False, "detail": unverifiable(target)}
        process = _driver_process(target)
        if process is None:
            return {"method": "not_running", "killed": False, "detail": f"pid {target.pid} is not running"}
        if (refusal := not_ours(target)) is not None:
            return {"method": "signal", "killed": False, "detail": refusal}
        _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _driver_process(target) is not None:
            time.sleep(0.3)
        if _driver_process(target) is not None:
            _signal_group(process, signal.SIGKILL)
            with _quiet():
                process.wait(10)
        return {"method": "signal", "killed": True, "detail": f"pid {target.pid} signalled"}


def not_ours(target: RunTarget) -> str | None:
    """Why pid ``target.pid`` may not be signalled, or None when it holds the token this host's launcher
    gave run ``target.run_id`` of ``target.job`` (see :mod:`airflow_savepoints.jobs.description.trust`)."""
    what = (f"pid {target.pid} does not hold the token this host's launcher gives run {target.run_id or '(no id)'} of "
            f"job '{target.job}' in its environment: it is not a driver this tool started (the run files that "
            "name it are forged or stale, or another tool started the driver), so it was not signalled; stop the "
            "driver yourself (or through its cluster manager) if it is the job's, else remove the run files naming it")
    if not target.run_id:
        return what
    try:
        token = trust.run_token(target.job, target.run_id)
    except OSError as exc:
        return f"{what} (this host's run key could not be read: {exc})"
    return None if trust.process_holds_token(target.pid, token) else what


def unverifiable(target: RunTarget) -> str:
    return (f"pid {target.pid} has no recorded start time, so it cannot be told from another process with that pid: "
            "never signalled")


def _signal_group(process: psutil.Process, sig: int) -> None:
    """Signal the process's group when it leads one (a detached spark-submit with its JVM and
    Python workers), else the process alone (a driver started by another tool)."""
    with _quiet():
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)


def kill_own_child(process: subprocess.Popen) -> None:
    """SIGKILL a one-shot child this process started in a session of its own (spark-submit with its
    JVM and Python driver), and reap it."""
    with _quiet():
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _quiet() -> contextlib.suppress:
    """The process may be gone by now: nothing to do then."""
    return contextlib.suppress(psutil.Error, OSError)


def master_ui_url(master: str | None, master_ui: str | None = None) -> str | None:
    """The standalone master's web UI: as configured, else ``http://<master host>:8080``."""
    if master_ui:
        return master_ui.rstrip("/")
    if not master or not master.startswith("spark://"):
        return None
    host = master.removeprefix("spark://").split(",")[0].rsplit(":", 1)[0]
    return f"http://{host}:8080"


class StandaloneRunner(Runner):
    """A Spark standalone master: status from its ``/json/``, kill through its web UI."""

    name = "standalone"
    timeout = 10

    def _state(self, target: RunTarget) -> dict[str, Any]:
        with urllib.request.urlopen(f"{master_ui_url(target.master, target.master_ui)}/json/",
                                    timeout=self.timeout) as response:
            return json.load(response)

    def app(self, target: RunTarget) -> dict[str, Any] | None:
        """What the master's ``/json/`` says of the run's application (its ``id``, ``name``, ``state``); None if unknown."""
        state = self._state(target)
        for app in state.get("activeapps", []) + state.get("completedapps", []):
            if isinstance(app, dict) and app.get("id") == target.application_id:
                return app
        return None

    def app_state(self, target: RunTarget) -> str | None:
        """The master's state of the application (RUNNING, WAITING, FINISHED, KILLED, FAILED); None if unknown."""
        app = self.app(target)
        return str(app.get("state")) if app is not None else None

    def status(self, target: RunTarget) -> RunnerView:
        if not target.application_id:
            return RunnerView("unknown", "the run's application id is not known yet")
        try:
            state = self.app_state(target)
        except OSError as exc:
            return RunnerView("unknown", f"the master at {master_ui_url(target.master, target.master_ui)} did not "
                                         f"answer: {exc}")
        if state is None:
            return RunnerView("unknown", f"the master does not know application {target.application_id}")
        running = state in ("RUNNING", "WAITING", "SUBMITTED")
        return RunnerView("running" if running else "ended",
                          f"the master says application {target.application_id} is {state}")

    def kill(self, target: RunTarget, grace: float) -> dict[str, Any]:
        if not target.application_id:
            return {"method": "master", "killed": False, "detail": "the run's application id is not known"}
        try:
            app = self.app(target)
        except (OSError, ValueError) as exc:
            return {"method": "master", "killed": False, "detail": f"the master at "
                    f"{master_ui_url(target.master, target.master_ui)} did not answer: {exc}; nothing was killed"}
        if app is None or app.get("name") != (target.app_name or target.job):
            whose = "it does not know it" if app is None else f"it is named {app.get('name')!r}"
            return {"method": "master", "killed": False,
                    "detail": f"application {target.application_id} is not job '{target.job}''s: the master says "
                              f"{whose} (spark-submit names the job's applications --name "
                              f"{target.app_name or target.job}); it was not "
                              "killed: the run files that name it are forged or stale"}
        url = f"{master_ui_url(target.master, target.master_ui)}/app/kill/"
        data = urllib.parse.urlencode({"id": target.application_id, "terminate": "true"}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=self.timeout):
                pass
        except OSError as exc:
            return {"method": "master", "killed": False, "detail": f"the master refused or failed the kill: {exc}"}
        return _killed(self, target, grace, "master", url)


YARN_CONF_ENV = ("YARN_CONF_DIR", "HADOOP_CONF_DIR")  # where spark-submit and this runner read yarn-site.xml
YARN_ENDED = ("FINISHED", "FAILED", "KILLED")


def yarn_site() -> tuple[Path | None, dict[str, str]]:
    """The yarn-site.xml spark-submit reads (YARN_CONF_DIR's, else HADOOP_CONF_DIR's) and its properties;
    (None, {}) when neither folder holds one."""
    for env in YARN_CONF_ENV:
        folder = os.environ.get(env)
        if folder and (path := Path(folder) / "yarn-site.xml").is_file():
            try:
                root = ElementTree.parse(path).getroot()
            except (ElementTree.ParseError, OSError):
                return path, {}
            return path, {str(p.findtext("name") or "").strip(): str(p.findtext("value") or "").strip()
                          for p in root.iter("property")}
    return None, {}


def resource_manager_url(master_ui: str | None = None) -> str | None:
    """The ResourceManager's web address: the job's ``master_ui`` when set, else yarn-site.xml's
    ``yarn.resourcemanager.webapp.address`` (or ``yarn.resourcemanager.hostname``:8088); None if neither says."""
    if master_ui:
        return master_ui.rstrip("/")
    _, site = yarn_site()
    address = site.get("yarn.resourcemanager.webapp.address") or (
        f"{site['yarn.resourcemanager.hostname']}:8088" if site.get("yarn.resourcemanager.hostname") else "")
    if not address or "${" in address:
        return None
    return (address if "://" in address else f"http://{address}").rstrip("/")


def check_yarn_start(master_ui: str | None) -> None:
    """What a ``master: yarn`` start needs here, checked before anything is launched: a yarn-site.xml in
    YARN_CONF_DIR or HADOOP_CONF_DIR (spark-submit finds the ResourceManager there), and the
    ResourceManager's web address (status and kill): raises :class:`YarnNotConfiguredError` naming what is missing."""
    path, site = yarn_site()
    if path is None:
        raise YarnNotConfiguredError(
            "master yarn: neither YARN_CONF_DIR nor HADOOP_CONF_DIR names a folder with a yarn-site.xml, so "
            "spark-submit cannot find the ResourceManager; nothing was started",
            "set HADOOP_CONF_DIR (or YARN_CONF_DIR) to the cluster's client configuration (core-site.xml, "
            "yarn-site.xml) where the job is started and where its status and stop are asked")
    if resource_manager_url(master_ui) is None:
        raise YarnNotConfiguredError(
            f"master yarn: {path} sets neither yarn.resourcemanager.webapp.address nor yarn.resourcemanager.hostname, "
            "and the job sets no master_ui: job status and cancel could not reach the ResourceManager; nothing "
            "was started",
            "set master_ui: http://<resourcemanager>:8088 in jobs.yaml, or the address in yarn-site.xml")


def _rm_call(rm: str | None, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> dict[str, Any]:
    """GET (PUT ``body``) ``<rm>/ws/v1/cluster/<path>`` of the ResourceManager at ``rm``, reached directly."""
    request = urllib.request.Request(f"{rm}/ws/v1/cluster/{path}", method="PUT" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=timeout) as response:
        return json.load(response)


def submitted_queue(command: list[str]) -> str | None:
    """The YARN queue a spark-submit command line names (``--queue`` wins over ``--conf spark.yarn.queue=``),
    or None for a command that is not ``--master yarn`` or names none."""
    pairs = list(zip(command, command[1:], strict=False))
    if ("--master", "yarn") not in pairs:
        return None
    confs = [value.partition("=")[2] for flag, value in pairs if flag == "--conf" and value.startswith("spark.yarn.queue=")]
    queues = [value for flag, value in pairs if flag == "--queue"] or confs
    return queues[-1] if queues else None


DRIVER_POD_CONF = "spark.kubernetes.driver.pod.name"
POD_NAME_LIMIT = 63  # kept within a DNS label, as Spark's own generated pod names are


def own_driver_pod(job: Any, role: str) -> dict[str, str]:
    """The conf that gives a run of ``job`` other than its own (its upgrade's check, a rescale or inspection
    application) a driver pod of its own, where the job pins ``spark.kubernetes.driver.pod.name`` on Kubernetes:
    the pinned name, then ``-<role>-<random>`` (Kubernetes refuses a second pod of the same name while the
    job's runs). Nothing elsewhere: spark-submit names each run's pod itself."""
    pinned = job.spark_conf.get(DRIVER_POD_CONF)
    if not pinned or not (job.master or "").startswith("k8s"):
        return {}
    suffix = f"-{role}-{os.urandom(3).hex()}"
    return {DRIVER_POD_CONF: pinned[:POD_NAME_LIMIT - len(suffix)].rstrip("-.") + suffix}


def is_driver_pod_of(pod: str, app_name: str) -> bool:
    """Whether ``pod`` is a driver pod spark-submit names for an application called ``app_name`` on Kubernetes:
    ``<name>-<id>-driver``, the name spelt as Kubernetes resource names are (lower case, other characters
    as ``-``)."""
    prefix = re.sub(r"[^a-z0-9]+", "-", app_name.lower()).strip("-")
    return bool(prefix) and re.fullmatch(rf"{re.escape(prefix)}-.+-driver", pod) is not None


def check_yarn_queue(command: list[str], master_ui: str | None) -> None:
    """Refuse (:class:`YarnQueueError`) a ``--master yarn`` command whose queue the ResourceManager's capacity
    scheduler (``/ws/v1/cluster/scheduler``) has no RUNNING leaf queue for, by name or path. Not checked
    (nothing is refused) when no queue is named, the ResourceManager does not answer, its scheduler is not
    the capacity scheduler (the fair scheduler creates queues on demand), or a queue there creates child
    queues on demand."""
    queue = submitted_queue(command)
    if queue is None or (rm := resource_manager_url(master_ui)) is None:
        return
    try:
        info = _rm_call(rm, "scheduler")["scheduler"]["schedulerInfo"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if info.get("type") != "capacityScheduler":
        return
    queues, pending = [], [info]
    while pending:
        node = pending.pop()
        queues.append(node)
        pending.extend(((node.get("queues") or {}).get("queue")) or [])
    if any(q.get("autoCreateChildQueueEnabled") or q.get("autoCreationEligibility") not in (None, "off")
           for q in queues):
        return
    match = next((q for q in queues if queue in (q.get("queueName"), q.get("queuePath"))), None)
    if match is None:
        problem = "it has no such queue"
    elif match.get("queues"):
        problem = "it is a parent queue (applications go to leaf queues)"
    elif match.get("state") != "RUNNING":
        problem = f"the queue is {match.get('state')}"
    else:
        return
    running = sorted(q.get("queuePath") or q.get("queueName") for q in queues
                     if not q.get("queues") and q.get("state") == "RUNNING")
    raise YarnQueueError(
        f"master yarn: the job's queue {queue!r} cannot take it: the ResourceManager at {rm} says {problem}; nothing "
        "was started",
        f"set spark.yarn.queue in the job's spark_conf (or the Spark connection's queue) to a running leaf queue: "
        f"{', '.join(running) or '(none is running)'}")


class YarnRunner(Runner):
    """A YARN ResourceManager: status and kill through its REST API (``/ws/v1/cluster``)."""

    name = "yarn"
    timeout = 10

    def _call(self, target: RunTarget, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return _rm_call(resource_manager_url(target.master_ui), path, body, self.timeout)

    def app(self, target: RunTarget) -> dict[str, Any] | None:
        """What the ResourceManager says of the run's application (``id``, ``name``, ``state``,
        ``finalStatus``, ``diagnostics``, ...); None when it does not know it."""
        try:
            return self._call(target, f"apps/{urllib.parse.quote(str(target.application_id))}").get("app")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    @staticmethod
    def words(app: dict[str, Any]) -> str:
        said = f"application {app.get('id')} is {app.get('state')} (final status {app.get('finalStatus')})"
        diagnostics = " ".join(str(app.get("diagnostics") or "").split())
        return f"{said}: {diagnostics[:1500]}" if diagnostics else said

    def status(self, target: RunTarget) -> RunnerView:
        if not target.application_id:
            return RunnerView("unknown", "the run's application id is not known yet")
        if resource_manager_url(target.master_ui) is None:
            return RunnerView("unknown", "the ResourceManager's address is not configured (master_ui, or yarn-site.xml "
                                         "in YARN_CONF_DIR/HADOOP_CONF_DIR)")
        try:
            app = self.app(target)
        except (OSError, ValueError) as exc:
            return RunnerView("unknown", f"the ResourceManager at {resource_manager_url(target.master_ui)} did not "
                                         f"answer: {exc}")
        if app is None:
            return RunnerView("unknown", f"the ResourceManager does not know application {target.application_id}")
        return RunnerView("ended" if app.get("state") in YARN_ENDED else "running",
                          f"the ResourceManager says {self.words(app)}")

    def kill(self, target: RunTarget, grace: float) -> dict[str, Any]:
        rm = resource_manager_url(target.master_ui)
        if not target.application_id:
            return {"method": "yarn", "killed": False, "detail": "the run's application id is not known"}
        if rm is None:
            return {"method": "yarn", "killed": False, "detail": "the ResourceManager's address is not configured "
                    "(master_ui, or yarn-site.xml in YARN_CONF_DIR/HADOOP_CONF_DIR): nothing was killed"}
        try:
            app = self.app(target)
        except (OSError, ValueError) as exc:
            return {"method": "yarn", "killed": False,
                    "detail": f"the ResourceManager at {rm} did not answer: {exc}; nothing was killed"}
        name = target.app_name or target.job
        if app is None or app.get("name") != name:
            whose = "it does not know it" if app is None else f"it is named {app.get('name')!r}"
            return {"method": "yarn", "killed": False,
                    "detail": f"application {target.application_id} is not job '{target.job}''s: the ResourceManager "
                              f"says {whose} (the job's applications are named {name!r}: spark-submit --name, or "
                              "app_name: when the application sets its own); it was not killed: the run files that "
                              "name it are forged or stale"}
        if app.get("state") in YARN_ENDED:
            return {"method": "not_running", "killed": False, "detail": f"the ResourceManager says {self.words(app)}"}
        try:
            self._call(target, f"apps/{urllib.parse.quote(str(target.application_id))}/state", {"state": "KILLED"})
        except (OSError, ValueError) as exc:
            return {"method": "yarn", "killed": False, "detail": f"the ResourceManager refused or failed the kill: {exc}"}
        return _killed(self, target, grace, "yarn", rm)


def _killed(runner: Runner, target: RunTarget, grace: float, method: str, through: str) -> dict[str, Any]:
    """A kill sent through ``through``: the answer once ``runner`` no longer sees the application running
    (at most ``grace`` seconds), with what it says of it then."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and runner.status(target).state == "running":
        time.sleep(0.5)
    return {"method": method, "killed": True,
            "detail": f"application {target.application_id} killed through {through}: {runner.status(target).detail}"}


_RUNNERS: dict[str, Callable[[], Runner]] = {}


def register_runner(master_prefix: str, factory: Callable[[], Runner]) -> None:
    """Serve masters starting with ``master_prefix`` (``yarn``, ``k8s://``) with ``factory()``."""
    _RUNNERS[master_prefix] = factory


def runner_for(master: str | None) -> Runner:
    master = master or "local"
    if master.startswith("local"):
        return LocalRunner()
    if master.startswith("spark://"):
        return StandaloneRunner()
    if master == "yarn" or master.startswith("yarn-"):  # yarn (yarn-client, yarn-cluster: Spark 1's spellings)
        return YarnRunner()
    for prefix, factory in _RUNNERS.items():
        if master.startswith(prefix):
            return factory()
    return Runner()
