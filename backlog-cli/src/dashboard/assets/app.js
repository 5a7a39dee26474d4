// backlog dashboard: one page, routed on location.pathname, fed by the JSON
// API. Every piece of job data is written with textContent (see `h`), never
// as HTML: a payload holding <script> shows as text.
"use strict";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const READ_ONLY = document.querySelector('meta[name="read-only"]').content === "1";
const REFRESH_MS = 2000;
const STATES = ["available", "scheduled", "retrying", "running", "grouped", "pending",
  "completed", "discarded", "cancelled", "dead"];
const main = document.getElementById("main");

// ---- DOM ----------------------------------------------------------------

// h("a", {href: "/x", class: "y"}, "text", child...): an element whose
// strings become text nodes.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}

const fmt = new Intl.NumberFormat("en");
const num = (n) => fmt.format(n);

function ago(iso) {
  if (!iso) return "";
  const secs = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
  const text = duration(Math.abs(secs));
  if (text === "now") return text;
  return secs > 0 ? "in " + text : text + " ago";
}

function duration(secs) {
  if (secs < 1) return "now";
  if (secs < 120) return secs + "s";
  if (secs < 7200) return Math.round(secs / 60) + "m";
  if (secs < 172800) return Math.round(secs / 3600) + "h";
  return Math.round(secs / 86400) + "d";
}

function stamp(iso) {
  if (!iso) return "—";
  return h("span", {title: iso}, iso.replace("T", " ").replace(/\.\d+Z$/, "Z"), " ",
    h("span", {class: "muted"}, "(" + ago(iso) + ")"));
}

const badge = (state) => h("span", {class: "badge s-" + state}, state);

function link(href, ...children) {
  return h("a", {href, onclick: (e) => {
    if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    go(href);
  }}, ...children);
}

// ---- API ----------------------------------------------------------------

async function api(path) {
  const res = await fetch(path, {headers: {"Accept": "application/json"}});
  const body = await res.json().catch(() => ({error: res.statusText}));
  if (!res.ok) throw new ApiError(res.status, body.error || res.statusText);
  return body;
}

async function post(path, body) {
  const res = await fetch(path, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": CSRF},
    body: JSON.stringify(body || {}),
  });
  const out = await res.json().catch(() => ({error: res.statusText}));
  if (!res.ok) throw new ApiError(res.status, out.error || res.statusText);
  return out;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// ---- flash, confirm ------------------------------------------------------

let flashTimer;
function flash(message, ok) {
  const el = document.getElementById("flash");
  el.textContent = message;
  el.className = "flash " + (ok ? "ok" : "err");
  el.hidden = false;
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => { el.hidden = true; }, ok ? 6000 : 12000);
}

function confirmAction(text, verb) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = verb || "Confirm";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), {once: true});
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// Runs an action after confirming it, reports the outcome, refreshes.
async function act(question, verb, path, body, after) {
  if (!(await confirmAction(question, verb))) return;
  try {
    const out = await post(path, body);
    flash(out.message, true);
    if (after) after(out); else refresh();
  } catch (e) {
    flash(e.message, false);
    refresh();
  }
}

function button(label, onclick, kind) {
  if (READ_ONLY) return null;
  return h("button", {class: "btn " + (kind || ""), type: "button", onclick}, label);
}

// ---- router and live refresh ----------------------------------------------

let current = null;  // {render, timer}
let generation = 0;

function go(href) {
  history.pushState(null, "", href);
  route();
}

function route() {
  const path = location.pathname;
  const params = new URLSearchParams(location.search);
  let view, nav;
  let m;
  if (path === "/") { view = () => overview(params); nav = "overview"; }
  else if (path === "/jobs") { view = () => jobs(params); nav = "jobs"; }
  else if (path === "/dead") { view = () => dead(params); nav = "dead"; }
  else if (path === "/workers") { view = () => workersPage(); nav = "workers"; }
  else if ((m = path.match(/^\/jobs\/(-?\d+)$/))) { view = () => job(m[1]); nav = "jobs"; }
  else if ((m = path.match(/^\/workflows\/([^/]+)$/))) {
    const which = decodeURIComponent(m[1]);
    view = () => workflowPage(which); nav = "jobs";
  }
  else if ((m = path.match(/^\/batches\/(-?\d+)$/))) { view = () => batchPage(m[1]); nav = "jobs"; }
  else { view = async () => [h("h1", {}, "Not found")]; nav = ""; }
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.nav === nav);
  }
  current = {view};
  generation++;
  refresh(true);
}

