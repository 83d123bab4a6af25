// chronoq console: fills the page named by <body data-page> from the JSON API, refreshes it.
// Data is inserted as text (never as HTML). State-changing calls send JSON with the CSRF token.
"use strict";

const body = document.body;
const PAGE = body.dataset.page;
const REFRESH_MS = Math.max(500, parseFloat(body.dataset.refresh || "2") * 1000);
const CSRF = document.querySelector("meta[name=csrf-token]").content;
const NAMESPACES = JSON.parse(body.dataset.namespaces || '["default"]');
const params = new URLSearchParams(location.search);
const main = document.getElementById("main");
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777",
  "#65a30d", "#475569", "#ea580c"];

// ------------------------------------------------------------------ helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key.startsWith("data-") || key.startsWith("aria-") || key === "role") {
      node.setAttribute(key, String(value));  // booleans as "true" / "false"
    } else if (value === false) continue;
    else if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node) node[key] = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function namespace() {
  return document.getElementById("namespace").value.trim() || NAMESPACES[0];
}

function link(path, extra) {
  const q = new URLSearchParams({ namespace: namespace(), ...(extra || {}) });
  return `${path}?${q}`;
}

class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

async function api(path, query) {
  const q = new URLSearchParams(query || {});
  const response = await fetch(`${path}?${q}`, { headers: { Accept: "application/json" } });
  return answer(response);
}

async function post(path, payload) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": CSRF },
    body: JSON.stringify(payload),
  });
  return answer(response);
}

async function answer(response) {
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const message = (data && data.error) || `${response.status} ${response.statusText}`;
    throw new ApiError(message, response.status);
  }
  return data;
}

function banner(message, kind) {
  const box = document.getElementById("banner");
  if (!message) { box.hidden = true; box.textContent = ""; box.dataset.kind = ""; return; }
  box.hidden = false;
  box.dataset.kind = kind || "error";
  box.textContent = message;
}

function explain(error) {
  if (error instanceof ApiError && error.status === 403) {
    return `Refused: ${error.message} (the console's token may not reach namespace ` +
      `"${namespace()}")`;
  }
  if (error instanceof ApiError && error.status === 503) {
    return `No node answered: ${error.message}`;
  }
  return error.message || String(error);
}

function fmtTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function fmtNum(value, digits) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits ?? 1 });
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 90) return `${seconds.toFixed(1)} s`;
  if (seconds < 5400) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function table(headers, rows, attrs) {
  return el("div", { class: "scroll" },
    el("table", attrs || {},
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows)));
}

function replace(id, node) {
  const old = document.getElementById(id);
  node.id = id;
  if (old) old.replaceWith(node); else main.append(node);
  return node;
}

function section(title, id, ...children) {
  return el("section", { class: "card", id }, el("h2", { text: title }), children);
}

// A refresh loop that waits for each load, skips hidden tabs and can be paused (dialogs).
const refresher = { load: null, timer: null, paused: false };
function every(load, ms) {
  refresher.load = load;
  const tick = async () => {
    if (!document.hidden && !refresher.paused) {
      try { await load(); } catch (error) { banner(explain(error)); }
    }
    refresher.timer = setTimeout(tick, ms);
  };
  tick();
}
async function reload() {
  if (refresher.load) {
    try { await refresher.load(); } catch (error) { banner(explain(error)); }
  }
}

// A modal confirmation; resolves true when confirmed.
function confirmDialog(text) {
  return new Promise((resolve) => {
    refresher.paused = true;
    const dialog = el("dialog", { id: "confirm", class: "confirm" },
      el("p", { text }),
      el("div", { class: "buttons" },
        el("button", { id: "confirm-no", type: "button", text: "Cancel" }),
        el("button", { id: "confirm-yes", type: "button", class: "danger", text: "Confirm" })));
    const done = (value) => {
      dialog.close(); dialog.remove(); refresher.paused = false; resolve(value);
    };
    dialog.querySelector("#confirm-yes").addEventListener("click", () => done(true));
    dialog.querySelector("#confirm-no").addEventListener("click", () => done(false));
    dialog.addEventListener("cancel", (e) => { e.preventDefault(); done(false); });
    body.append(dialog);
    dialog.showModal();
  });
}

