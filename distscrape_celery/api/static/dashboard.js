// The dashboard: every job from the API's live stream, one job's figures, domains and dead
// items, and its buttons. The token is kept in this tab's sessionStorage and sent in the
// Authorization header of every request, streams included (read with fetch, since EventSource
// cannot send a header): it never goes in a URL. Everything a job or a site named is shown as
// text, never as markup.
"use strict";

const TOKEN_KEY = "distscrape-api-token";
const DOMAINS_PAGE = 100;
const DETAIL_REFRESH_MS = 3000;
const $ = (id) => document.getElementById(id);

let selected = null;       // the job shown below the list
let jobStream = null;      // AbortController of the selected job's stream
let listStream = null;     // AbortController of every job's stream
let domainOffset = 0;
let detailTimer = null;

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function headers(extra) {
  return Object.assign({ "Authorization": "Bearer " + token() }, extra || {});
}

async function api(method, path) {
  const res = await fetch(path, { method, headers: headers(), cache: "no-store" });
  if (res.status === 401) { signOut("the token was refused"); throw new Error("unauthorized"); }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    const detail = Array.isArray(body.detail) ? body.detail.map((p) => p.msg).join("; ")
                                              : body.detail;
    throw new Error(detail || res.statusText);
  }
  return body;
}

// Read a server-sent event stream at `path`, calling onEvent(name, data) for each event;
// reconnect after a break unless onEvent returned "stop" or `control` was aborted.
async function stream(path, control, onEvent) {
  while (!control.signal.aborted) {
    try {
      const res = await fetch(path, { headers: headers(), signal: control.signal, cache: "no-store" });
      if (res.status === 401) { signOut("the token was refused"); return; }
      if (res.status === 404) return;
      if (!res.ok) throw new Error(res.statusText);
      $("live").textContent = "live";
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let name = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) name = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (data && onEvent(name, JSON.parse(data)) === "stop") return;
        }
      }
    } catch (err) {
      if (control.signal.aborted) return;
    }
    $("live").textContent = "reconnecting";
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function when(ts) { return ts ? new Date(ts * 1000).toLocaleString() : "-"; }

function progress(job) {
  const total = job.seen || 0;
  const part = total ? (job.done + job.dead) / total : 0;
  const bar = document.createElement("span");
  bar.className = "bar";
  bar.title = Math.round(part * 100) + "%";
  const fill = document.createElement("span");
  fill.style.width = (part * 100).toFixed(1) + "%";
  bar.appendChild(fill);
  return bar;
}

// The job list's columns: a class (the cell's) and what it shows of a job.
const JOB_COLUMNS = [
  ["job-name", (j) => j.job], ["state", (j) => j.state], ["gen", (j) => j.generation],
  ["progress", null], ["seen", (j) => j.seen], ["done", (j) => j.done], ["dead", (j) => j.dead],
  ["queued", (j) => j.queued], ["leased", (j) => j.leased], ["rate", (j) => j.rate.toFixed(1)],
  ["started", (j) => when(j.started)],
];

// Rows are updated in place (not rebuilt), so a click never lands on a row being replaced.
function showJobs(jobs) {
  const body = $("jobs").tBodies[0];
  const rows = new Map([...body.rows].map((row) => [row.dataset.job, row]));
  const listed = new Set();
  for (const job of jobs) {
    listed.add(job.job);
    let row = rows.get(job.job);
    if (!row) {
      row = body.insertRow();
      row.dataset.job = job.job;
      for (const [cls] of JOB_COLUMNS) row.insertCell().className = cls;
      row.addEventListener("click", () => select(job.job));
    }
    JOB_COLUMNS.forEach(([cls, shown], i) => {
      if (shown) row.cells[i].textContent = shown(job);
      else row.cells[i].replaceChildren(progress(job));
    });
    row.cells[1].className = "state state-" + job.state;
    row.classList.toggle("selected", job.job === selected);
  }
  for (const [name, row] of rows) if (!listed.has(name)) row.remove();
  $("no-jobs").hidden = jobs.length > 0;
}

const FIGURES = ["seen", "queued", "frontier", "dispatched", "leased", "saving", "delayed",
                 "done", "dead", "rate", "generation", "links_cut"];

function showJob(job) {
  $("job-state").textContent = job.state;
  $("job-state").className = "state-" + job.state;
  const figures = $("job-figures");
  figures.replaceChildren();
  for (const name of FIGURES) {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = job[name];
    dd.id = "figure-" + name;
    figures.append(dt, dd);
  }
  $("pause").disabled = job.state !== "running";
  $("resume").disabled = !["paused", "cancelled"].includes(job.state);
  $("cancel").disabled = !["running", "paused"].includes(job.state);
}

