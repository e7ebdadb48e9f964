// The savepoints console's JavaScript (plain ES2020, no build step, no library), served by the plugin at
// /savepoints/static/console.js; the page (plugins/page.py) defines CONFIG ({api, airflow}) before it.
/* global CONFIG */
"use strict";
const API = CONFIG.api, AIRFLOW = CONFIG.airflow;
const PAGE_SIZE = 10;
const LIVE = ["starting", "running", "stopping", "unknown"];  // lifecycle states a stop applies to
const ONLY_JOB = new URLSearchParams(location.search).get("job");  // the operators' extra link names one job
const ui = {overview: null, actions: {}, expanded: null, pages: {}, histories: {}, metrics: {}, selected: null, filter: ""};
const $ = id => document.getElementById(id);

// ---- Airflow's look: its Chakra variables, light or dark mode, the user's timezone ----------------
const THEME_VARS = [["--bg", "--chakra-colors-bg"], ["--bg-subtle", "--chakra-colors-bg-subtle"],
  ["--bg-muted", "--chakra-colors-bg-muted"], ["--bg-panel", "--chakra-colors-bg-panel"], ["--fg", "--chakra-colors-fg"],
  ["--fg-muted", "--chakra-colors-fg-muted"], ["--border", "--chakra-colors-border"], ["--error", "--chakra-colors-fg-error"],
  ["--warning", "--chakra-colors-fg-warning"], ["--success", "--chakra-colors-fg-success"], ["--info", "--chakra-colors-fg-info"],
  ["--accent", "--chakra-colors-brand-solid"], ["--accent-fg", "--chakra-colors-brand-contrast"],
  ["--font", "--chakra-fonts-body"], ["--mono", "--chakra-fonts-mono"]];

function hostRoot() {
  try { return window.parent !== window ? window.parent.document.documentElement : null; } catch (_e) { return null; }
}

function storedTheme() {
  try { return localStorage.getItem("theme"); } catch (_e) { return null; }
}

function applyTheme() {
  const host = hostRoot(), root = document.documentElement, stored = storedTheme();
  const dark = host ? host.classList.contains("dark")
    : stored === "dark" || (stored !== "light" && matchMedia("(prefers-color-scheme: dark)").matches);
  root.classList.toggle("dark", dark);
  for (const [ours] of THEME_VARS) root.style.removeProperty(ours);
  if (host) {
    const style = getComputedStyle(host);
    for (const [ours, theirs] of THEME_VARS) {
      const value = style.getPropertyValue(theirs).trim();
      if (value) root.style.setProperty(ours, value);
    }
  }
  document.body.dataset.theme = dark ? "dark" : "light";
}

function timezone() {
  try {
    const chosen = JSON.parse(localStorage.getItem("timezone"));  // what the user picked in Airflow's settings
    if (typeof chosen === "string" && chosen) { new Intl.DateTimeFormat("en", {timeZone: chosen}); return chosen; }
  } catch (_e) { /* not set or not a zone: the browser's */ }
  return Intl.DateTimeFormat().resolvedOptions().timeZone;
}

function formatTime(iso) {
  const time = new Date(iso);
  if (Number.isNaN(time.getTime())) return iso || "";
  const parts = new Intl.DateTimeFormat("en-CA", {timeZone: timezone(), year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "longOffset"}).formatToParts(time);
  const part = type => parts.find(p => p.type === type)?.value || "";
  const offset = part("timeZoneName").replace("GMT", "") || "UTC";  // +05:30, or UTC
  return `${part("year")}-${part("month")}-${part("day")} ${part("hour")}:${part("minute")}:${part("second")} ${offset}`;
}

function relative(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (!Number.isFinite(seconds)) return "";
  if (seconds < 60) return Math.floor(seconds) + "s ago";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m ago";
  if (seconds < 86400) return Math.floor(seconds / 3600) + "h " + Math.floor(seconds % 3600 / 60) + "m ago";
  return Math.floor(seconds / 86400) + "d " + Math.floor(seconds % 86400 / 3600) + "h ago";
}

function tick() {  // live relative ages
  for (const node of document.querySelectorAll("[data-age]")) node.textContent = relative(node.dataset.age);
}

// ---- building blocks -------------------------------------------------------------------------------
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "data") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) if (child !== null && child !== undefined && child !== false)
    node.append(child instanceof Node ? child : String(child));
  return node;
}

const badge = (text, kind, title) => el("span", {class: "badge " + (kind || text), text: text.replace(/_/g, " "), title});
const age = iso => el("span", {data: {age: iso}, title: formatTime(iso), text: relative(iso)});

function size(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return (unit ? value.toFixed(1) : value) + " " + units[unit];
}

function duration(seconds) {
  if (seconds % 86400 === 0) return seconds / 86400 + "d";
  if (seconds % 3600 === 0) return seconds / 3600 + "h";
  if (seconds % 60 === 0) return seconds / 60 + "m";
  return seconds + "s";
}

class ApiError extends Error {
  constructor(status, error) {
    super(error.message || ("HTTP " + status));
    this.status = status; this.code = error.code || "http_" + status; this.hint = error.hint || null;
  }
}

async function call(url, options) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 60000);
  let response;
  try {
    response = await fetch(url, {credentials: "same-origin", signal: controller.signal,
      headers: {Accept: "application/json", ...(options?.headers || {})}, ...(options || {}), });
  } catch (error) {
    throw new ApiError(0, {code: "unreachable", message: "the Airflow API server did not answer (" + error.message + ")",
      hint: "check your connection to Airflow and retry"});
  } finally { clearTimeout(timer); }
  let body = null;
  try { body = await response.json(); } catch (_e) { body = null; }
  if (!response.ok) {
    const detail = body && (body.error || {message: typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)});
    throw new ApiError(response.status, detail || {message: response.status + " " + response.statusText});
  }
  return body;
}