function summarize(results, verb) {
  const ok = results.filter((r) => r.ok).length;
  const refused = results.filter((r) => !r.ok);
  let text = `${verb} ${ok} of ${results.length}`;
  if (refused.length) text += `; refused: ${refused.slice(0, 3).map((r) => r.error).join("; ")}`;
  return { text, ok, refused: refused.length };
}

function resultLine(id, summary) {
  return el("p", { id, class: "result", "data-ok": summary.ok, "data-refused": summary.refused,
    text: summary.text });
}

// ------------------------------------------------------------------ charts

const charts = {};
function chart(id, title, opts, data) {
  const holder = document.getElementById(id);
  const width = Math.max(240, holder.clientWidth - 4);
  if (charts[id] && charts[id].root.isConnected) {
    charts[id].setData(data);
    if (Math.abs(charts[id].width - width) > 4) charts[id].setSize({ width, height: 200 });
    return;
  }
  holder.textContent = "";
  charts[id] = new uPlot({ title, width, height: 200, ...opts }, data, holder);
}
window.addEventListener("resize", () => {
  for (const [id, c] of Object.entries(charts)) {
    const holder = document.getElementById(id);
    if (holder) c.setSize({ width: Math.max(240, holder.clientWidth - 4), height: 200 });
  }
});

// ------------------------------------------------------------------ overview

function ownerColor(owners, owner) {
  const index = owners.indexOf(owner);
  return index < 0 ? "#9ca3af" : COLORS[index % COLORS.length];
}

function overviewSkeleton() {
  main.append(
    el("section", { class: "cards", id: "facts" }),
    section("Nodes", "nodes-card", el("div", { id: "nodes" })),
    section("Members", "members-card", el("div", { id: "members" })),
    el("div", { class: "charts" },
      section("Pending tasks, coming buckets", "pending-card", el("div", { id: "chart-pending",
        class: "chart" })),
      section("Fired per second", "fired-card", el("div", { id: "chart-fired", class: "chart" })),
      section("Firing lateness (worst node)", "lateness-card",
        el("div", { id: "chart-lateness", class: "chart" }))),
    section("Partitions by owner", "partitions-card", el("div", { id: "owners" }),
      el("div", { id: "partition-grid", class: "grid" })));
}