async function refresh(fresh) {
  if (!current) return;
  const mine = generation;
  const live = document.getElementById("live");
  try {
    const nodes = await current.view();
    if (mine !== generation) return;
    // Keep focus and typing in a filter field across refreshes.
    if (!fresh && main.contains(document.activeElement) &&
        document.activeElement.tagName === "INPUT") return;
    main.replaceChildren(...nodes.flat().filter((n) => n));
    live.textContent = "live";
    live.className = "live";
  } catch (e) {
    if (mine !== generation) return;
    if (e instanceof ApiError && e.status < 500) {
      main.replaceChildren(h("h1", {}, "Error"), h("p", {class: "error-text"}, e.message));
    }
    live.textContent = "offline";
    live.className = "live off";
  }
}

// One refresh at a time: the next starts REFRESH_MS after the last ended,
// or four times as long as it took, so a slow database (a scan of a big
// live table for the overview's counts) is polled less, never piled up.
async function poll() {
  const began = Date.now();
  if (!document.hidden && !document.getElementById("confirm").open) await refresh();
  setTimeout(poll, Math.max(REFRESH_MS, 4 * (Date.now() - began)));
}
setTimeout(poll, REFRESH_MS);
window.addEventListener("popstate", route);
document.getElementById("search").addEventListener("submit", (e) => {
  e.preventDefault();
  const q = e.target.q.value.trim().replace(/^#/, "");
  if (!q) return;
  go(/^-?\d+$/.test(q) ? "/jobs/" + q : "/jobs?search=" + encodeURIComponent(q));
});
for (const a of document.querySelectorAll("header a")) {
  a.addEventListener("click", (e) => {
    if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    go(a.getAttribute("href"));
  });
}

// ---- overview -------------------------------------------------------------

// The chart's windows: its title and the labels under its axis.
const WINDOWS = {
  "1h": {title: "Finished per minute, last hour", unit: "/min",
    axis: ["60 min ago", "30 min ago", "now"], bucket: (ago) => ago === 0 ? "this minute" : ago + " min ago"},
  "24h": {title: "Finished per hour, last 24 hours", unit: "/h",
    axis: ["24 h ago", "12 h ago", "now"], bucket: (ago) => ago === 0 ? "this hour" : ago + " h ago"},
  "7d": {title: "Finished per hour, last 7 days", unit: "/h",
    axis: ["7 days ago", "3½ days ago", "now"], bucket: (ago) => ago === 0 ? "this hour"
      : ago < 48 ? ago + " h ago" : Math.floor(ago / 24) + " d " + (ago % 24) + " h ago"},
};

async function overview(params) {
  const win = WINDOWS[params.get("window")] ? params.get("window") : "1h";
  const cq = new URLSearchParams({window: win});
  for (const k of ["queue", "kind"]) if (params.get(k)) cq.set(k, params.get(k));
  const [data, c] = await Promise.all([api("/api/overview"), api("/api/chart?" + cq)]);
  const total = (k) => data.queues.reduce((n, q) => n + q[k], 0);
  const cards = h("div", {class: "cards"},
    card("Available", total("available"), "waiting for a worker", "/jobs?state=available"),
    card("Running", total("running"), "leased by workers", "/jobs?state=running"),
    card("Scheduled", total("scheduled") + total("retrying"),
      num(total("retrying")) + " retrying after a failure", "/jobs?state=scheduled"),
    card("Pending", total("pending"), "waiting for their dependencies", "/jobs?state=pending"),
    card("Dead", total("dead"), "out of attempts", "/dead", total("dead") > 0 ? "bad" : ""),
    card("Completed", total("completed_last_hour"),
      "last hour · " + num(total("completed_last_minute")) + " last minute",
      "/jobs?state=completed"));
  const out = [h("h1", {}, "Overview"), cards,
    chartPanel(c, cq),
    h("section", {class: "panel"},
      h("div", {class: "panel-head"}, h("h2", {}, "Queues"),
        h("span", {class: "muted"}, data.queues.length + " queue(s)")),
      queuesTable(data.queues))];
  const flow = renderFlowControl(data.flow_control);
  if (flow) out.push(flow);
  return out;
}

function card(label, value, note, href, tone) {
  return link(href, h("div", {class: "card " + (tone || "")},
    h("div", {class: "card-label"}, label),
    h("div", {class: "card-value"}, num(value)),
    h("div", {class: "card-note"}, note)));
}

// The throughput panel: the window's chart with its choosers (window,
// queue, kind), each a link to the overview with that choice in its query.
function chartPanel(c, cq) {
  const w = WINDOWS[c.window];
  const sum = (xs) => xs.reduce((n, x) => n + x, 0);
  const choose = (key, value, label, active) => {
    const p = new URLSearchParams(cq);
    if (value) p.set(key, value); else p.delete(key);
    return link("/?" + p, h("span", {class: "tab" + (active ? " active" : "")}, label));
  };
  const row = (key, label, values) => h("div", {class: "tabs chart-choose", "data-choose": key},
    h("span", {class: "muted"}, label),
    choose(key, null, "all", !c[key]),
    values.map((v) => choose(key, v, v, c[key] === v)));
  return h("section", {class: "panel", id: "throughput"},
    h("div", {class: "panel-head"}, h("h2", {}, w.title),
      h("span", {class: "legend"},
        h("i", {class: "k-done"}), num(sum(c.completed)) + " completed",
        h("i", {class: "k-dead"}), num(sum(c.failed)) + " failed (dead or discarded)",
        h("i", {class: "k-cancel"}), num(sum(c.cancelled)) + " cancelled")),
    h("div", {class: "tabs chart-choose", "data-choose": "window"},
      Object.keys(WINDOWS).map((k) => choose("window", k, k, k === c.window))),
    row("queue", "Queue", c.queues),
    row("kind", "Kind", c.kinds),
    chart(c, w));
}

// One bar per bucket, oldest left: completed (blue) with failed (red) on top.
function chart(c, w) {
  const n = c.buckets, W = n * 10, H = 100;
  const max = Math.max(1, ...c.completed.map((done, i) => done + c.failed[i]));
  const el = svg("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "chart",
    role: "img", "aria-label": "completed and failed jobs: " + w.title});
  for (const frac of [0.5, 1]) {
    el.append(svg("line", {x1: 0, x2: W, y1: H - frac * H, y2: H - frac * H, class: "grid"}));
  }
  el.append(svg("line", {x1: 0, x2: W, y1: H, y2: H, class: "base"}));
  c.completed.forEach((done, i) => {
    const bad = c.failed[i];
    if (done + bad === 0) return;
    const g = svg("g", {});
    const title = svg("title", {});
    const ago = n - 1 - i;
    title.textContent = `${w.bucket(ago)}: ${done} completed, ${bad} failed, ${c.cancelled[i]} cancelled`;
    g.append(title);
    const hd = (done / max) * H, hb = (bad / max) * H;
    if (done) g.append(svg("rect", {x: i * 10 + 1, y: H - hd, width: 8, height: hd, class: "bar-done"}));
    if (bad) g.append(svg("rect", {x: i * 10 + 1, y: H - hd - hb, width: 8, height: hb, class: "bar-dead"}));
    el.append(g);
  });
  return h("div", {class: "chart-wrap"},
    h("div", {class: "chart-scale"}, h("span", {}, num(max) + w.unit), h("span", {}, num(Math.round(max / 2)))),
    el,
    h("div", {class: "chart-axis"}, w.axis.map((a) => h("span", {}, a))));
}

