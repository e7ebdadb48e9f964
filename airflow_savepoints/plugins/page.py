"""The savepoint page the Airflow UI shows in an iframe: plain HTML and a little JavaScript.

The page calls the JSON API of the same app with the browser's own credentials: the Airflow UI
keeps its JWT in the ``_token`` cookie of the same origin, which ``fetch`` sends. Every value is
inserted with ``textContent`` (never as HTML): job names and reasons come from users.
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Savepoints</title>
<style>
  :root { color-scheme: light dark; --line: #d0d7de; --muted: #6e7781; --bad: #cf222e; }
  @media (prefers-color-scheme: dark) { :root { --line: #30363d; --muted: #8b949e; --bad: #ff7b72; } }
  body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  h2 { font-size: 16px; margin: 20px 0 6px; }
  #status { color: var(--muted); margin-bottom: 8px; }
  .error { color: var(--bad); }
  table { border-collapse: collapse; width: 100%; }
  th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
  th { font-weight: 600; white-space: nowrap; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
  td.id, td.time { white-space: nowrap; }
  td.pointer { font-family: ui-monospace, monospace; font-size: 12px; word-break: break-all; }
  .empty { color: var(--muted); }
</style>
</head>
<body>
<h1>Savepoints</h1>
<div id="status">Loading&hellip;</div>
<div id="jobs"></div>
<script>
"use strict";
const API = __API_BASE__;
const ONLY_JOB = new URLSearchParams(location.search).get("job");  // the operators' extra link names one job
const COLUMNS = ["Savepoint", "Type", "State", "Reason", "Batch", "Size", "Age", "Created", "Pointer"];

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return (unit ? value.toFixed(1) : value) + " " + units[unit];
}

function utc(iso) {
  const time = new Date(iso);
  return isNaN(time) ? iso : time.toISOString().slice(0, 19).replace("T", " ") + " UTC";
}

function age(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (!isFinite(seconds)) return "";
  const steps = [[86400, "d"], [3600, "h"], [60, "m"]];
  for (const [length, name] of steps) if (seconds >= length) return Math.floor(seconds / length) + name;
  return Math.floor(seconds) + "s";
}

async function getJson(path) {
  const response = await fetch(API + path, {credentials: "same-origin", headers: {Accept: "application/json"}});
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = (body && body.error) || {message: response.status + " " + response.statusText};
    throw new Error(error.message + (error.hint ? " (" + error.hint + ")" : ""));
  }
  return body;
}

function jobSection(job, savepoints) {
  const section = el("section");
  section.dataset.job = job;
  section.appendChild(el("h2", job + " (" + savepoints.length + ")"));
  if (!savepoints.length) { section.appendChild(el("div", "no savepoints", "empty")); return section; }
  const table = el("table");
  const head = table.createTHead().insertRow();
  for (const name of COLUMNS) head.appendChild(el("th", name));
  const body = table.createTBody();
  for (const sp of savepoints.slice().reverse()) {  // newest first
    const row = body.insertRow();
    row.className = "savepoint";
    row.dataset.savepointId = sp.savepoint_id;
    const cells = [
      [sp.savepoint_id, "id"], [sp.type], [sp.state || "completed"], [sp.reason || ""],
      [sp.batch_id, "num"], [size(sp.bytes), "num"], [age(sp.created_at), "num"],
      [utc(sp.created_at), "time"], [sp.pointer, "pointer"],
    ];
    for (const [text, cls] of cells) row.appendChild(el("td", text, cls));
  }
  section.appendChild(table);
  return section;
}

async function load() {
  const status = document.getElementById("status");
  const container = document.getElementById("jobs");
  try {
    const listing = await getJson("/jobs");
    const jobs = ONLY_JOB === null ? listing.jobs : listing.jobs.filter(job => job === ONLY_JOB);
    let total = 0;
    const sections = [];
    for (const job of jobs) {
      try {
        const result = await getJson("/jobs/" + encodeURIComponent(job) + "/savepoints");
        total += result.savepoints.length;
        sections.push(jobSection(job, result.savepoints));
      } catch (error) {
        const section = el("section");
        section.appendChild(el("h2", job));
        section.appendChild(el("div", error.message, "error"));
        sections.push(section);
      }
    }
    container.replaceChildren(...sections);
    status.textContent = total + " savepoint(s) in " + jobs.length + " job(s) under " + listing.root
      + (ONLY_JOB === null ? "" : " (job " + ONLY_JOB + " only)");
  } catch (error) {
    status.textContent = "Cannot list savepoints: " + error.message;
    status.className = "error";
  } finally {
    document.body.dataset.loaded = "true";
  }
}

load();
</script>
</body>
</html>
"""


def render_page(api_base_json: str) -> str:
    """The page, with the API's base path as a JSON string literal."""
    return PAGE.replace("__API_BASE__", api_base_json.replace("</", "<\\/"))