// ---- messages ----------------------------------------------------------------------------------
const PROBLEM_TITLES = {
  savepoint_root_not_found: "The savepoint root does not exist",
  store_timeout: "The savepoint store did not answer",
  missing_credentials: "The savepoint store needs credentials",
  permission_denied: "The savepoint store refused access",
  storage_error: "The savepoint store failed",
  no_savepoint_dir: "No savepoint root is configured",
  not_authenticated: "You are not logged in to Airflow",
  forbidden: "Airflow refused the request",
  unreachable: "Airflow did not answer",
};

function banner(kind, title, error, ...extra) {
  return el("div", {class: "banner " + kind, role: kind === "error" ? "alert" : "status", data: {code: error?.code}},
    el("div", {class: "text"}, el("div", {class: "title", text: title}),
      error ? el("div", {class: "message", text: error.message}) : null,
      error?.hint ? el("div", {class: "hint muted", text: error.hint}) : null, ...extra));
}

function showProblem(error) {
  const title = PROBLEM_TITLES[error.code] || "Cannot list savepoints";
  const retry = el("button", {type: "button", text: "Retry", onclick: load});
  const login = error.status === 401 ? el("a", {href: AIRFLOW + "/", target: "_top", text: "Log in"}) : null;
  $("problem").replaceChildren(banner("error", title, error, el("div", {class: "actions",
    style: "justify-content:flex-start;margin-top:6px"}, retry, login)));
  $("summary").textContent = "";
}

function notify(kind, title, error, ...extra) {
  $("notice").replaceChildren(banner(kind, title, error, ...extra));
}

// ---- actions: DAG runs through Airflow's REST API ---------------------------------------------------
function optionField(option) {
  if (option.type === "boolean") {
    return el("label", {class: "option"}, el("span", {text: option.label}),
      el("input", {type: "checkbox", name: option.param, data: {option: option.param}}),
      el("small", {class: "muted", text: option.hint}));
  }
  const input = el("input", {type: option.type === "integer" ? "number" : "text", name: option.param, placeholder: "unchanged",
    min: option.minimum, step: option.type === "integer" ? 1 : null, data: {option: option.param}});
  return el("label", {class: "option"}, el("span", {text: option.label}), input, el("small", {class: "muted", text: option.hint}));
}

// Resolves to the options' values ({} when none; a blank one left out) once confirmed, to null when cancelled.
function confirmAction(title, text, dangerous, options) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-options").replaceChildren(...(options || []).map(optionField));
  $("confirm-ok").className = dangerous ? "primary danger" : "primary";
  return new Promise(resolve => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue !== "ok") { resolve(null); return; }
      const values = {};
      for (const option of options || []) {
        const input = dialog.querySelector(`input[data-option="${option.param}"]`);
        if (option.type === "boolean") { if (input.checked) values[option.param] = true; continue; }
        const raw = input.value.trim();
        if (raw !== "") values[option.param] = option.type === "integer" ? Number(raw) : raw;
      }
      resolve(values);
    }, {once: true});
    dialog.returnValue = "";
    dialog.showModal();
  });
}

function actionButton(name, conf, subject, note) {
  const action = ui.actions[name];
  if (!action) return null;
  const why = !action.deployed ? `the DAG ${action.dag_id} is not deployed`
    : !action.allowed ? `your Airflow role may not trigger ${action.dag_id}` : null;
  return el("button", {type: "button", class: action.stops_job ? "danger" : "", text: action.label,
    disabled: !!why, title: why || `${action.description} (triggers the DAG ${action.dag_id})`, data: {action: name},
    onclick: event => { event.stopPropagation(); runAction(action, conf, subject, note); }});
}

async function runAction(action, conf, subject, note) {
  const text = `This triggers a run of the DAG ${action.dag_id}` + (subject ? ` for ${subject}` : "") +
    `, which ${action.description}.` + (action.paused ? " The DAG is paused: the run waits until it is unpaused." : "") +
    (action.stops_job ? " The job stops: its sink gets no new data until it is restored." : "") + (note ? " " + note : "");
  const chosen = await confirmAction(action.label + (subject ? ": " + subject : "") + "?", text, action.stops_job, action.options);
  if (chosen === null) return;
  try {
    const run = await call(`${AIRFLOW}/api/v2/dags/${encodeURIComponent(action.dag_id)}/dagRuns`, {method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({logical_date: null, conf: {...conf, ...chosen}, note: "Triggered from the Savepoints console"})});
    const href = `${AIRFLOW}/dags/${encodeURIComponent(action.dag_id)}/runs/${encodeURIComponent(run.dag_run_id)}`;
    notify("success", `Triggered ${action.dag_id}`, null,
      el("div", {}, "Run ", el("a", {href, target: "_top", class: "mono", data: {runId: run.dag_run_id}, text: run.dag_run_id}),
        ` is ${run.state}. Airflow runs it, retries it and keeps its logs.`));
  } catch (error) {
    const refused = error.status === 403;
    notify("error", refused ? `Airflow refused to trigger ${action.dag_id}` : `Cannot trigger ${action.dag_id}`,
      refused ? {code: "forbidden", message: error.message,
        hint: "your Airflow role may not trigger this DAG; ask for edit rights on it"} : error);
  }
}