async function loadOverview() {
  const o = await api("/api/overview");
  banner(o.ok ? "" : (o.error || "no node answers: showing the last known state"), "error");
  const up = o.addresses.filter((a) => a.reachable).length;
  const conn = document.getElementById("conn");
  conn.textContent = `${up}/${o.addresses.length} nodes answer`;
  conn.dataset.state = up === o.addresses.length ? "ok" : up ? "degraded" : "down";
  body.dataset.ready = "true";
  const facts = document.getElementById("facts");
  facts.textContent = "";
  for (const [label, value, id] of [
    ["cluster", o.cluster || "–", "fact-cluster"], ["answered by", o.answered_by || "–", "fact-node"],
    ["members", (o.members || []).length, "fact-members"],
    ["partitions", o.partitions ?? "–", "fact-partitions"],
    ["bucket", o.bucket_seconds ? `${o.bucket_seconds} s` : "–", "fact-bucket"],
    ["node time", fmtTime(o.now), "fact-now"]]) {
    facts.append(el("div", { class: "fact", id }, el("span", { text: label }),
      el("strong", { text: value })));
  }
  replace("nodes", table(["address", "node", "answers", "last answer", "error"],
    o.addresses.map((a) => el("tr", { class: a.reachable ? "" : "down", "data-address": a.address,
      "data-reachable": a.reachable },
    el("td", { text: a.address }), el("td", { text: a.node_id || "–" }),
    el("td", { text: a.reachable ? "yes" : "NO" }),
    el("td", { text: a.last_seen ? fmtTime(new Date(a.last_seen * 1000).toISOString()) : "never" }),
    el("td", { class: "error", text: a.error || "" })))));
  const members = o.members || [];
  const owners = members.map((m) => m.node_id);
  const rows = members.map((m) => el("tr", { "data-node": m.node_id,
    "data-owned": m.owned_partitions },
  el("td", {}, el("span", { class: "swatch", style: `background:${ownerColor(owners, m.node_id)}` }),
    m.node_id),
  el("td", { text: m.address }), el("td", { class: "num", text: m.owned_partitions }),
  el("td", { class: "num", text: `${fmtNum(m.lateness_p50_ms)} ms` }),
  el("td", { class: "num", text: `${fmtNum(m.lateness_p99_ms)} ms` }),
  el("td", { class: "num", text: fmtNum(m.fired_per_s) }),
  el("td", { class: "num", text: fmtNum(m.fired_total, 0) })));
  for (const gone of o.gone || []) {
    rows.push(el("tr", { class: "down", "data-node": gone, "data-gone": "true" },
      el("td", { text: gone }), el("td", { colspan: 6, text: "left the cluster" })));
  }
  replace("members", table(["node", "address", "partitions", "lateness p50", "lateness p99",
    "fired/s", "fired"], rows));

  const buckets = o.buckets || [];
  chart("chart-pending", "", {
    scales: { x: { time: true } },
    series: [{}, { label: "pending", stroke: COLORS[0], fill: "rgba(37,99,235,0.3)",
      paths: uPlot.paths.bars({ size: [0.8, 40] }), points: { show: false } }],
    legend: { show: true },
  }, [buckets.map((b) => Date.parse(b.starts_at) / 1000), buckets.map((b) => b.pending)]);
  const s = o.series;
  chart("chart-fired", "", {
    series: [{}, { label: "fired/s", stroke: COLORS[2], width: 2, points: { show: false } }],
  }, [s.at, s.fired_per_s]);
  chart("chart-lateness", "", {
    series: [{}, { label: "p50 ms", stroke: COLORS[0], points: { show: false } },
      { label: "p99 ms", stroke: COLORS[1], points: { show: false } }],
  }, [s.at, s.lateness_p50_ms, s.lateness_p99_ms]);

  const byOwner = new Map();
  for (const p of o.ownership || []) {
    if (!byOwner.has(p.owner)) byOwner.set(p.owner, []);
    byOwner.get(p.owner).push(p);
  }
  replace("owners", table(["owner", "partitions", "fencing tokens"],
    [...byOwner.entries()].sort().map(([owner, parts]) => el("tr", { "data-owner": owner },
      el("td", {}, el("span", { class: "swatch", style: `background:${ownerColor(owners, owner)}` }),
        owner || "(none)"),
      el("td", { class: "num", text: parts.length }),
      el("td", { class: "tokens", text: parts.map((p) => `${p.partition}:${p.fencing_token}`)
        .join(" ") })))));
  const grid = document.getElementById("partition-grid");
  grid.textContent = "";
  for (const p of o.ownership || []) {
    grid.append(el("div", { class: "cell", "data-partition": p.partition, "data-owner": p.owner,
      "data-token": p.fencing_token, title: `partition ${p.partition}: ${p.owner}, token ` +
        `${p.fencing_token}, watermark bucket ${p.watermark_bucket}`,
      style: `background:${ownerColor(owners, p.owner)}` },
    el("b", { text: p.partition }), el("small", { text: `t${p.fencing_token}` })));
  }
}

// ------------------------------------------------------------------ queues

function queuesSkeleton() {
  const queue = el("input", { id: "limit-queue", placeholder: "queue", required: true,
    maxLength: 128 });
  const rate = el("input", { id: "limit-rate", type: "number", min: 0, step: "any",
    placeholder: "tasks/s (0: none)" });
  const burst = el("input", { id: "limit-burst", type: "number", min: 0, step: "any",
    placeholder: "burst (0: rate)" });
  main.append(
    section("Queues", "queues-card", el("p", { id: "queues-note", class: "note" }),
      el("div", { id: "queues" })),
    section("Dispatch limit", "limit-card",
      el("form", { id: "limit-form", class: "row", onsubmit: async (e) => {
        e.preventDefault();
        await setLimit(queue.value, Number(rate.value || 0), Number(burst.value || 0));
      } }, queue, rate, burst, el("button", { type: "submit", text: "Set limit" })),
      el("p", { id: "limit-result", class: "result" })),
    pauseSection());
}