function queuesTable(queues) {
  if (queues.length === 0) {
    return h("p", {class: "empty"}, "No queues yet: nothing enqueued, nothing in history.");
  }
  const q = encodeURIComponent;
  const count = (row, state, key) => {
    const n = row[key || state];
    return h("td", {class: "num" + (n === 0 ? " zero" : "")},
      link(`/jobs?state=${state}&queue=${q(row.queue)}`, num(n)));
  };
  return h("table", {class: "grid-table"},
    h("thead", {}, h("tr", {},
      h("th", {}, "Queue"), h("th", {class: "num"}, "Available"),
      h("th", {class: "num"}, "Running"), h("th", {class: "num"}, "Scheduled"),
      h("th", {class: "num"}, "Retrying"),
      h("th", {class: "num", title: "Waiting for their dependencies"}, "Pending"),
      h("th", {class: "num"}, "Dead"),
      h("th", {class: "num"}, "Done 1h"), h("th", {class: "num"}, "Failed 1h"),
      h("th", {class: "num"}, "Per min"),
      h("th", {class: "num", title: "How long the first available job (lowest id) has been due"},
        "Oldest available"), h("th", {}, "Status"),
      READ_ONLY ? null : h("th", {}, ""))),
    h("tbody", {}, queues.map((row) => {
      const age = row.oldest_available_secs;
      return h("tr", {"data-queue": row.queue},
        h("td", {class: "name"}, link(`/jobs?queue=${q(row.queue)}`, row.queue)),
        count(row, "available"), count(row, "running"), count(row, "scheduled"),
        count(row, "retrying"), count(row, "pending"),
        h("td", {class: "num" + (row.dead ? " bad" : " zero")},
          link(`/dead?queue=${q(row.queue)}`, num(row.dead))),
        h("td", {class: "num"}, num(row.completed_last_hour)),
        h("td", {class: "num" + (row.failed_last_hour ? " bad-text" : " zero-text")},
          num(row.failed_last_hour)),
        h("td", {class: "num"}, num(row.completed_last_minute)),
        h("td", {class: "num" + (age > 300 ? " warn" : "")}, age === null ? "—" : duration(age)),
        h("td", {}, row.paused ? h("span", {class: "badge paused"}, "paused")
          : h("span", {class: "badge s-running"}, "active"),
          (row.unhandled || []).length === 0 ? null : " ",
          (row.unhandled || []).length === 0 ? null : link("/workers",
            h("span", {class: "badge no-worker",
              title: "due jobs no live worker handles: " +
                row.unhandled.map((u) => u.kind + " " + u.due).join(", ")},
            "no worker: " + row.unhandled.map((u) => u.kind).join(", ")))),
        READ_ONLY ? null : h("td", {class: "actions"}, row.paused
          ? button("Resume", () => act(`Resume queue ${row.queue}? Workers lease from it again.`,
            "Resume", `/api/queues/${q(row.queue)}/resume`))
          : button("Pause", () => act(`Pause queue ${row.queue}? Workers lease nothing from it ` +
            "until it is resumed; running jobs finish.", "Pause",
          `/api/queues/${q(row.queue)}/pause`))));
    })));
}

