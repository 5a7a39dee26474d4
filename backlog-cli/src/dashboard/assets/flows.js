// backlog dashboard: the workflow page, the batch page, and the job page's
// "Workflow and dependencies" panel. Loaded before app.js, whose helpers (h,
// link, badge, api, act, button, stamp, num) these call once the page runs;
// job data is written as text, never HTML, as there.
"use strict";

// Each step's layer: 0 for a step that comes after none, else one more than
// the deepest step it comes after. Steps arrive in enqueue order, each after
// what it depends on, so one pass suffices.
function layers(steps) {
  const layerOf = new Map();
  for (const s of steps) {
    const deps = s.after.map((d) => layerOf.get(d.job_id)).filter((l) => l !== undefined);
    layerOf.set(s.job_id, deps.length ? Math.max(...deps) + 1 : 0);
  }
  const out = [];
  for (const s of steps) {
    const l = layerOf.get(s.job_id);
    (out[l] = out[l] || []).push(s);
  }
  return out;
}

const depName = (d) => d.step || "job " + d.job_id;

// The steps in columns, left to right: a step's column is after every
// column holding a step it comes after.
function layeredView(steps) {
  return h("div", {class: "layers", id: "layers"}, layers(steps).map((layer, i) =>
    h("div", {class: "layer"},
      h("div", {class: "layer-head"}, i === 0 ? "first" : "then"),
      layer.map((s) => h("div", {class: "step", "data-state": s.state || "deleted", "data-step": s.step},
        h("div", {class: "step-name"}, link("/jobs/" + s.job_id, s.step)),
        h("div", {}, badge(s.state || "deleted"), " ", h("span", {class: "mono muted"}, s.kind || "")),
        s.after.length === 0 ? null : h("div", {class: "step-after muted"},
          "after ", s.after.map(depName).join(", ")),
        s.waiting_on.length === 0 ? null : h("div", {class: "step-waiting"},
          "waiting on ", s.waiting_on.join(", ")))))));
}

async function workflowPage(which) {
  let data;
  try {
    data = await api("/api/workflows/" + encodeURIComponent(which));
  } catch (e) {
    if (e.status === 404) return [h("h1", {}, "Workflow " + which), h("p", {class: "empty"}, e.message)];
    throw e;
  }
  const w = data.workflow;
  const done = w.steps.filter((s) => ["completed", "discarded", "cancelled", "dead"].includes(s.state)).length;
  const open = w.steps.length - done;
  const actions = READ_ONLY || open === 0 ? null : h("div", {class: "actions-bar"},
    button("Cancel workflow", () => act(`Cancel workflow ${w.name}? Its ${open} step(s) not ` +
      "finished are cancelled; running ones are asked to stop.", "Cancel workflow",
    `/api/workflows/${w.id}/cancel`), "danger"));
  const table = h("table", {class: "grid-table", id: "steps"},
    h("thead", {}, h("tr", {}, h("th", {}, "Step"), h("th", {class: "num"}, "Job"),
      h("th", {}, "Kind"), h("th", {}, "State"), h("th", {class: "num"}, "Tries"),
      h("th", {}, "After"), h("th", {}, "Waiting on"))),
    h("tbody", {}, w.steps.map((s) => h("tr", {"data-step": s.step},
      h("td", {class: "name"}, s.step),
      h("td", {class: "num"}, link("/jobs/" + s.job_id, "#" + s.job_id)),
      h("td", {class: "mono"}, s.kind || ""),
      h("td", {}, badge(s.state || "deleted")),
      h("td", {class: "num"}, s.attempts === null ? "" : String(s.attempts)),
      h("td", {}, s.after.length ? s.after.map(depName).join(", ") : h("span", {class: "muted"}, "—")),
      h("td", {}, s.waiting_on.length ? s.waiting_on.join(", ") : h("span", {class: "muted"}, "—"))))));
  return [
    h("div", {class: "job-head"}, h("h1", {}, "Workflow ", h("span", {class: "mono"}, w.name)),
      h("span", {class: "badge " + (w.finished ? "s-completed" : "s-running")},
        w.finished ? "finished" : "running"),
      h("span", {class: "muted"}, "#" + w.id + " · created ", stamp(w.created_at))),
    actions,
    h("section", {class: "panel"},
      h("div", {class: "panel-head"}, h("h2", {}, "Steps"),
        h("span", {class: "muted"}, `${done} of ${w.steps.length} finished`)),
      layeredView(w.steps)),
    h("section", {class: "panel"}, h("h2", {}, "Every step"), table),
  ];
}

async function batchPage(id) {
  let data;
  try {
    data = await api("/api/batches/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status === 404) return [h("h1", {}, "Batch " + id), h("p", {class: "empty"}, e.message)];
    throw e;
  }
  const b = data.batch;
  const callback = (name, c) => [h("dt", {}, name), h("dd", {}, c.enqueued
    ? [link("/jobs/" + c.job_id, "job #" + c.job_id), " ", c.state ? badge(c.state)
      : h("span", {class: "muted"}, "deleted since")]
    : h("span", {class: "muted"}, "not enqueued: " + c.why))];
  const counts = h("div", {class: "cards", id: "batch-counts"},
    ["total", "pending", "completed", "discarded", "cancelled", "dead"].map((k) =>
      h("div", {class: "card" + (["dead", "discarded"].includes(k) && b[k] > 0 ? " bad" : "")},
        h("div", {class: "card-label"}, k),
        h("div", {class: "card-value"}, num(b[k])))));
  return [
    h("div", {class: "job-head"}, h("h1", {}, "Batch #" + b.id),
      h("span", {class: "badge " + (b.sealed ? "s-completed" : "s-scheduled")}, b.sealed ? "sealed" : "open"),
      b.finished ? h("span", {class: "badge s-running"}, "finished") : null),
    counts,
    h("section", {class: "panel"}, h("h2", {}, "Callbacks"),
      h("dl", {class: "details", id: "callbacks"},
        callback("On complete", b.on_complete),
        callback("On success", b.on_success),
        [h("dt", {}, "Created"), h("dd", {}, stamp(b.created_at))],
        b.finished_at ? [h("dt", {}, "Finished"), h("dd", {}, stamp(b.finished_at))] : null),
      b.sealed ? null : h("p", {class: "muted"},
        "Open: members may still join, and its callbacks cannot fire until the application seals it.")),
  ];
}

// The job page's panel: its workflow and step, its batch, what it depends
// on and what depends on it; null for a job with none.
function renderLinks(links) {
  if (!links) return null;
  const has = links.workflow || links.batch !== null || links.dependencies.length ||
    links.dependents.length;
  if (!has) return null;
  const field = (name, value) => [h("dt", {}, name), h("dd", {}, value)];
  return h("section", {class: "panel", id: "links"}, h("h2", {}, "Workflow and dependencies"),
    h("dl", {class: "details"},
      links.workflow ? field("Workflow", [link("/workflows/" + links.workflow.id, links.workflow.name),
        " · step ", h("span", {class: "mono"}, links.workflow.step)]) : null,
      links.batch !== null ? field("Batch", link("/batches/" + links.batch, "batch #" + links.batch)) : null,
      links.dependencies.length ? field("Depends on", links.dependencies.flatMap((d, i) => [i ? ", " : null,
        link("/jobs/" + d.job_id, "#" + d.job_id + (d.step ? " " + d.step : "")), " ",
        badge(d.status || "not finished")])) : null,
      links.dependents.length ? field("Dependents", links.dependents.flatMap((id, i) =>
        [i ? ", " : null, link("/jobs/" + id, "#" + id)])) : null));
}