async function setLimit(queue, rate, burst) {
  try {
    await post("/api/queues/limit", { namespace: namespace(), queue, rate, burst });
    document.getElementById("limit-result").textContent =
      rate ? `${queue}: at most ${rate}/s` : `${queue}: no limit`;
    await reload();
  } catch (error) { banner(explain(error)); }
}

async function loadQueues() {
  const q = await api("/api/queues", { namespace: namespace() });
  banner("");
  body.dataset.ready = "true";
  const notes = [q.as_of
    ? `Counts of the tasks not yet final, per state, kept by the partition owners: as of ` +
      `${q.as_of} (${fmtAge(q.staleness_s)} ago).`
    : "No partition has been counted yet."];
  if (q.uncounted_partitions) {
    notes.push(`${q.uncounted_partitions} partitions not counted yet: their tasks are missing.`);
  }
  if (q.truncated) notes.push("More queues exist than are shown (the first 1000, by name).");
  document.getElementById("queues-note").textContent = notes.join(" ");
  replace("queues", table(["queue", ...q.states, "ready age", "limit", ""],
    q.queues.map((r) => el("tr", { "data-queue": r.queue },
      el("td", {}, el("a", { href: link("/tasks", { queue: r.queue }), text: r.queue })),
      q.states.map((s) => el("td", { class: "num", "data-state": s, text: r.counts[s] })),
      el("td", { class: "num", text: fmtAge(r.ready_age_s) }),
      el("td", { class: "num", "data-rate": r.rate,
        text: r.rate ? `${fmtNum(r.rate, 3)}/s, burst ${fmtNum(r.burst, 1)}` : "none" }),
      el("td", {}, r.rate ? el("button", { class: "small", text: "clear", "data-clear": r.queue,
        onclick: () => setLimit(r.queue, 0, 0) }) : null)))));
  if (!q.queues.length) {
    document.getElementById("queues").append(el("p", { class: "note",
      text: `No pending, ready, running or dead tasks in namespace ${q.namespace}.` }));
  }
}

// Pause and resume: a paused queue's tasks fire but no worker gets them until it resumes.
function pauseSection() {
  const queue = el("input", { id: "pause-queue", placeholder: "queue", required: true,
    maxLength: 128 });
  return section("Paused queues and per-key limits", "pause-card",
    el("div", { id: "queue-settings" }),
    el("form", { id: "pause-form", class: "row", onsubmit: (e) => e.preventDefault() }, queue,
      el("button", { type: "button", id: "pause-button", text: "Pause",
        onclick: () => queueAction("pause", queue.value) }),
      el("button", { type: "button", id: "resume-button", text: "Resume",
        onclick: () => queueAction("resume", queue.value) })),
    el("p", { id: "pause-result", class: "result" }));
}

async function queueAction(action, queue) {
  if (!queue) return;
  try {
    const r = await post(`/api/queues/${action}`, { namespace: namespace(), queue });
    document.getElementById("pause-result").textContent = action === "pause"
      ? `${queue}: paused (its tasks fire; no worker gets them until it resumes)`
      : `${queue}: resumed, ${r.skipped} tasks skipped by their misfire policy`;
    await reload();
  } catch (error) { banner(explain(error)); }
}

async function loadQueueSettings() {
  const s = await api("/api/queues/settings", { namespace: namespace() });
  replace("queue-settings", s.queues.length
    ? table(["queue", "state", "paused since", "max running/key", "max starts/key/s", ""],
      s.queues.map((r) => el("tr", { "data-settings": r.queue },
        el("td", { text: r.queue }),
        el("td", { "data-paused": r.paused, text: r.paused ? "paused" : "running" }),
        el("td", { text: r.paused_at || "" }),
        el("td", { class: "num", text: r.max_running_per_key || "none" }),
        el("td", { class: "num", text: r.max_starts_per_key ? fmtNum(r.max_starts_per_key, 3)
          : "none" }),
        el("td", {}, el("button", { class: "small", text: r.paused ? "resume" : "pause",
          "data-toggle": r.queue,
          onclick: () => queueAction(r.paused ? "resume" : "pause", r.queue) })))))
    : el("p", { class: "note", text: "No queue is paused or limited per key." }));
}