// FLOW CONTROL: the overview's "Schedules and limits" section, shown when
// /api/overview returns a non-null `flow_control` (wired by the lead once the
// flow-control issue lands: periodic schedules with next and last tick, each
// queue's limits).
function renderFlowControl(flow) {
  if (!flow) return null;
  const schedules = flow.schedules.length === 0 ? h("p", {class: "muted"}, "No periodic schedules.")
    : h("table", {class: "grid-table"},
      h("thead", {}, h("tr", {}, h("th", {}, "Schedule"), h("th", {}, "Expression"),
        h("th", {}, "Last tick"), h("th", {}, "Next tick"))),
      h("tbody", {}, flow.schedules.map((s) => h("tr", {},
        h("td", {class: "mono"}, s.name), h("td", {class: "mono"}, s.expression),
        h("td", {class: "nowrap"}, stamp(s.last_tick)), h("td", {class: "nowrap"}, stamp(s.next_tick))))));
  const limits = flow.limits.length === 0 ? h("p", {class: "muted"}, "No queue has limits.")
    : h("table", {class: "grid-table"},
      h("thead", {}, h("tr", {}, h("th", {}, "Queue"), h("th", {class: "num"}, "Concurrency"),
        h("th", {class: "num"}, "Rate"))),
      h("tbody", {}, flow.limits.map((l) => h("tr", {},
        h("td", {}, link("/jobs?queue=" + encodeURIComponent(l.queue), l.queue)),
        h("td", {class: "num"}, l.concurrency === null ? "—" : "at most " + num(l.concurrency) + " running"),
        h("td", {class: "num"}, l.rate === null ? "—" : l.rate.text)))));
  return h("section", {class: "panel", id: "flow-control"},
    h("div", {class: "panel-head"}, h("h2", {}, "Schedules and limits")),
    h("h3", {}, "Periodic schedules"), schedules,
    h("h3", {}, "Queue limits"), limits);
}

// ---- workers ----------------------------------------------------------------

