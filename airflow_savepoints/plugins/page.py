"""The savepoints console: one HTML page (its CSS inline, its JavaScript the package's
``static/console.js``; no build step) that the Airflow UI shows in an iframe (Browse > Savepoints),
and the answers a browser gets instead of JSON.

The page calls the plugin's JSON API, and Airflow's own REST API for actions, with the browser's
own credentials (the UI's ``_token`` cookie of the same origin). It takes Airflow's look from the
UI around it (same origin): Chakra's colour and font variables, the light or dark mode and the
user's timezone from the UI's settings. Every value is inserted with ``textContent`` (never as
HTML): job names and reasons come from users.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

STYLE = """
:root { color-scheme: light; --bg: #ffffff; --bg-subtle: #f8fafc; --bg-muted: #f1f5f9; --bg-panel: #ffffff;
  --fg: #1e293b; --fg-muted: #64748b; --border: #e2e8f0; --accent: #2563eb; --accent-fg: #ffffff;
  --error: #dc2626; --warning: #b45309; --success: #15803d; --info: #2563eb;
  --font: Inter, ui-sans-serif, system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  --mono: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
:root.dark { color-scheme: dark; --bg: #0f172a; --bg-subtle: #111827; --bg-muted: #1e293b; --bg-panel: #111827;
  --fg: #e2e8f0; --fg-muted: #94a3b8; --border: #334155; --accent: #60a5fa; --accent-fg: #0f172a;
  --error: #f87171; --warning: #fbbf24; --success: #4ade80; --info: #60a5fa; }
* { box-sizing: border-box; }
body { margin: 0; padding: 12px 16px 24px; background: var(--bg); color: var(--fg); font: 14px/1.45 var(--font); }
h1 { font-size: 20px; font-weight: 600; margin: 0; }
h2 { font-size: 16px; font-weight: 600; margin: 0; }
h3 { font-size: 13px; font-weight: 600; margin: 16px 0 6px; color: var(--fg-muted); text-transform: uppercase;
  letter-spacing: .04em; }
h3 .id { text-transform: none; letter-spacing: 0; font-family: var(--mono); font-weight: 500; }
a { color: var(--info); text-decoration: none; } a:hover { text-decoration: underline; }
button { font: inherit; font-size: 13px; color: var(--fg); background: transparent; border: 1px solid var(--border);
  border-radius: 6px; padding: 3px 10px; cursor: pointer; white-space: nowrap; }
button:hover:not(:disabled) { background: var(--bg-muted); }
button:disabled { opacity: .5; cursor: not-allowed; }
button.primary { background: var(--accent); color: var(--accent-fg); border-color: var(--accent); }
button.primary:hover:not(:disabled) { background: var(--accent); filter: brightness(.9); }
button.danger { color: var(--error); border-color: var(--error); }
button.danger.primary { background: var(--error); color: var(--bg); }
button.danger.primary:hover:not(:disabled) { background: var(--error); }
button.link { border: 0; background: none; color: var(--info); padding: 0 4px; }
input[type=search] { font: inherit; color: var(--fg); background: transparent; border: 1px solid var(--border);
  border-radius: 6px; padding: 4px 10px; width: 240px; }
header { display: flex; align-items: center; gap: 12px; flex-wrap: wrap; margin-bottom: 4px; }
header .spacer { flex: 1; }
.muted { color: var(--fg-muted); }
.mono { font-family: var(--mono); font-size: 12px; }
#summary { margin: 0 0 12px; color: var(--fg-muted); font-size: 13px; }
.banner { border: 1px solid var(--border); border-left-width: 4px; border-radius: 6px; padding: 10px 12px; margin: 10px 0;
  background: var(--bg-subtle); display: flex; gap: 12px; align-items: flex-start; }
.banner .text { flex: 1; }
.banner .title { font-weight: 600; }
.banner.error { border-left-color: var(--error); } .banner.error .title { color: var(--error); }
.banner.warning { border-left-color: var(--warning); } .banner.warning .title { color: var(--warning); }
.banner.info { border-left-color: var(--info); }
.banner.success { border-left-color: var(--success); }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
th, td { text-align: left; padding: 7px 8px; border-bottom: 1px solid var(--border); vertical-align: middle;
  overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
th { font-size: 12px; font-weight: 600; color: var(--fg-muted); background: var(--bg-muted); }
td.wrap { white-space: normal; line-height: 24px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.job { cursor: pointer; }
tr.job:hover > td { background: var(--bg-muted); }
tr.job .name { font-weight: 600; }
tr.job .toggle { border: 0; background: none; padding: 0 4px; width: 22px; color: var(--fg-muted); }
tr.savepoints-row > td { padding: 0 0 12px 30px; white-space: normal; }
tr.savepoints-row table { border-left: 2px solid var(--border); }
tr.savepoints-row th { background: transparent; }
tr.savepoint { cursor: pointer; } tr.savepoint:hover td { background: var(--bg-muted); }
tr.savepoint.selected td { background: var(--bg-muted); }
tr.savepoint.selected td:first-child { box-shadow: inset 3px 0 0 var(--accent); }
.badge { display: inline-block; border-radius: 999px; padding: 0 8px; font-size: 12px; line-height: 20px; font-weight: 500;
  border: 1px solid var(--border); color: var(--fg-muted); background: transparent; margin-right: 4px; }
.badge.running, .badge.completed { color: var(--success); border-color: var(--success); }
.badge.starting, .badge.stopping, .badge.in_progress, .badge.periodic { color: var(--info); border-color: var(--info); }
.badge.failed, .badge.lost, .badge.conflict, .badge.stale { color: var(--error); border-color: var(--error); }
.badge.stopped, .badge.not_started, .badge.unknown, .badge.disposing { color: var(--fg-muted); }
.badge.manual, .badge.stop, .badge.retained_checkpoint { color: var(--warning); border-color: var(--warning); }
.pager { display: flex; gap: 8px; align-items: center; justify-content: flex-end; padding: 6px 0 0; font-size: 13px; }
.empty { padding: 10px 0; color: var(--fg-muted); }
.reason { color: var(--error); font-size: 12px; white-space: normal; }
tr.job .reason { max-width: 280px; overflow-wrap: anywhere; display: -webkit-box; -webkit-line-clamp: 2;
  -webkit-box-orient: vertical; overflow: hidden; }
.charts { display: flex; gap: 24px; flex-wrap: wrap; }
.chart { margin: 0; color: var(--info); }
.chart figcaption { font-size: 12px; color: var(--fg-muted); }
.chart .legend { display: flex; gap: 12px; }
.chart .key { white-space: nowrap; }
.chart .key::before { content: ""; display: inline-block; width: 14px; margin-right: 4px; vertical-align: middle;
  border-top: 2px solid currentColor; }
.chart .key.dashed::before { border-top-style: dashed; }
.badge.recommended { color: var(--info); border-color: var(--info); }
.badge.acted { color: var(--success); border-color: var(--success); }
.badge.rolled_back { color: var(--error); border-color: var(--error); }
.badge.held { color: var(--fg-muted); }
table.history td.wrap { white-space: normal; }
#detail { position: fixed; top: 0; right: 0; bottom: 0; width: min(680px, 60vw); overflow: auto; z-index: 10;
  border-left: 1px solid var(--border); background: var(--bg); padding: 0 16px 12px; box-shadow: -8px 0 24px rgba(0, 0, 0, .18); }
#detail[hidden] { display: none; }
#detail > header { position: sticky; top: 0; z-index: 1; background: var(--bg); padding: 12px 0 8px; margin-bottom: 8px;
  border-bottom: 1px solid var(--border); }
#detail > .empty, #detail > .banner { margin-top: 12px; }
.chart svg .axis text { stroke: none; }
dl.facts { display: grid; grid-template-columns: 170px 1fr; gap: 4px 16px; margin: 0; }
dl.facts dt { color: var(--fg-muted); } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
.copyline { display: flex; gap: 8px; align-items: center; margin: 4px 0; }
.copyline code { flex: 1; font-family: var(--mono); font-size: 12px; background: var(--bg-muted); border-radius: 6px;
  padding: 5px 8px; white-space: pre-wrap; word-break: break-all; }
pre { font-family: var(--mono); font-size: 12px; background: var(--bg-muted); border-radius: 6px; padding: 8px; overflow: auto;
  max-height: 220px; margin: 0; }
.actions { display: flex; gap: 6px; justify-content: flex-end; }
dialog { border: 1px solid var(--border); border-radius: 8px; background: var(--bg-panel); color: var(--fg); max-width: 520px; }
dialog::backdrop { background: rgba(0, 0, 0, .45); }
dialog .buttons { display: flex; gap: 8px; justify-content: flex-end; margin-top: 14px; }
label.option { display: grid; grid-template-columns: 130px 1fr; gap: 2px 10px; align-items: center; margin-top: 8px; }
label.option input[type=checkbox] { justify-self: start; }
label.option input { font: inherit; color: var(--fg); background: transparent; border: 1px solid var(--border);
  border-radius: 6px; padding: 3px 8px; } label.option small { grid-column: 2; }
.spinner { display: inline-block; width: 12px; height: 12px; border: 2px solid var(--border); border-top-color: var(--accent);
  border-radius: 50%; animation: spin .8s linear infinite; vertical-align: -2px; }
@keyframes spin { to { transform: rotate(360deg); } }
"""

BODY = """
<header>
  <h1>Savepoints</h1>
  <span id="root" class="muted mono"></span>
  <span class="spacer"></span>
  <input id="filter" type="search" placeholder="Filter jobs" aria-label="Filter jobs">
  <button id="collapse" type="button">Collapse all</button>
  <span id="savepoint-now"></span>
  <button id="refresh" type="button" title="Reload from storage">Refresh</button>
</header>
<div id="summary"><span class="spinner"></span> Loading&hellip;</div>
<div id="notice"></div>
<div id="problem"></div>
<table id="jobs" hidden>
  <colgroup><col style="width:30px"><col style="width:16%"><col style="width:10%"><col style="width:8%">
    <col style="width:19%"><col><col style="width:8%"><col style="width:180px"></colgroup>
  <thead><tr><th></th><th>Job</th><th>State</th><th class="num">Last batch</th><th>Newest savepoint</th>
    <th>Savepoints</th><th class="num">Size</th><th></th></tr></thead>
  <tbody></tbody>
</table>
<section id="detail" hidden></section>
<dialog id="confirm"><form method="dialog">
  <h2 id="confirm-title"></h2><p id="confirm-text"></p><div id="confirm-options"></div>
  <div class="buttons"><button value="cancel" type="submit" formnovalidate>Cancel</button>
  <button id="confirm-ok" value="ok" type="submit" class="primary">Confirm</button></div>
</form></dialog>
"""


SCRIPT_FILE = Path(__file__).with_name("static") / "console.js"  # package data, linted by `make lint-js`


@functools.cache
def script() -> tuple[bytes, str]:
    """The console's JavaScript and a short hash of it (the page's URL for it changes with its content)."""
    body = SCRIPT_FILE.read_bytes()
    return body, hashlib.sha256(body).hexdigest()[:12]


def render_page(config: dict[str, Any], script_url: str) -> str:
    """The page, with the paths it calls (``{"api": ..., "airflow": ...}``) as a JSON literal, loading
    the console's JavaScript from ``script_url`` (the plugin's ``/static/console.js``)."""
    literal = json.dumps(config).replace("</", "<\\/")
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>Savepoints</title>\n"
            f"<style>{STYLE}</style>\n</head>\n<body>{BODY}<script>\n\"use strict\";\nconst CONFIG = {literal};\n</script>\n"
            f"<script src=\"{html.escape(script_url)}?v={script()[1]}\"></script>\n</body>\n</html>\n")


def wants_page(request: Request) -> bool:
    """A browser opening the page itself (not a script or the page's own API calls)."""
    return request.url.path.rstrip("/").endswith("/ui") and "text/html" in request.headers.get("accept", "")


def _airflow_base(request: Request) -> str:
    root_path = request.scope.get("root_path", "").rstrip("/")
    return root_path.rsplit("/", 1)[0] if root_path else ""


def page_refusal(request: Request, status: int) -> Response:
    """Not logged in: off to Airflow's login page, back here after it. Logged in without the
    permission (or with an expired token): a page that says so."""
    login = "/auth/login"
    try:
        from airflow.api_fastapi.app import get_auth_manager

        login = get_auth_manager().get_url_login(next_url=str(request.url))
    except Exception:  # noqa: BLE001 - an auth manager without a login URL: Airflow's default path
        pass
    if login.startswith("/"):
        login = _airflow_base(request) + login
    if status == 401:
        return RedirectResponse(login, status_code=303)
    message = ("Your Airflow login has expired, or your role may not read DAGs and their XComs, which the "
               "savepoints console requires.")
    return HTMLResponse(
        f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Savepoints</title></head>"
        f"<body style=\"font: 14px system-ui, sans-serif; margin: 24px\"><h1 style=\"font-size: 20px\">Savepoints</h1>"
        f"<p>{html.escape(message)}</p><p><a href=\"{html.escape(login)}\">Log in to Airflow again</a></p></body></html>",
        status_code=status, headers={"Cache-Control": "no-store"})