// ---- copy ----------------------------------------------------------------------------------------
async function copy(text, button, code) {
  let done = false;
  const patience = new Promise((_, reject) => setTimeout(() => reject(new Error("no answer")), 1500));
  try { await Promise.race([navigator.clipboard.writeText(text), patience]); done = true; } catch (_e) {
    const area = el("textarea", {style: "position:fixed;left:-9999px"});
    area.value = text;
    document.body.append(area);
    area.select();
    try { done = document.execCommand("copy"); } catch (_e2) { done = false; }
    area.remove();
  }
  if (!done) {  // the browser refused: select the text for the user's own Ctrl+C
    const range = document.createRange();
    range.selectNodeContents(code);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
  }
  button.textContent = done ? "Copied" : "Press Ctrl+C";
  setTimeout(() => { button.textContent = "Copy"; }, 2500);
}

function copyLine(label, text, name) {
  const code = el("code", {data: {value: name}, text});
  const button = el("button", {type: "button", text: "Copy", data: {copy: name}, onclick: () => copy(text, button, code)});
  return el("div", {}, el("div", {class: "muted", text: label}), el("div", {class: "copyline"}, code, button));
}

// ---- jobs view -----------------------------------------------------------------------------------
function visibleJobs() {
  const jobs = ui.overview.jobs;
  if (ONLY_JOB !== null) return jobs.filter(job => job.job === ONLY_JOB);
  const filter = ui.filter.trim().toLowerCase();
  return filter ? jobs.filter(job => job.job.toLowerCase().includes(filter)) : jobs;
}

function jobRow(job) {
  const open = ui.expanded.has(job.job);
  const toggle = el("button", {type: "button", class: "toggle", "aria-expanded": open ? "true" : "false",
    title: open ? "Collapse" : "Show its savepoints", text: open ? "\u25BE" : "\u25B8"});
  const row = el("tr", {class: "job", data: {job: job.job}, onclick: () => toggleJob(job.job)},
    el("td", {}, toggle), el("td", {class: "name", title: job.job, text: job.job}));
  if (job.error) {
    row.append(el("td", {colspan: 6}, badge("error", "failed"), el("span", {text: job.error.message, title: job.error.hint || ""})));
    return row;
  }
  const lifecycle = job.lifecycle || {};
  const stateTitle = job.state ? [lifecycle.reason, lifecycle.detail, lifecycle.error !== lifecycle.reason && lifecycle.error,
    lifecycle.host && "host " + lifecycle.host].filter(Boolean).join("; ")
    : "no run of this job was started by the job lifecycle (no run lease, run record or control folder)";
  const newest = job.newest ? [badge(job.newest.type), age(job.newest.created_at), " ",
    job.stale ? badge("stale", "stale",
      `older than twice the periodic interval (${duration(ui.overview.periodic_interval_s)})`) : null]
    : [el("span", {class: "muted", text: job.conflicts ? "none restorable" : "none completed"})];
  const counts = Object.entries(job.by_type).map(([type, count]) => badge(`${type} ${count}`, type));
  for (const [state, count] of Object.entries(job.by_state)) if (state !== "completed") counts.push(badge(`${state} ${count}`, state));
  if (job.conflicts) counts.push(badge(`conflict ${job.conflicts}`, "conflict"));
  if (!job.savepoints) counts.push(el("span", {class: "muted", text: "no savepoints"}));
  const reason = lifecycle.reason && job.state === "failed" ? el("div", {class: "reason", data: {reason: job.job},
    text: lifecycle.reason}) : null;
  row.append(el("td", {title: stateTitle}, job.state ? badge(job.state) : el("span", {class: "muted", text: "\u2014"}), reason),
    el("td", {class: "num", text: job.last_batch ?? ""}), el("td", {}, newest), el("td", {class: "wrap"}, counts),
    el("td", {class: "num", text: size(job.total_bytes)}),
    el("td", {}, el("div", {class: "actions"}, LIVE.includes(job.state) ? actionButton("stop", {job: job.job}, `job ${job.job}`) : null)));
  return row;
}

function toggleJob(name) {
  if (ui.expanded.has(name)) ui.expanded.delete(name); else ui.expanded.add(name);
  renderJobs();
}

function savepointsRow(job) {
  const cell = el("td", {colspan: 8});
  const page = ui.pages[job.job];
  if (!page) { cell.append(el("div", {class: "empty"}, el("span", {class: "spinner"}), " Loading\u2026")); loadPage(job.job, 0); }
  else if (page.error) cell.append(banner("error", "Cannot list the savepoints of " + job.job, page.error));
  else if (page.declared) cell.append(banner("info", "No savepoints yet", {code: "declared", message: page.message,
    hint: page.hint}));
  else if (!page.total) cell.append(el("div", {class: "empty", text: "No savepoints yet: the job's folder exists, its " +
    "catalog is empty. Take one with \u201cSavepoint now\u201d, or let periodic_savepoints run."}));
  else cell.append(savepointTable(job.job, page));
  const history = ui.histories[job.job], metrics = ui.metrics[job.job] && metricsView(job.job, ui.metrics[job.job]);
  if (page && !page.error && !page.declared && metrics) cell.append(metrics);
  if (page && !page.error && !page.declared && history) cell.append(historyView(job.job, history));
  return el("tr", {class: "savepoints-row", data: {job: job.job}}, cell);
}