// The live workers (each registered in the database by a running Worker,
// refreshed by its heartbeat) with the jobs each holds, and the due jobs no
// live worker handles.
async function workersPage() {
  const data = await api("/api/workers");
  const q = encodeURIComponent;
  const list = data.workers.length === 0
    ? h("p", {class: "empty"}, "No live workers: none started, or every one shut down " +
      "(a crashed worker counts as gone three heartbeat intervals after its last heartbeat).")
    : h("table", {class: "grid-table", id: "workers"},
      h("thead", {}, h("tr", {},
        h("th", {}, "Worker"), h("th", {}, "Host"), h("th", {class: "num"}, "Pid"),
        h("th", {}, "Queues"), h("th", {}, "Kinds"), h("th", {class: "num"}, "Threads"),
        h("th", {}, "Running"), h("th", {}, "Started"), h("th", {}, "Heartbeat"))),
      h("tbody", {}, data.workers.map((w) => h("tr", {"data-worker": w.id},
        h("td", {class: "mono nowrap"}, w.id),
        h("td", {class: "mono"}, w.host),
        h("td", {class: "num"}, String(w.pid)),
        h("td", {}, w.queues.flatMap((name, i) => [i ? ", " : null,
          link(`/jobs?queue=${q(name)}`, name)])),
        h("td", {class: "mono"}, w.kinds.join(", ")),
        h("td", {class: "num"}, num(w.concurrency)),
        h("td", {}, w.running.length === 0 ? h("span", {class: "muted"}, "idle")
          : w.running.flatMap((j, i) => [i ? " " : null,
            link(`/jobs/${j.id}`, h("span", {class: "badge s-running", title: j.queue + " · " + j.kind},
              "#" + j.id + " " + j.kind))])),
        h("td", {class: "nowrap"}, h("span", {title: w.started_at}, ago(w.started_at))),
        h("td", {class: "nowrap"}, h("span", {title: "counts as gone " + ago(w.expires_at)},
          ago(w.heartbeat_at)))))));
  const unhandled = data.unhandled.length === 0
    ? h("p", {class: "muted"}, "Every due job has a live worker for its queue and kind.")
    : h("table", {class: "grid-table", id: "unhandled"},
      h("thead", {}, h("tr", {}, h("th", {}, "Queue"), h("th", {}, "Kind"),
        h("th", {class: "num"}, "Due"))),
      h("tbody", {}, data.unhandled.map((u) => h("tr", {},
        h("td", {}, link(`/jobs?queue=${q(u.queue)}`, u.queue)),
        h("td", {class: "mono"}, u.kind),
        h("td", {class: "num warn"},
          link(`/jobs?state=available&queue=${q(u.queue)}&kind=${q(u.kind)}`, num(u.due)))))));
  const running = data.workers.reduce((n, w) => n + w.running.length, 0);
  return [h("h1", {}, "Workers"),
    h("section", {class: "panel"},
      h("div", {class: "panel-head"}, h("h2", {}, "Live workers"),
        h("span", {class: "muted"}, data.workers.length + " worker(s) · " + running + " job(s) held")),
      list),
    h("section", {class: "panel"},
      h("div", {class: "panel-head"}, h("h2", {}, "Due jobs no live worker handles"),
        h("span", {class: "muted"}, "they wait until a worker with a handler for the kind serves the queue")),
      unhandled)];
}

// ---- jobs list --------------------------------------------------------------

async function jobs(params) {
  if (params.get("search")) {
    const key = params.get("search");
    const found = await api("/api/jobs?search=" + encodeURIComponent(key));
    return [h("h1", {}, "Jobs with unique key ", h("span", {class: "mono"}, key)),
      found.jobs.length ? jobsTable(found, params, "/jobs")
        : h("p", {class: "empty"}, "No live job, and no finished job in recent history, holds this key.")];
  }
  const state = params.get("state") || "all";
  const query = new URLSearchParams();
  for (const k of ["state", "queue", "kind", "after"]) if (params.get(k)) query.set(k, params.get(k));
  const data = await api("/api/jobs?" + query);
  const tabs = h("div", {class: "tabs"}, ["all", ...STATES].map((s) => {
    const p = new URLSearchParams(query);
    p.delete("after");
    if (s === "all") p.delete("state"); else p.set("state", s);
    return link("/jobs?" + p, h("span", {class: "tab" + (s === state ? " active" : "")}, s));
  }));
  return [h("h1", {}, "Jobs"), tabs, filters(params, "/jobs"),
    bulkBar(state, params), jobsTable(data, params, "/jobs")];
}