// ------------------------------------------------------------------ tasks and dead letters

const STATES = ["any", "scheduled", "ready", "running", "succeeded", "dead", "cancelled", "skipped"];
const pager = { tokens: [""], index: 0 };

function localToIso(value) {
  return value ? new Date(value).toISOString() : "";
}

function taskFilters(dead) {
  const queue = el("input", { id: "f-queue", placeholder: "every queue",
    value: params.get("queue") || "", maxLength: 128 });
  const state = el("select", { id: "f-state" },
    STATES.map((s) => el("option", { value: s, text: s, selected: s === (params.get("state") ||
      "any") })));
  const from = el("input", { id: "f-from", type: "datetime-local", step: 1 });
  const to = el("input", { id: "f-to", type: "datetime-local", step: 1 });
  const apply = async (e) => {
    e.preventDefault();
    pager.tokens = [""];
    pager.index = 0;
    await reload();
  };
  return el("form", { id: "filters", class: "row", onsubmit: apply },
    el("label", {}, "queue ", queue),
    dead ? null : el("label", {}, "state ", state),
    el("label", {}, "run at from ", from), el("label", {}, "to ", to),
    el("button", { type: "submit", id: "f-apply", text: "Apply" }));
}

function filterQuery(dead) {
  const query = { namespace: namespace(), page_token: pager.tokens[pager.index] };
  const queue = document.getElementById("f-queue").value.trim();
  if (queue) query.queue = queue;
  if (!dead) {
    const state = document.getElementById("f-state").value;
    if (state !== "any") query.state = state;
  }
  const from = localToIso(document.getElementById("f-from").value);
  const to = localToIso(document.getElementById("f-to").value);
  if (from) query.from = from;
  if (to) query.to = to;
  return query;
}

function tasksSkeleton(dead) {
  const actions = dead
    ? [el("button", { id: "requeue-selected", text: "Requeue selected",
      onclick: () => bulk("requeue") }),
    el("button", { id: "cancel-selected", class: "danger", text: "Cancel selected",
      onclick: () => bulk("cancel") })]
    : [el("button", { id: "cancel-selected", class: "danger", text: "Cancel selected",
      onclick: () => bulk("cancel") })];
  main.append(section(dead ? "Dead letters" : "Tasks", "tasks-card", taskFilters(dead),
    el("div", { class: "row" }, actions, el("span", { id: "selected-count", class: "note" })),
    el("p", { id: "bulk-result", class: "result" }),
    el("div", { id: "tasks" }),
    el("div", { class: "row pager" },
      el("button", { id: "page-first", text: "First", onclick: () => page(-pager.index) }),
      el("button", { id: "page-prev", text: "Previous", onclick: () => page(-1) }),
      el("span", { id: "page-info", class: "note" }),
      el("button", { id: "page-next", text: "Next", onclick: () => page(1) }))));
}

const selected = new Set();
let lastPage = null;

function updateSelected() {
  document.getElementById("selected-count").textContent =
    selected.size ? `${selected.size} selected` : "";
}

async function page(step) {
  const target = pager.index + step;
  if (target < 0 || target >= pager.tokens.length) return;
  pager.index = target;
  selected.clear();
  await reload();
}

async function bulk(action) {
  if (!selected.size) { banner("Select tasks first.", "info"); return; }
  const ids = [...selected];
  const verb = action === "requeue" ? "Requeue" : "Cancel";
  if (!(await confirmDialog(`${verb} ${ids.length} task(s) in namespace ${namespace()}?`))) return;
  try {
    const answer = await post(`/api/tasks/${action}`, { namespace: namespace(), ids });
    const summary = summarize(answer.results, action === "requeue" ? "requeued" : "cancelled");
    replace("bulk-result", resultLine("bulk-result", summary));
    selected.clear();
    await reload();
  } catch (error) { banner(explain(error)); }
}