function savepointTable(job, page) {
  const body = el("tbody");
  for (const sp of page.savepoints) {
    const state = [badge(sp.state)];
    if (sp.conflict) state.push(badge("conflict", "conflict", sp.conflict));
    body.append(el("tr", {class: "savepoint" + (ui.selected && ui.selected.id === sp.savepoint_id ? " selected" : ""),
      data: {savepointId: sp.savepoint_id, job, pointer: sp.pointer}, title: sp.pointer, onclick: () => openDetail(job,
        sp.savepoint_id)},
      el("td", {class: "mono", text: sp.savepoint_id}), el("td", {}, badge(sp.type)), el("td", {}, state),
      el("td", {text: sp.reason || "", title: sp.reason || ""}), el("td", {class: "num", text: sp.batch_id ?? ""}),
      el("td", {class: "num", text: size(sp.bytes)}), el("td", {class: "num"}, age(sp.created_at)),
      el("td", {class: "time", text: formatTime(sp.created_at)})));
  }
  const table = el("table", {class: "savepoints"},
    el("colgroup", {}, ["24%", "10%", "12%", "", "6%", "8%", "8%", "18%"].map(width => el("col", {style: width && "width:" + width}))),
    el("thead", {}, el("tr", {}, ["Savepoint", "Type", "State", "Reason", "Batch", "Size", "Age", "Created"].map(
      (name, i) => el("th", {class: [4, 5, 6].includes(i) ? "num" : "", text: name})))), body);
  const last = Math.min(page.offset + PAGE_SIZE, page.total);
  const pager = el("div", {class: "pager"}, el("span", {class: "muted", text: `${page.offset + 1}\u2013${last} of ${page.total}`}),
    el("button", {type: "button", text: "Newer", disabled: page.offset === 0, onclick: () => loadPage(job, page.offset - PAGE_SIZE)}),
    el("button", {type: "button", text: "Older", disabled: last >= page.total, onclick: () => loadPage(job,
      page.offset + PAGE_SIZE)}));
  return el("div", {}, table, pager);
}

async function fetchPage(job, offset) {
  const base = `${API}/jobs/${encodeURIComponent(job)}`;
  const history = call(base + "/history").catch(error => ({error}));
  const metrics = call(base + "/metrics?points=120&decisions=20").catch(error => ({error}));
  try {
    const query = `order=newest&offset=${Math.max(0, offset)}&limit=${PAGE_SIZE}`;
    ui.pages[job] = await call(`${base}/savepoints?${query}`);
  } catch (error) { ui.pages[job] = {error}; }
  ui.histories[job] = await history;
  ui.metrics[job] = await metrics;
}

// ---- a job's history: attempts, trends, state per operator -------------------------------------------
function elapsed(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 60) return seconds.toFixed(seconds < 10 ? 2 : 1) + " s";
  return Math.floor(seconds / 60) + " min " + Math.round(seconds % 60) + " s";
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  node.append(...children);
  return node;
}

// lines oldest first: [{name, points: [{t: ms, v: number, label}], color, dashed}]; the caption names the first's
// latest and highest value, a legend the lines when there are several; a point is a dot (its value in a tooltip)
// on lines of up to DOTS points
const DOTS = 40;