async function showDomains() {
  const job = selected;
  const query = new URLSearchParams({ sort: $("domain-sort").value, q: $("domain-filter").value,
                                      offset: domainOffset, limit: DOMAINS_PAGE });
  const page = await api("GET", `/api/jobs/${encodeURIComponent(job)}/domains?${query}`);
  if (job !== selected) return;
  const body = $("domains").tBodies[0];
  body.replaceChildren();
  for (const d of page.domains) {
    const row = body.insertRow();
    cell(row, d.domain, "domain");
    cell(row, d.queued);
    cell(row, d.in_flight);
    cell(row, d.dead);
    cell(row, d.mean_fetch === null ? "-" : d.mean_fetch.toFixed(2));
  }
  $("domain-count").textContent = `(${page.total})`;
  const last = Math.min(domainOffset + DOMAINS_PAGE, page.total);
  $("domains-page").textContent = page.total ? `${domainOffset + 1}-${last} of ${page.total}` : "";
  $("domains-prev").disabled = domainOffset === 0;
  $("domains-next").disabled = last >= page.total;
}

async function showDead() {
  const job = selected;
  const dead = await api("GET", `/api/jobs/${encodeURIComponent(job)}/dead?limit=100`);
  if (job !== selected) return;
  const body = $("dead").tBodies[0];
  body.replaceChildren();
  for (const d of dead.items) {
    const row = body.insertRow();
    cell(row, d.item);
    cell(row, d.reason);
  }
  $("dead-count").textContent = dead.total > dead.items.length
    ? `(${dead.items.length} of ${dead.total})` : `(${dead.total})`;
}

async function refreshDetail() {
  if (!selected) return;
  try { await Promise.all([showDomains(), showDead()]); } catch (err) { /* shown next time */ }
}

function select(job) {
  selected = job;
  domainOffset = 0;
  $("job").hidden = false;
  $("job-name").textContent = job;
  $("action-result").textContent = "";
  for (const row of $("jobs").tBodies[0].rows) {
    row.classList.toggle("selected", row.dataset.job === job);
  }
  if (jobStream) jobStream.abort();
  jobStream = new AbortController();
  stream(`/api/jobs/${encodeURIComponent(job)}/events`, jobStream, (name, data) => {
    if (selected !== job) return "stop";
    if (name === "gone") { $("job-state").textContent = "deleted"; return "stop"; }
    showJob(data);
    if (name === "end") { refreshDetail(); return "stop"; }
  });
  clearInterval(detailTimer);
  refreshDetail();
  detailTimer = setInterval(refreshDetail, DETAIL_REFRESH_MS);
}

async function act(action) {
  const job = selected;
  try {
    const res = await api("POST", `/api/jobs/${encodeURIComponent(job)}/${action}`);
    $("action-result").textContent = action === "retry-dead"
      ? `${res.requeued} dead item(s) queued again` : `${res.before} \u2192 ${res.after}`;
    if (action === "resume" || action === "retry-dead") select(job);  // its stream had ended
    else showJob(await api("GET", `/api/jobs/${encodeURIComponent(job)}`));
  } catch (err) {
    $("action-result").textContent = err.message;
  }
}

function start() {
  $("login").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = false;
  listStream = new AbortController();
  stream("/api/events", listStream, (name, data) => { if (name === "jobs") showJobs(data); });
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN_KEY);
  for (const control of [listStream, jobStream]) if (control) control.abort();
  clearInterval(detailTimer);
  selected = null;
  $("main").hidden = true;
  $("job").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = why || "";
  $("live").textContent = "";
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    try {
      await api("GET", "/api/jobs");
      start();
    } catch (err) {
      signOut(err.message === "unauthorized" ? "the token was refused" : err.message);
    }
  });
  $("logout").addEventListener("click", () => signOut());
  for (const action of ["pause", "resume", "cancel", "retry-dead"]) {
    $(action).addEventListener("click", () => act(action));
  }
  $("domain-filter").addEventListener("input", () => { domainOffset = 0; showDomains(); });
  $("domain-sort").addEventListener("change", () => { domainOffset = 0; showDomains(); });
  $("domains-prev").addEventListener("click", () => {
    domainOffset = Math.max(0, domainOffset - DOMAINS_PAGE); showDomains();
  });
  $("domains-next").addEventListener("click", () => { domainOffset += DOMAINS_PAGE; showDomains(); });
  if (token()) start(); else signOut();
});