async function loadTasks(dead) {
  const data = await api(dead ? "/api/dead" : "/api/tasks", filterQuery(dead));
  banner("");
  body.dataset.ready = "true";
  lastPage = data;
  pager.tokens.length = pager.index + 1;
  if (data.next_page_token) pager.tokens.push(data.next_page_token);
  document.getElementById("page-info").textContent =
    `page ${pager.index + 1}: ${data.tasks.length} shown of ${data.scanned} read`;
  document.getElementById("page-next").disabled = !data.next_page_token;
  document.getElementById("page-prev").disabled = pager.index === 0;
  const all = el("input", { type: "checkbox", id: "select-all", "aria-label": "select all",
    onchange: (e) => {
      for (const t of lastPage.tasks) {
        if (e.target.checked) selected.add(t.id); else selected.delete(t.id);
      }
      for (const box of document.querySelectorAll("#tasks input[data-id]")) {
        box.checked = e.target.checked;
      }
      updateSelected();
    } });
  const rows = data.tasks.map((t) => el("tr", { "data-id": t.id, "data-state": t.state,
    "data-queue": t.queue },
  el("td", {}, el("input", { type: "checkbox", "data-id": t.id, checked: selected.has(t.id),
    "aria-label": `select ${t.id}`,
    onchange: (e) => {
      if (e.target.checked) selected.add(t.id); else selected.delete(t.id);
      updateSelected();
    } })),
  el("td", { class: "id" }, el("a", { href: link("/task", { id: t.id }), text: t.id })),
  el("td", { text: t.queue }), el("td", {}, el("span", { class: `state ${t.state}`, text: t.state })),
  el("td", { text: fmtTime(t.run_at) }),
  el("td", { class: "num", text: `${t.attempt}/${t.max_attempts}` }),
  el("td", { class: "num", text: t.payload_bytes }),
  el("td", { class: "error", text: t.last_error })));
  replace("tasks", table(["", "id", "queue", "state", "run at", "attempt", "payload B",
    "last error"], rows));
  document.querySelector("#tasks thead th").append(all);
  if (!data.tasks.length) {
    document.getElementById("tasks").append(el("p", { class: "note", id: "no-tasks",
      text: data.next_page_token ? "No match in the tasks read so far: try Next." :
        "No matching tasks." }));
  }
  updateSelected();
}

// ------------------------------------------------------------------ one task

let payloadView = "auto";
let payloadLimit = 4096;

function taskSkeleton() {
  main.append(section("Task", "task-card", el("div", { id: "task-fields" }),
    el("div", { class: "row", id: "task-actions" }), el("p", { id: "task-result", class: "result" })),
  section("Payload", "payload-card",
    el("div", { class: "row" },
      el("label", {}, "view ", el("select", { id: "payload-view", onchange: (e) => {
        payloadView = e.target.value; reload();
      } }, ["auto", "text", "json", "hex"].map((v) => el("option", { value: v, text: v })))),
      el("label", {}, "show bytes ", el("select", { id: "payload-limit", onchange: (e) => {
        payloadLimit = Number(e.target.value); reload();
      } }, [1024, 4096, 65536, 262144].map((v) => el("option", { value: v, text: v,
        selected: v === payloadLimit })))),
      el("span", { id: "payload-info", class: "note" })),
    el("pre", { id: "payload" })),
  section("Last error", "error-card", el("pre", { id: "last-error" })));
}

async function taskAction(action, id) {
  const verb = action === "requeue" ? "Requeue" : "Cancel";
  if (!(await confirmDialog(`${verb} task ${id}?`))) return;
  try {
    const answer = await post(`/api/tasks/${action}`, { namespace: namespace(), ids: [id] });
    replace("task-result", resultLine("task-result",
      summarize(answer.results, action === "requeue" ? "requeued" : "cancelled")));
    await reload();
  } catch (error) { banner(explain(error)); }
}