function filters(params, base) {
  const submit = (e) => {
    e.preventDefault();
    const p = new URLSearchParams(location.search);
    p.delete("after");
    for (const k of ["queue", "kind"]) {
      const v = e.target[k].value.trim();
      if (v) p.set(k, v); else p.delete(k);
    }
    go(base + "?" + p);
  };
  return h("form", {class: "filters", onsubmit: submit},
    h("label", {}, "Queue ", h("input", {name: "queue", value: params.get("queue") || "",
      placeholder: "any"})),
    h("label", {}, "Kind ", h("input", {name: "kind", value: params.get("kind") || "",
      placeholder: "any"})),
    h("button", {class: "btn", type: "submit"}, "Filter"),
    (params.get("queue") || params.get("kind")) ? link(base + (params.get("state") ?
      "?state=" + params.get("state") : ""), "clear") : null);
}

// "dead jobs in queue emails of kind send_email": what a bulk action selects.
function selection(state, params) {
  const parts = [state + " jobs"];
  if (params.get("queue")) parts.push("in queue " + params.get("queue"));
  if (params.get("kind")) parts.push("of kind " + params.get("kind"));
  return parts.join(" ");
}

function bulkBar(state, params) {
  if (READ_ONLY || state === "all") return null;
  const what = selection(state, params);
  const body = (action) => ({action, state, queue: params.get("queue") || null,
    kind: params.get("kind") || null});
  const bulk = (action, verb) => button(verb + " all", () =>
    act(`${verb} all ${what}?`, verb + " all", "/api/bulk", body(action)),
  action === "delete" ? "danger" : "");
  const waiting = ["available", "scheduled", "retrying"].includes(state);
  return h("div", {class: "bulk"}, h("span", {class: "muted"}, "All " + what + ":"),
    ["dead", "discarded", "cancelled"].includes(state) ? bulk("retry", "Retry") : null,
    waiting || state === "running" ? bulk("cancel", "Cancel") : null,
    waiting ? bulk("discard", "Discard") : null,
    bulk("delete", "Delete"));
}

function jobsTable(data, params, base) {
  if (data.jobs.length === 0) {
    return h("p", {class: "empty"}, params.get("after") ? "No more jobs." : "No jobs match.");
  }
  const table = h("table", {class: "grid-table jobs"},
    h("thead", {}, h("tr", {}, h("th", {class: "num"}, "ID"), h("th", {}, "State"),
      h("th", {}, "Queue"), h("th", {}, "Kind"), h("th", {class: "num"}, "Pri"),
      h("th", {class: "num"}, "Tries"), h("th", {}, "When"), h("th", {}, "Last error"))),
    h("tbody", {}, data.jobs.map((j) => h("tr", {"data-id": j.id},
      h("td", {class: "num"}, link("/jobs/" + j.id, "#" + j.id)),
      h("td", {}, badge(j.state)),
      h("td", {}, j.queue), h("td", {class: "mono"}, j.kind),
      h("td", {class: "num"}, j.priority),
      h("td", {class: "num"}, `${j.attempts}/${j.max_attempts}`),
      h("td", {class: "nowrap", title: j.finished_at || j.available_at},
        j.finished_at ? "finished " + ago(j.finished_at) : "due " + ago(j.available_at)),
      h("td", {class: "error-cell"}, j.last_error || "")))));
  const p = new URLSearchParams(location.search);
  const first = new URLSearchParams(p);
  first.delete("after");
  const pager = h("div", {class: "pager"},
    params.get("after") ? link(base + "?" + first, "← First page") : h("span", {}),
    data.next_after !== null ? link(base + "?" + (p.set("after", data.next_after), p),
      "Next page →") : h("span", {class: "muted"}, "end of list"));
  return h("div", {}, table, pager);
}

// ---- dead letter ------------------------------------------------------------

async function dead(params) {
  const query = new URLSearchParams({state: "dead"});
  for (const k of ["queue", "kind", "after"]) if (params.get(k)) query.set(k, params.get(k));
  const [data, ov] = await Promise.all([api("/api/jobs?" + query), api("/api/overview")]);
  const total = ov.queues.filter((q) => !params.get("queue") || q.queue === params.get("queue"))
    .reduce((n, q) => n + q.dead, 0);
  const p = new URLSearchParams(params);
  p.set("state", "dead");
  const body = (action) => ({action, state: "dead", queue: params.get("queue") || null,
    kind: params.get("kind") || null});
  const what = selection("dead", params);
  const bar = READ_ONLY || data.jobs.length === 0 ? null : h("div", {class: "bulk"},
    h("span", {class: "muted"}, "All " + what + ":"),
    button("Retry all", () => act(`Retry all ${what}? They become available now.`,
      "Retry all", "/api/bulk", body("retry"))),
    button("Delete all", () => act(`Delete all ${what} for good?`, "Delete all",
      "/api/bulk", body("delete")), "danger"));
  return [h("h1", {}, "Dead letter ", h("span", {class: "count"}, num(total))),
    h("p", {class: "muted"}, "Jobs that ran out of attempts. Retry one to run it again, " +
      "or open it to read every attempt's error."),
    filters(params, "/dead"), bar, deadTable(data, params)];
}