function trendChart(title, lines, format, missing) {
  const [main] = lines;
  if (main.points.length < 2) return el("figure", {class: "chart", data: {chart: title}},
    el("figcaption", {class: "muted", text: `${title}: ${missing}`}));
  const width = 320, height = 96, left = 58, right = 8, top = 6, bottom = 20;
  const all = lines.flatMap(l => l.points), values = main.points.map(p => p.v), times = all.map(p => p.t);
  const first = Math.min(...times), last = Math.max(...times), highest = Math.max(...all.map(p => p.v)) || 1;
  const x = t => left + (last === first ? 0 : (t - first) / (last - first)) * (width - left - right);
  const y = v => height - bottom - v / highest * (height - top - bottom);
  const label = (text, attrs) => svg("text", {"font-size": 10, fill: "var(--fg-muted)", ...attrs}, text);
  const when = p => p.label.slice(5, 16);  // "MM-DD hh:mm" of formatTime's "YYYY-MM-DD hh:mm:ss zone"
  const ends = [...all].sort((a, b) => a.t - b.t);
  const axes = svg("g", {class: "axis", stroke: "var(--border)"},
    svg("line", {x1: left, y1: top, x2: left, y2: height - bottom}),
    svg("line", {x1: left, y1: height - bottom, x2: width - right, y2: height - bottom}),
    label(format(highest), {x: left - 4, y: top + 8, "text-anchor": "end", "data-axis": "y"}),
    label(format(0) || "0", {x: left - 4, y: height - bottom, "text-anchor": "end", "data-axis": "y"}),
    label(when(ends[0]), {x: left, y: height - 6, "text-anchor": "start", "data-axis": "x"}),
    label(when(ends[ends.length - 1]), {x: width - right, y: height - 6, "text-anchor": "end", "data-axis": "x"}));
  const drawn = lines.map(l => {
    const path = l.points.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ");
    return svg("g", {class: "line", "data-line": l.name, color: l.color || "currentColor"},
      svg("path", {d: path, fill: "none", stroke: "currentColor", "stroke-width": 1.5, "stroke-dasharray": l.dashed ? "4 3" : "none"}),
      ...(l.points.length > DOTS ? [] : l.points.map(p => svg("circle", {cx: x(p.t).toFixed(1), cy: y(p.v).toFixed(1), r: 2.5,
        fill: "currentColor"}, svg("title", {}, `${p.label}: ${l.name} ${format(p.v)}`)))));
  });
  const legend = lines.length > 1 ? el("div", {class: "legend"}, lines.map(l => el("span", {class: "key" +
    (l.dashed ? " dashed" : ""), style: l.color ? `color:${l.color}` : null, text: l.name}))) : null;
  return el("figure", {class: "chart", data: {chart: title}},
    el("figcaption", {}, `${title}: latest ${format(values[values.length - 1])}, highest ${format(Math.max(...values))}`,
      legend),
    svg("svg", {viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": `${title} over time`}, axes, ...drawn));
}

function outcomeDetail(entry) {
  if (entry.outcome === "failed") return el("span", {class: "reason", title: entry.error || "", text: entry.error_reason || ""});
  if (entry.outcome === "disposed") return el("span", {text: `by ${entry.disposed_by || "unknown"}` +
    (entry.reason ? `: ${entry.reason}` : "")});
  return el("span", {class: "muted", text: entry.reason || ""});
}

function historyTable(job, entries) {
  const body = el("tbody", {}, entries.map(e => el("tr", {class: "attempt " + e.outcome, data: {outcome: e.outcome,
    savepointId: e.savepoint_id || ""}},
    el("td", {class: "time", text: formatTime(e.ended_at)}), el("td", {class: "mono", text: e.savepoint_id || "\u2014",
      title: e.savepoint_id || "it failed before a location was chosen"}),
    el("td", {}, e.type ? badge(e.type) : ""), el("td", {}, badge(e.outcome, e.outcome === "disposed" ? "disposing" : e.outcome)),
    el("td", {class: "num", text: e.outcome === "disposed" ? "" : elapsed(e.duration_s)}),
    el("td", {class: "num", text: size(e.bytes)}), el("td", {class: "num", text: e.files ?? ""}),
    el("td", {class: "wrap"}, outcomeDetail(e)))));
  return el("table", {class: "history", data: {job}},
    el("colgroup", {}, ["18%", "22%", "8%", "9%", "7%", "7%", "5%", ""].map(width => el("col", {style: width && "width:" + width}))),
    el("thead", {}, el("tr", {}, ["Ended", "Savepoint", "Type", "Outcome", "Duration", "Size", "Files", "Detail"].map(
      (name, i) => el("th", {class: [4, 5, 6].includes(i) ? "num" : "", text: name})))), body);
}

function operatorsTable(operators) {
  const rows = Object.fromEntries((operators.state_summary?.operators || []).map(o => [String(o.operator_id), o]));
  if (!operators.state_stores.length) return el("div", {class: "empty", text: "A stateless query: no state per operator."});
  return el("table", {class: "stores operators"},
    el("thead", {}, el("tr", {}, ["Operator", "Partitions", "Files", "Size", "Rows"].map(n => el("th", {text: n})))),
    el("tbody", {}, operators.state_stores.map(s => el("tr", {data: {operator: s.operator}}, el("td", {text: s.operator}),
      el("td", {text: s.partitions}), el("td", {text: s.files}), el("td", {text: size(s.bytes)}),
      el("td", {text: rows[String(s.operator)]?.rows ?? "\u2014",
        title: rows[String(s.operator)] ? "" : "not inspected (InspectSavepointOperator records rows)"})))));
}

function historyView(job, history) {
  if (history.error) return banner("error", "Cannot read the history of " + job, history.error);
  const parts = [el("h3", {text: `History (${history.total} attempts, newest first)`})];
  if (!history.total) {
    parts.push(el("div", {class: "empty", text: "No attempts recorded yet: the history starts with the next savepoint " +
      "(catalogs written by an older release have none)."}));
  } else {
    const done = history.history.filter(e => e.outcome === "completed").reverse();
    const point = value => e => ({t: Date.parse(e.ended_at), v: value(e), label: formatTime(e.ended_at)});
    const trend = (name, value, format) => trendChart(name, [{name, points: done.filter(e => value(e) !== null).map(point(value))}],
      format, "a trend needs two completed savepoints");
    parts.push(el("div", {class: "charts"}, trend("Size", e => e.bytes, size), trend("Duration", e => e.duration_s, elapsed)));
    parts.push(historyTable(job, history.history));
  }
  if (history.operators) parts.push(el("h3", {}, "State per operator (newest savepoint ",
    el("span", {class: "id", text: history.operators.savepoint_id}), ")"), operatorsTable(history.operators));
  return el("div", {class: "history-view", data: {job}}, ...parts);
}

// ---- a job's load: its metric series and autoscale decisions (recorded by the run and `job autoscale`) ---------
const NUMBER = new Intl.NumberFormat("en", {notation: "compact", maximumFractionDigits: 1});
const perSecond = value => NUMBER.format(value) + " rows/s";
const records = value => NUMBER.format(value) + " records";
const files = value => NUMBER.format(value) + " files";

function change(decision, key) {  // "2 \u2192 4", or what it is now
  const now = decision.current?.[key], then = decision.target?.[key];
  if (now == null && then == null) return "";
  return then == null || then === now ? String(now ?? "") : `${now ?? "?"} \u2192 ${then}`;
}

function decisionsTable(job, decisions, total) {
  if (!decisions.length) return el("div", {class: "empty", text: "No autoscale decision recorded (job autoscale records each)."});
  const body = el("tbody", {}, decisions.map(d => el("tr", {class: "decision", data: {outcome: d.outcome || "", action: d.action || ""}},
    el("td", {class: "time", text: d.at ? formatTime(d.at) : "\u2014"}), el("td", {text: (d.action || "").replace(/_/g, " ")}),
    el("td", {class: "mono", text: d.reason || ""}), el("td", {}, d.outcome ? badge(d.outcome) : ""),
    el("td", {class: "num", text: change(d, "cores")}), el("td", {class: "num", text: change(d, "partitions")}),
    el("td", {class: "wrap", title: JSON.stringify(d.evidence)}, d.message || "", d.error ? el("div", {class: "reason",
      title: d.error.hint || "", text: `${d.error.code}: ${d.error.message}`}) : null))));
  return el("div", {}, el("h3", {text: `Autoscale decisions (${decisions.length} newest of ${total})`}),
    el("table", {class: "decisions", data: {job}},
      el("colgroup", {}, ["18%", "9%", "12%", "11%", "7%", "8%", ""].map(width => el("col", {style: width && "width:" + width}))),
      el("thead", {}, el("tr", {}, ["Time", "Action", "Reason", "Outcome", "Cores", "Partitions", "Message"].map(
        (name, i) => el("th", {class: [4, 5].includes(i) ? "num" : "", text: name})))), body));
}

// The backlog in the units its sources give: Kafka records, files not yet read; a placeholder when neither is known.
function backlogCharts(points, line) {
  const kafka = points.some(p => p.backlog != null), fromFiles = points.some(p => p.backlog_files != null);
  return [
    ...(kafka || !fromFiles ? [trendChart("Backlog", [line("backlog", p => p.backlog)], records, kafka ? "needs two recorded batches"
      : "not known (Kafka sources report their latest offsets; file sources their unread files, with the in-job helper)")] : []),
    ...(fromFiles ? [trendChart("File backlog", [line("files not yet read", p => p.backlog_files)], files,
      "needs two recorded batches")] : [])];
}

function metricsView(job, metrics) {
  if (metrics.error) return banner("error", "Cannot read the metrics of " + job, metrics.error);
  if (!metrics.total_points && !metrics.total_decisions && !metrics.warnings.length) return null;
  const line = (name, value, look) => ({name, ...look, points: metrics.points.filter(p => value(p) != null).map(p => ({
    t: p.time * 1000, v: value(p), label: formatTime(new Date(p.time * 1000).toISOString())}))});
  const seconds = ms => ms == null ? null : ms / 1000;
  const merged = metrics.merged > 1 ? `, ${metrics.merged} per point` : "";
  return el("div", {class: "metrics-view", data: {job}},
    el("h3", {text: `Load (the last ${metrics.total_points} batches${merged})`,
      title: merged && "a point shows the longest of its batches, their mean rates and the largest backlog"}),
    ...metrics.warnings.map(text => banner("warning", "Part of the metrics could not be read", {message: text})),
    el("div", {class: "charts"},
      trendChart("Batch duration", [line("batch duration", p => seconds(p.duration_ms)),
        line("trigger interval", p => seconds(p.trigger_interval_ms), {color: "var(--fg-muted)", dashed: true})], elapsed,
        "needs two recorded batches"),
      trendChart("Input and processed rate", [line("input", p => p.input_rate),
        line("processed", p => p.processed_rate, {color: "var(--success)"})], perSecond, "needs two recorded batches"),
      ...backlogCharts(metrics.points, line)),
    decisionsTable(job, metrics.decisions, metrics.total_decisions));
}

async function loadPage(job, offset) {
  await fetchPage(job, offset);
  renderJobs();
}

function renderJobs() {
  const jobs = visibleJobs();
  const body = $("jobs").tBodies[0];
  const rows = [];
  for (const job of jobs) {
    rows.push(jobRow(job));
    if (ui.expanded.has(job.job) && !job.error) rows.push(savepointsRow(job));
  }
  if (!jobs.length) {
    const text = ui.overview.jobs.length ? `No job matches "${ONLY_JOB ?? ui.filter}".`
      : "No jobs yet: the savepoint root exists but holds no job folder. Savepoints appear here once a job takes one.";
    rows.push(el("tr", {}, el("td", {colspan: 8, class: "empty", text})));
  }
  body.replaceChildren(...rows);
  $("jobs").hidden = false;
  $("collapse").textContent = ui.expanded.size ? "Collapse all" : "Expand all";
  const total = ui.overview.jobs.reduce((sum, job) => sum + (job.savepoints || 0), 0);
  const bytes = ui.overview.jobs.reduce((sum, job) => sum + (job.total_bytes || 0), 0);
  $("summary").replaceChildren(`${ui.overview.jobs.length} job(s), ${total} savepoint(s), ${size(bytes)}; loaded `,
    age(ui.overview.checked_at), ` \u00b7 times in ${timezone()}` + (ONLY_JOB !== null ? ` \u00b7 job ${ONLY_JOB} only` : ""));
}

// ---- detail view ---------------------------------------------------------------------------------
async function openDetail(job, id, verify) {
  ui.selected = {job, id};
  const section = $("detail");
  section.hidden = false;
  section.replaceChildren(el("div", {class: "empty"}, el("span", {class: "spinner"}),
    verify ? " Verifying every file\u2026" : " Loading\u2026"));
  renderJobs();
  section.scrollIntoView({block: "nearest"});
  try {
    const url = `${API}/jobs/${encodeURIComponent(job)}/savepoints/${encodeURIComponent(id)}`;
    const answer = await call(url + (verify ? "?verify=true" : ""));
    if (!ui.selected || ui.selected.id !== id) return;
    section.replaceChildren(...detailView(answer));
  } catch (error) {
    section.replaceChildren(banner("error", "Cannot read savepoint " + id, error));
  }
  section.dataset.loaded = "true";
}

function fact(name, ...value) {
  return [el("dt", {text: name}), el("dd", {data: {fact: name}}, ...value)];
}

function checksumsFact(answer) {
  const sums = answer.detail.checksums;
  if (!sums) return "";
  const sources = Object.entries(sums.sources).map(([source, n]) => `${n} ${source}`).join(", ");
  const status = sums.verified === true ? badge("verified", "completed", "every file was read again and matched")
    : sums.verified === false ? badge("damaged", "failed", sums.problem) : badge("not verified", "unknown");
  const verify = el("button", {type: "button", class: "link", text: sums.verified === null ? "Verify now" : "Verify again",
    onclick: () => openDetail(answer.job, answer.savepoint.savepoint_id, true)});
  return [status, ` ${sums.algorithm} of ${sums.files} files (${sources}) `, verify,
    sums.problem ? el("div", {class: "message", style: "color:var(--error)", text: sums.problem}) : null];
}

function sinkNote(sink) {  // what a restore from this savepoint tells of the job's sink, checked as the restore checks it
  if (!sink) return null;
  if (sink.refused) return `The sink: a restore now is refused (${sink.refused.code}): ${sink.refused.message} ${sink.refused.hint || ""}`.trim();
  return `The sink: ${sink.detail}.`;
}

function sinkFact(sink) {
  if (!sink) return el("span", {class: "muted", text: "\u2014"});
  if (!sink.refused) return el("span", {data: {sink: sink.on_rerun || "unknown"}, text: sink.detail});
  return el("span", {data: {sink: "refused"}}, badge(sink.refused.code, "failed"), " ", sink.refused.message,
    el("div", {class: "muted", text: sink.refused.hint || ""}));
}

function restorePickFact(answer) {
  const pick = answer.detail.restore_pick;
  if (!pick) return el("span", {class: "muted", text: "nothing: the job has no restorable savepoint"});
  if (pick.is_this) return [badge("this savepoint", "completed"), " is what a restore of the job without a pointer uses"];
  return [el("button", {type: "button", class: "link mono", text: pick.savepoint_id,
    onclick: () => openDetail(answer.job, pick.savepoint_id)}), " (the newest completed one)"];
}

function assetLink(job) {  // the job's asset (savepoints/<job>): its events are the job's savepoints as Airflow saw them
  const link = el("a", {target: "_top", data: {asset: job}, text: `asset savepoints/${job}`});
  call(`${AIRFLOW}/api/v2/assets?name_pattern=${encodeURIComponent("savepoints/" + job)}&limit=5`).then(found => {
    const asset = (found.assets || []).find(a => a.name === "savepoints/" + job);
    if (asset) link.href = `${AIRFLOW}/assets/${encodeURIComponent(asset.id)}`;
    else link.replaceWith(el("span", {class: "muted", text: "no asset events yet"}));
  }).catch(() => link.replaceWith(el("span", {class: "muted", text: "assets not readable"})));
  return link;
}

function stateSummaryView(state) {  // recorded by InspectSavepointOperator: rows and skew without Spark
  const skewText = s => s == null ? "\u2014" : s.toFixed(2) + "\u00d7";
  const table = el("table", {class: "stores"},
    el("thead", {}, el("tr", {}, ["Operator", "Name", "Stores", "Partitions", "Rows", "Largest partition", "Skew", "Size"]
      .map(n => el("th", {text: n})))),
    el("tbody", {}, state.operators.map(o => el("tr", {}, el("td", {text: o.operator_id}), el("td", {text: o.name || "unknown"}),
      el("td", {text: o.stores.join(", ")}), el("td", {text: o.partitions}), el("td", {text: o.rows ?? "\u2014"}),
      el("td", {text: o.max_partition_rows ?? "\u2014"}),
      el("td", {text: skewText(o.skew), title: "largest partition's rows over the mean",
        style: o.skew > 2 ? "color:var(--warning)" : null}),
      el("td", {text: size(o.bytes)})))));
  return [el("h3", {text: "State rows (inspected " + formatTime(state.inspected_at) + ")"}), table,
    ...state.limits.map(text => el("div", {class: "muted", text}))];
}

function providerName(provider) {  // Spark's class name, short enough for its column; the whole name is the title
  const name = (provider || "").split(".").pop();
  if (!name) return "default (HDFS-backed)";
  if (name === "HDFSBackedStateStoreProvider") return "HDFS-backed";
  if (name === "RocksDBStateStoreProvider") return "RocksDB";
  return name.replace(/StateStoreProvider$/, "") || name;
}

function offsetText(offset) {  // one source's committed position, as a reader says it
  if (offset === null || offset === undefined) return ["no data yet"];
  if (typeof offset === "object" && Number.isInteger(offset.logOffset)) return [`file source log entry ${offset.logOffset}`];
  const topics = typeof offset === "object" ? Object.entries(offset) : [];
  if (topics.length && topics.every(([, parts]) => parts && typeof parts === "object" &&
      Object.values(parts).every(Number.isInteger))) {  // Kafka: {"topic": {"partition": offset}}
    return topics.flatMap(([topic, parts]) => Object.entries(parts).map(([part, at]) => `${topic} partition ${part}: offset ${at}`));
  }
  return [typeof offset === "string" ? offset : JSON.stringify(offset)];
}

function sourceOffsetsView(offsets) {
  const sources = Object.entries(offsets);
  if (!sources.length) return el("div", {class: "empty", text: "The savepoint records no source offsets."});
  return el("table", {class: "offsets"},
    el("colgroup", {}, el("col", {style: "width:18%"}), el("col", {})),
    el("thead", {}, el("tr", {}, el("th", {text: "Source"}), el("th", {text: "Committed position (what a restore resumes after)"}))),
    el("tbody", {}, sources.map(([source, offset]) => el("tr", {data: {source}}, el("td", {text: source}),
      el("td", {class: "wrap"}, ...offsetText(offset).flatMap((line, i) => i ? [el("br"), line] : [line]))))));
}

function detailView(answer) {
  const sp = answer.savepoint, manifest = answer.manifest || {}, detail = answer.detail || {};
  const close = el("button", {type: "button", text: "Close",
    onclick: () => { ui.selected = null; $("detail").hidden = true; renderJobs(); }});
  const restore = sp.state === "completed" && !sp.conflict ? actionButton("restore", {job: sp.job, pointer: sp.pointer},
    `job ${sp.job} from ${sp.savepoint_id}`, sinkNote(detail.restore_sink)) : null;
  const head = el("header", {}, el("h2", {class: "mono", text: sp.savepoint_id}), badge(sp.type), badge(sp.state),
    sp.conflict ? badge("conflict", "conflict", sp.conflict) : null, el("span", {class: "spacer"}), restore, close);
  const facts = el("dl", {class: "facts"},
    fact("Job", sp.job), fact("Batch", String(sp.batch_id ?? "")),
    fact("Created", formatTime(sp.created_at), " (", age(sp.created_at), ")"),
    fact("Reason", sp.reason || "\u2014"), fact("Request id", sp.request_id || "\u2014"),
    fact("Query id", el("span", {class: "mono", text: sp.query_id || ""})),
    fact("Spark version", sp.spark_version || "not recorded (the checkpoint does not say; the job's driver was not asked)"),
    fact("Source checkpoint", el("span", {class: "mono", text: manifest.checkpoint || "\u2014"})),
    fact("Files", `${sp.files ?? ""} files, ${size(sp.bytes)}`),
    fact("Checksums", checksumsFact(answer)),
    fact("A restore would pick", restorePickFact(answer)),
    detail.restore_sink ? fact("The sink on restore", sinkFact(detail.restore_sink)) : [],
    fact("In Airflow", el("a", {href: `${AIRFLOW}/dags?tags=savepoints`, target: "_top", text: "savepoint DAGs"}), " \u00b7 ",
      assetLink(sp.job)),
    sp.conflict ? fact("Conflict", sp.conflict) : [],
    answer.manifest_error ? fact("Manifest", el("span", {style: "color:var(--error)", text: answer.manifest_error.message})) : []);
  const parts = [head, facts, el("h3", {text: "Pointer and commands"}), copyLine("Pointer", sp.pointer, "pointer")];
  if (detail.commands) parts.push(copyLine("Restore into a fresh checkpoint location", detail.commands.restore, "restore"),
    copyLine("Start the job from it (jobs.yaml)", detail.commands.start, "start"));
  if (detail.state_stores) {
    parts.push(el("h3", {text: "State stores"}));
    parts.push(detail.state_stores.length ? el("table", {class: "stores"},
      el("thead", {}, el("tr", {}, ["Operator", "Provider", "Format", "Partitions", "Files", "Size"].map(n => el("th", {text: n})))),
      el("tbody", {}, detail.state_stores.map(s => el("tr", {}, el("td", {text: s.operator}), el("td",
        {class: "wrap", text: providerName(s.provider), title: s.provider || ""}),
        el("td", {text: "v" + s.format_version}), el("td", {text: s.partitions}), el("td", {text: s.files}), el("td",
          {text: size(s.bytes)})))))
      : el("div", {class: "empty", text: "A stateless query: no state store files."}));
  }
  if (detail.state_summary) parts.push(...stateSummaryView(detail.state_summary));
  if (answer.manifest) parts.push(el("h3", {text: "Source offsets"}), sourceOffsetsView(manifest.source_offsets || {}));
  return parts;
}

// ---- loading -------------------------------------------------------------------------------------
async function load() {
  $("refresh").disabled = true;
  try {
    const [overview, actions] = await Promise.all([call(API + "/overview"), call(API + "/actions").catch(() => ({actions: []}))]);
    ui.overview = overview;
    ui.actions = Object.fromEntries(actions.actions.map(action => [action.action, action]));
    if (ui.expanded === null) {  // first load: a few jobs open, many closed
      ui.expanded = new Set(ONLY_JOB !== null ? [ONLY_JOB] : overview.jobs.length <= 5 ? overview.jobs.map(j => j.job) : []);
    }
    const offsets = Object.fromEntries(Object.entries(ui.pages).map(([job, page]) => [job, page.offset || 0]));
    ui.pages = {}; ui.histories = {}; ui.metrics = {};
    await Promise.all(visibleJobs().filter(job => ui.expanded.has(job.job) && !job.error)
      .map(job => fetchPage(job.job, offsets[job.job] || 0)));
    $("root").textContent = overview.root;
    $("problem").replaceChildren();
    const now = actionButton("savepoint", {}, "all jobs");
    $("savepoint-now").replaceChildren(...(now ? [now] : []));
    renderJobs();
    if (ui.selected) openDetail(ui.selected.job, ui.selected.id);
  } catch (error) {
    $("jobs").hidden = true;
    $("root").textContent = "";
    showProblem(error);
  } finally {
    $("refresh").disabled = false;
    document.body.dataset.loaded = "true";
  }
}

function start() {
  applyTheme();
  const host = hostRoot();
  if (host) new MutationObserver(applyTheme).observe(host, {attributes: true, attributeFilter: ["class", "style"]});
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", applyTheme);
  window.addEventListener("storage", () => { applyTheme(); if (ui.overview) renderJobs(); });
  if (ONLY_JOB !== null) { $("filter").value = ONLY_JOB; $("filter").disabled = true; }
  $("filter").addEventListener("input", event => { ui.filter = event.target.value; if (ui.overview) renderJobs(); });
  $("refresh").addEventListener("click", () => { $("notice").replaceChildren(); load(); });
  $("collapse").addEventListener("click", () => {
    ui.expanded = ui.expanded.size ? new Set() : new Set(visibleJobs().map(job => job.job));
    renderJobs();
  });
  setInterval(tick, 1000);
  setInterval(() => { if (!document.hidden) load(); }, 60000);
  load();
}

start();