async function loadTask() {
  const id = params.get("id") || "";
  const t = await api("/api/task", { namespace: namespace(), id, view: payloadView,
    limit: payloadLimit });
  banner("");
  body.dataset.ready = "true";
  const fields = [["id", t.id], ["namespace", t.namespace], ["queue", t.queue],
    ["state", t.state], ["run at", fmtTime(t.run_at)],
    ["attempts", `${t.attempt} of ${t.max_attempts}`], ["priority", t.priority],
    ["partition / bucket", `${t.partition} / ${t.bucket}`],
    ["idempotency key", t.idempotency_key || "–"], ["worker", t.worker_id || "–"],
    ["created", fmtTime(t.created_at)], ["fired", fmtTime(t.fired_at)],
    ["lease until", fmtTime(t.lease_until)], ["finished", fmtTime(t.finished_at)],
    ["misfire", `${t.misfire_policy}, grace ${t.misfire_grace_s} s`],
    ["lease timeout", `${t.lease_timeout_s} s`],
    ["backoff", `${t.backoff_initial_s} s … ${t.backoff_max_s} s`]];
  replace("task-fields", el("dl", { class: "fields", "data-state": t.state },
    fields.map(([k, v]) => [el("dt", { text: k }), el("dd", { "data-field": k, text: v })])));
  const actions = document.getElementById("task-actions");
  actions.textContent = "";
  if (t.cancellable) {
    actions.append(el("button", { id: "task-cancel", class: "danger", text: "Cancel task",
      onclick: () => taskAction("cancel", t.id) }));
  }
  if (t.requeueable) {
    actions.append(el("button", { id: "task-requeue", text: "Requeue task",
      onclick: () => taskAction("requeue", t.id) }));
  }
  const p = t.payload;
  document.getElementById("payload").textContent = p.text;
  document.getElementById("payload").dataset.view = p.view;
  document.getElementById("payload-info").textContent =
    `${p.size} bytes, shown as ${p.view}${p.cut ? " (cut)" : ""}${p.note ? `: ${p.note}` : ""}`;
  document.getElementById("last-error").textContent = t.last_error || "none";
}

// ------------------------------------------------------------------ schedules

function schedulesSkeleton() {
  main.append(section("Schedules", "schedules-card", el("p", { id: "schedule-result",
    class: "result" }), el("div", { id: "schedules" })));
}

async function scheduleAction(action, name) {
  if (action === "delete" && !(await confirmDialog(`Delete schedule ${name}?`))) return;
  try {
    await post(`/api/schedules/${action}`, { namespace: namespace(), name });
    document.getElementById("schedule-result").textContent = `${name}: ${action}d`;
    await reload();
  } catch (error) { banner(explain(error)); }
}

async function loadSchedules() {
  const data = await api("/api/schedules", { namespace: namespace() });
  banner("");
  body.dataset.ready = "true";
  replace("schedules", table(["name", "queue", "rule", "state", "next occurrences", "last fired",
    "created", "skipped", ""], data.schedules.map((s) => el("tr", { "data-name": s.name,
    "data-paused": s.paused },
  el("td", { text: s.name }), el("td", { text: s.queue }), el("td", { text: s.rule }),
  el("td", { title: s.paused_reason, text: s.paused ? "paused" : "active" }),
  el("td", { class: "next" }, s.next.length ? el("ul", {}, s.next.map((n) => el("li",
    { text: fmtTime(n) }))) : "–"),
  el("td", { text: fmtTime(s.last_fire_at) }),
  el("td", { class: "num", text: s.created_total }), el("td", { class: "num", text: s.skipped_total }),
  el("td", { class: "actions" },
    s.paused
      ? el("button", { class: "small", "data-action": "resume", text: "Resume",
        onclick: () => scheduleAction("resume", s.name) })
      : el("button", { class: "small", "data-action": "pause", text: "Pause",
        onclick: () => scheduleAction("pause", s.name) }),
    el("button", { class: "small danger", "data-action": "delete", text: "Delete",
      onclick: () => scheduleAction("delete", s.name) }))))));
  if (!data.schedules.length) {
    document.getElementById("schedules").append(el("p", { class: "note",
      text: `No schedules in namespace ${data.namespace}.` }));
  }
}

// ------------------------------------------------------------------ shards

function shardsSkeleton() {
  main.append(
    el("section", { class: "cards", id: "shard-facts" }),
    section("Store shards", "shards-card", el("p", { id: "shards-note", class: "note" }),
      el("div", { id: "shards" })),
    section("Moves (open and recently finished)", "moves-card",
      el("p", { id: "moves-note", class: "note" }), el("div", { id: "moves" })));
}