function deadTable(data, params) {
  if (data.jobs.length === 0) {
    return h("p", {class: "empty"}, "The dead letter is empty.");
  }
  const rows = data.jobs.map((j) => h("tr", {"data-id": j.id},
    h("td", {class: "num"}, link("/jobs/" + j.id, "#" + j.id)),
    h("td", {}, j.queue), h("td", {class: "mono"}, j.kind),
    h("td", {class: "num"}, `${j.attempts}/${j.max_attempts}`),
    h("td", {class: "nowrap", title: j.finished_at}, ago(j.finished_at)),
    h("td", {class: "error-cell"}, j.last_error || ""),
    READ_ONLY ? null : h("td", {class: "actions"},
      button("Retry", () => act(`Retry job ${j.id}? It becomes available now.`, "Retry",
        `/api/jobs/${j.id}/retry`)))));
  const p = new URLSearchParams(location.search);
  const first = new URLSearchParams(p);
  first.delete("after");
  return h("div", {},
    h("table", {class: "grid-table jobs"},
      h("thead", {}, h("tr", {}, h("th", {class: "num"}, "ID"), h("th", {}, "Queue"),
        h("th", {}, "Kind"), h("th", {class: "num"}, "Tries"), h("th", {}, "Died"),
        h("th", {}, "Last error"), READ_ONLY ? null : h("th", {}, ""))),
      h("tbody", {}, rows)),
    h("div", {class: "pager"},
      params.get("after") ? link("/dead?" + first, "← First page") : h("span", {}),
      data.next_after !== null ? link("/dead?" + (p.set("after", data.next_after), p),
        "Next page →") : h("span", {class: "muted"}, "end of list")));
}

// ---- one job ----------------------------------------------------------------

async function job(id) {
  let data;
  try {
    data = await api("/api/jobs/" + id);
  } catch (e) {
    if (e.status === 404) return [h("h1", {}, "Job " + id), h("p", {class: "empty"}, e.message)];
    throw e;
  }
  const j = data.job;
  const path = `/api/jobs/${j.id}/`;
  const waiting = ["available", "scheduled", "retrying"].includes(j.state);
  const finished = ["completed", "discarded", "cancelled", "dead"].includes(j.state);
  const actions = READ_ONLY ? null : h("div", {class: "actions-bar"},
    ["dead", "discarded", "cancelled"].includes(j.state) ? button("Retry", () =>
      act(`Retry job ${j.id}? It becomes available now.`, "Retry", path + "retry"), "primary") : null,
    ["scheduled", "retrying"].includes(j.state) ? button("Run now", () =>
      act(`Make job ${j.id} due now?`, "Run now", path + "run-now"), "primary") : null,
    !finished ? button("Cancel", () =>
      act(`Cancel job ${j.id}?` + (j.state === "running" ? " Its handler is asked to stop." : ""),
        "Cancel job", path + "cancel")) : null,
    waiting ? button("Discard", () =>
      act(`Discard job ${j.id}? It will not run.`, "Discard", path + "discard")) : null,
    button("Delete", () => act(`Delete job ${j.id} for good?`, "Delete", path + "delete", {},
      () => go("/jobs")), "danger"));
  const field = (name, value) => value === null || value === undefined || value === "" ? null
    : [h("dt", {}, name), h("dd", {}, value)];
  const details = h("dl", {class: "details"},
    field("Queue", link("/jobs?queue=" + encodeURIComponent(j.queue), j.queue)),
    field("Kind", h("span", {class: "mono"}, j.kind)),
    field("Priority", String(j.priority)),
    field("Unique key", j.unique_key),
    field("Sequence", j.sequence && h("span", {class: "mono"}, j.sequence)),
    field("Attempts", `${j.attempts} of ${j.max_attempts}`),
    field("Created", stamp(j.created_at)),
    field(finished ? "Was due" : "Due", stamp(j.available_at)),
    field("First started", j.started_at && stamp(j.started_at)),
    field("Lease until", j.lease_until && stamp(j.lease_until)),
    field("Worker", j.worker && h("span", {class: "mono"}, j.worker)),
    field("Cancel", j.cancel_requested ? "requested" : null),
    field("Finished", j.finished_at && stamp(j.finished_at)),
    field("Updated", stamp(j.updated_at)));
  const out = [
    h("div", {class: "job-head"}, h("h1", {}, "Job #" + j.id), badge(j.state),
      h("span", {class: "mono muted"}, j.kind)),
    actions,
    waiting && !READ_ONLY ? editForm(j) : null,
    h("div", {class: "job-grid"},
      h("section", {class: "panel"}, h("h2", {}, "Details"), details),
      h("section", {class: "panel"}, h("h2", {}, "Payload"),
        h("pre", {class: "code", id: "payload"}, JSON.stringify(j.payload, null, 2)),
        j.result !== null ? [h("h2", {}, "Result"),
          h("pre", {class: "code"}, JSON.stringify(j.result, null, 2))] : null)),
  ];
  const links = renderLinks(data.links);
  if (links) out.push(links);
  const progress = renderProgress(data.progress);
  if (progress) out.push(progress);
  out.push(h("section", {class: "panel"},
    h("h2", {}, "Errors ", h("span", {class: "count"}, String(j.errors.length))),
    j.errors.length === 0 ? h("p", {class: "muted"}, "No attempt has failed.")
      : h("table", {class: "grid-table errors"},
        h("thead", {}, h("tr", {}, h("th", {class: "num"}, "Attempt"), h("th", {}, "At"),
          h("th", {}, "Error"))),
        h("tbody", {}, j.errors.slice().reverse().map((e) => h("tr", {},
          h("td", {class: "num"}, e.attempt), h("td", {class: "nowrap"}, stamp(e.at)),
          h("td", {}, h("pre", {class: "error-text"}, e.message))))))));
  return out;
}