async function loadShards() {
  const m = await api("/api/shards");
  body.dataset.ready = "true";
  banner(m.ok ? (m.error ? `The shard map in etcd was refused: ${m.error}` : "")
    : (m.error || "no node answered"), "error");
  const facts = document.getElementById("shard-facts");
  facts.textContent = "";
  for (const [label, value, id] of [
    ["map version", m.version ?? "–", "fact-map-version"],
    ["answered by", m.answered_by || "–", "fact-shards-node"],
    ["shards", (m.shards || []).length, "fact-shard-count"],
    ["moves in progress", m.moves_in_progress ?? "–", "fact-moves"]]) {
    facts.append(el("div", { class: "fact", id }, el("span", { text: label }),
      el("strong", { text: value })));
  }
  replace("shards", table(["shard", "dsn (password masked)", "health", "partitions", "held",
    "pending (counted buckets)"], (m.shards || []).map((s) => el("tr", {
    class: s.health === "ok" ? "" : "down", "data-shard": s.name, "data-health": s.health,
    "data-held": s.partition_count },
  el("td", { text: s.name }), el("td", { class: "id", text: s.dsn }),
  el("td", { text: s.health }), el("td", { class: "tokens", text: s.partitions || "–" }),
  el("td", { class: "num", text: s.partition_count }),
  el("td", { class: "num", text: fmtNum(s.pending, 0) })))));
  document.getElementById("shards-note").textContent = m.shards_cut
    ? "More shards than a cluster may have: the first ones are shown." : "";
  const moves = m.moves || [];
  replace("moves", table(["id", "partitions", "from", "to", "phase", "rows copied", "rounds",
    "driver", "error"], moves.map((v) => el("tr", { "data-move": v.id, "data-phase": v.phase },
    el("td", { class: "id", text: v.id || "–" }), el("td", { class: "tokens", text: v.partitions }),
    el("td", { text: v.source }), el("td", { text: v.target }),
    el("td", {}, el("span", { class: `state phase-${v.phase}`, text: v.phase })),
    el("td", { class: "num", text: fmtNum(v.rows_copied, 0) }),
    el("td", { class: "num", text: v.rounds }), el("td", { text: v.driver || "–" }),
    el("td", { class: "error", text: v.error || "" })))));
  const notes = [];
  if (!moves.length) notes.push("No moves.");
  if (m.moves_cut) notes.push("More moves than a cluster keeps: the first ones are shown.");
  if (m.moves_error) notes.push(`Move records unreadable: ${m.moves_error}`);
  document.getElementById("moves-note").textContent = notes.join(" ");
}

// ------------------------------------------------------------------ start

function start() {
  const input = document.getElementById("namespace");
  const list = document.getElementById("namespaces");
  for (const ns of NAMESPACES) list.append(el("option", { value: ns }));
  input.value = params.get("namespace") || NAMESPACES[0];
  input.addEventListener("change", () => {
    const q = new URLSearchParams(location.search);
    q.set("namespace", namespace());
    if (PAGE === "task") { location.search = q.toString(); return; }
    history.replaceState(null, "", `${location.pathname}?${q}`);
    for (const a of document.querySelectorAll("nav a")) {
      a.href = link(new URL(a.href).pathname);
    }
    pager.tokens = [""]; pager.index = 0; selected.clear();
    reload();
  });
  for (const a of document.querySelectorAll("nav a")) a.href = link(new URL(a.href).pathname);
  const slow = REFRESH_MS * 2.5;
  if (PAGE === "overview") { overviewSkeleton(); every(loadOverview, REFRESH_MS); }
  if (PAGE === "queues") {
    queuesSkeleton();
    every(async () => { await loadQueues(); await loadQueueSettings(); }, slow);
  }
  if (PAGE === "tasks") { tasksSkeleton(false); every(() => loadTasks(false), slow); }
  if (PAGE === "dead") { tasksSkeleton(true); every(() => loadTasks(true), slow); }
  if (PAGE === "task") { taskSkeleton(); every(loadTask, slow); }
  if (PAGE === "schedules") { schedulesSkeleton(); every(loadSchedules, slow); }
  if (PAGE === "shards") { shardsSkeleton(); every(loadShards, REFRESH_MS); }
}

start();