function editForm(j) {
  const submit = (e) => {
    e.preventDefault();
    const priority = e.target.priority.value.trim();
    const runAt = e.target.run_at.value.trim();
    const body = {};
    if (priority !== "" && priority !== String(j.priority)) body.priority = Number(priority);
    if (runAt) body.run_at = runAt;
    if (Object.keys(body).length === 0) return flash("Change the priority or the run time first", false);
    act(`Update job ${j.id}?`, "Update", `/api/jobs/${j.id}/update`, body);
  };
  return h("form", {class: "filters edit", onsubmit: submit},
    h("label", {}, "Priority ", h("input", {name: "priority", value: j.priority, size: 6,
      inputmode: "numeric"})),
    h("label", {}, "Run at ", h("input", {name: "run_at", placeholder: "+10m or 2030-01-01T09:00:00Z",
      size: 28})),
    h("button", {class: "btn", type: "submit"}, "Update"));
}

// FLOW CONTROL: a running job's progress, shown when /api/jobs/ID returns a
// non-null `progress` (wired by the lead once the flow-control issue lands).
// The share done, when the handler reported one in a shape people use:
// {done, of} or {done, total}, {percent}, or a bare number 0..1.
function progressShare(p) {
  const n = (v) => typeof v === "number" && isFinite(v);
  if (n(p) && p >= 0 && p <= 1) return p;
  if (p && typeof p === "object") {
    const of = n(p.of) ? p.of : p.total;
    if (n(p.done) && n(of) && of > 0) return Math.min(1, Math.max(0, p.done / of));
    if (n(p.percent)) return Math.min(1, Math.max(0, p.percent / 100));
  }
  return null;
}

function renderProgress(progress) {
  if (progress === null || progress === undefined) return null;
  const share = progressShare(progress);
  let bar = null;
  if (share !== null) {
    bar = svg("svg", {viewBox: "0 0 100 4", preserveAspectRatio: "none", class: "progress-bar",
      role: "img", "aria-label": `${Math.round(share * 100)}% done`});
    bar.append(svg("rect", {x: 0, y: 0, width: 100, height: 4, class: "progress-track"}));
    bar.append(svg("rect", {x: 0, y: 0, width: share * 100, height: 4, class: "progress-done"}));
  }
  return h("section", {class: "panel", id: "progress"},
    h("div", {class: "panel-head"}, h("h2", {}, "Progress"),
      share === null ? null : h("span", {class: "muted"}, `${Math.round(share * 100)}%`)),
    bar,
    h("pre", {class: "code"}, JSON.stringify(progress, null, 2)));
}

route();
