// chronoq lab: polls /api/state once a second and draws it; the buttons POST to /api/*.
// Plain JS and canvas, nothing loaded from the network. Data (owner names read from etcd,
// event texts) is only ever set as text: elements are built with h(), never from HTML.
"use strict";

// The per-run key comes in the URL fragment (never sent by the browser); every API call
// carries it in a header that other web pages cannot set on a request to the lab.
const LAB_KEY = window.location.hash.slice(1);
const KEY_HEADER = "X-Chronoq-Lab";

const NODE_COLORS = ["#2563eb", "#e67e22", "#16a085", "#8e44ad", "#c0392b", "#7f8c8d", "#d4ac0d", "#2c3e50"];
const fmt = new Intl.NumberFormat("en-US");
const $ = (id) => document.getElementById(id);
let state = null;
let busy = false;

// An element with attributes (class, id, data-*) and children: strings become text nodes.
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([key, value]) => {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  });
  children.forEach((child) => {
    if (child === null || child === undefined) return;
    node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  });
  return node;
}

function n(value) { return value === null || value === undefined ? "–" : fmt.format(Math.round(value)); }
function ms(value) { return value === null || value === undefined ? "–" : (value < 10 ? value.toFixed(3) : fmt.format(Math.round(value))); }
function hhmm(bucket, width) { return new Date(bucket * width * 1000).toISOString().slice(11, 16); }
function hms(iso) { return iso ? iso.slice(11, 19) : "–"; }

function setValue(id, value) {
  const el = $(id);
  el.textContent = n(value);
  el.dataset.value = String(value);
}

function say(text, kind) {
  const el = $("message");
  el.textContent = text;
  el.className = kind || "";
}

function nodeColor(nodeId) {
  if (!state) return "#999";
  const index = state.nodes.findIndex((node) => node.node_id === nodeId);
  return index < 0 ? "#999" : NODE_COLORS[index % NODE_COLORS.length];
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST", headers: {"Content-Type": "application/json", [KEY_HEADER]: LAB_KEY},
    body: JSON.stringify(body),
  });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

async function act(button, label, path, body, done) {
  if (busy) return;
  busy = true;
  document.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  say(label + " …", "");
  try {
    const result = await post(path, body);
    say(done(result), "ok");
  } catch (error) {
    say(error.message, "error");
  } finally {
    busy = false;
    document.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    refresh();
  }
}

// ------------------------------------------------------------------ canvas helpers

function surface(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = Number(canvas.getAttribute("height"));
  if (canvas.width !== Math.round(width * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = height + "px";
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  return {ctx, width, height};
}

function drawHistogram(h, width_s) {
  const {ctx, width, height} = surface($("histogram"));
  const left = 44, bottom = 20, top = 8;
  const plotW = width - left - 8, plotH = height - bottom - top;
  const max = Math.max(1, ...h.counts);
  const barW = plotW / h.counts.length;
  ctx.fillStyle = "#6b7480";
  ctx.textAlign = "right";
  ctx.fillText(fmt.format(max), left - 4, top + 8);
  ctx.fillText("0", left - 4, top + plotH);
  const now = h.current_bucket - h.first_bucket;
  for (let i = 0; i < h.counts.length; i++) {
    if (!h.counts[i]) continue;
    const barH = Math.max(1, (h.counts[i] / max) * plotH);
    ctx.fillStyle = i === now + 1 ? "#e67e22" : (i < now ? "#d9534f" : "#2563eb");
    ctx.fillRect(left + i * barW, top + plotH - barH, Math.max(barW, 1), barH);
  }
  ctx.textAlign = "center";
  ctx.fillStyle = "#6b7480";
  for (let i = 0; i < h.counts.length; i += 120) {
    ctx.fillText(hhmm(h.first_bucket + i, width_s), left + i * barW, height - 5);
  }
  const x = left + now * barW;
  ctx.strokeStyle = "#c0392b";
  ctx.lineWidth = 2;
  ctx.beginPath();
  ctx.moveTo(x, top);
  ctx.lineTo(x, top + plotH);
  ctx.stroke();
  ctx.fillStyle = "#c0392b";
  ctx.textAlign = "left";
  ctx.fillText("now", x + 4, top + 10);
}

function drawLines(canvas, points, series, options) {
  const {ctx, width, height} = surface(canvas);
  const left = 52, bottom = 18, top = 10, right = 8;
  const plotW = width - left - right, plotH = height - top - bottom;
  const values = [];
  series.forEach((s) => points.forEach((p) => { if (p[s.key] !== undefined && p[s.key] !== null) values.push(p[s.key]); }));
  if (!values.length) {
    ctx.fillStyle = "#6b7480";
    ctx.fillText("waiting for samples …", left, top + 14);
    return;
  }
  const log = Boolean(options.log);
  const tf = (v) => (log ? Math.log10(Math.max(v, 1)) : v);
  const lo = log ? 0 : 0;
  const hi = Math.max(log ? 1 : 1e-9, ...values.map(tf)) * (log ? 1.05 : 1.1);
  const y = (v) => top + plotH - ((tf(v) - lo) / (hi - lo)) * plotH;
  const x = (i) => left + (points.length < 2 ? plotW : (i / (points.length - 1)) * plotW);
  ctx.strokeStyle = "#e2e4e8";
  ctx.fillStyle = "#6b7480";
  ctx.textAlign = "right";
  const ticks = log ? Array.from({length: Math.floor(hi) + 1}, (_, k) => Math.pow(10, k)) : [0, hi / 2, hi];
  ticks.forEach((t) => {
    const yy = log ? y(t) : top + plotH - (t / hi) * plotH;
    ctx.beginPath();
    ctx.moveTo(left, yy);
    ctx.lineTo(left + plotW, yy);
    ctx.stroke();
    ctx.fillText(fmt.format(Math.round(t)), left - 4, yy + 4);
  });
  series.forEach((s, k) => {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let started = false;
    points.forEach((p, i) => {
      const v = p[s.key];
      if (v === undefined || v === null) return;
      if (started) ctx.lineTo(x(i), y(v)); else ctx.moveTo(x(i), y(v));
      started = true;
    });
    ctx.stroke();
    ctx.fillStyle = s.color;
    ctx.textAlign = "left";
    ctx.fillText(s.label, left + 8 + k * 150, top + 10);
  });
}

// ------------------------------------------------------------------ rendering

function renderCounts(s) {
  setValue("pending", s.counts.pending);
  setValue("fired", s.fired);
  setValue("executed", s.executed);
  const doubles = s.double_firings;
  setValue("double-firings", doubles.total);
  $("double-card").className = "card " + (doubles.total === 0 ? "zero" : "bad");
  $("double-detail").textContent =
    `${n(doubles.checked)} owner firings checked: ${doubles.regressions} token regressions, ${doubles.shared_tokens} shared tokens`;
  setValue("reexecuted", s.executions.reexecuted);
}

function renderHistogram(s) {
  const h = s.histogram;
  drawHistogram(h, s.bucket_seconds);
  const next = h.counts[h.current_bucket - h.first_bucket + 1] || 0;
  $("histogram-legend").textContent =
    `${fmt.format(h.counts.length)} buckets of ${s.bucket_seconds} s from ${hhmm(h.first_bucket, s.bucket_seconds)} UTC (virtual); ` +
    `red line: the current bucket ${h.current_bucket}; orange: the next minute (${n(next)} tasks, what “advance” fires); ` +
    `average per bucket = pending × 1 / 1,440 = ${n(h.pending / 1440)}` +
    (h.before ? `; ${n(h.before)} overdue before the window` : "") +
    (h.after ? `; ${n(h.after)} beyond it` : "");
}

function renderScans(s) {
  const body = $("scans").querySelector("tbody");
  body.replaceChildren();
  const rows = [["this tick", s.scans.now], ["next minute", s.scans.next_minute]];
  rows.forEach(([label, pair]) => {
    if (!pair) return;
    [["naive", pair.naive], ["bucketed", pair.bucketed]].forEach(([kind, e]) => {
      const tr = document.createElement("tr");
      tr.dataset.when = label;
      tr.dataset.scan = kind;
      tr.dataset.examined = String(e.examined);
      tr.dataset.due = String(e.due);
      tr.append(
        h("td", {}, label + " ", h("span", {class: "muted small"}, hms(pair.at))),
        h("td", {class: kind}, kind), h("td", {}, n(e.due)), h("td", {class: kind}, n(e.examined)),
        h("td", {}, n(e.shared_hit + e.shared_read)), h("td", {}, ms(e.server_ms)));
      body.appendChild(tr);
    });
  });
  drawLines($("scan-chart"), s.timeline, [
    {key: "naive_examined", label: "naive", color: "#d9534f"},
    {key: "bucketed_examined", label: "bucketed", color: "#2563eb"},
  ], {log: true});
}

function renderAdvance(s) {
  const a = s.last_advance;
  const el = $("advance-result");
  if (!a) return;
  el.className = "";
  el.dataset.due = String(a.due);
  el.dataset.fired = String(a.fired);
  el.dataset.executed = String(a.executed);
  el.dataset.from = a.from;
  el.dataset.to = a.to;
  const took = a.fired_ms === null ? "not all fired yet" : `all fired ${n(a.fired_ms)} ms after the jump`;
  el.replaceChildren(`clock ${hms(a.from)} → ${hms(a.to)}: `, h("strong", {id: "advance-due"}, n(a.due)),
    " tasks came due, ", h("strong", {id: "advance-fired"}, n(a.fired)),
    ` fired by ${a.firers} node(s) (${took}), `, h("strong", {id: "advance-executed"}, n(a.executed)),
    " executed so far.");
}

function renderOwnership(s) {
  const body = $("nodes").querySelector("tbody");
  body.replaceChildren();
  s.nodes.forEach((node) => {
    const tr = document.createElement("tr");
    tr.dataset.node = node.node_id;
    tr.dataset.partitions = String(node.partitions);
    if (!node.alive) tr.className = "dead";
    const tokens = node.token_min === null ? "–" : `${node.token_min} … ${node.token_max}`;
    const late = node.lateness_p50_ms === null ? "–" : `${ms(node.lateness_p50_ms)} / ${ms(node.lateness_p99_ms)}`;
    const swatch = h("span", {class: "swatch"});
    swatch.style.background = nodeColor(node.node_id);  // CSSOM: allowed under the page's CSP
    tr.append(h("td", {}, swatch, String(node.node_id)),
      h("td", {}, node.alive ? "pid " + node.pid : "killed"), h("td", {}, String(node.partitions)),
      h("td", {}, tokens), h("td", {}, n(node.fired_total)), h("td", {}, late), h("td", {}));
    if (!node.alive) {
      const restart = document.createElement("button");
      restart.textContent = "restart";
      restart.className = "secondary";
      restart.dataset.restart = node.node_id;
      restart.disabled = busy;
      restart.addEventListener("click", () => act(restart, `restarting ${node.node_id}`, "/api/restart",
        {node: node.node_id}, (r) => `${r.restarted} restarted (pid ${r.pid})`));
      tr.lastChild.appendChild(restart);
    }
    body.appendChild(tr);
  });
  const grid = $("partition-grid");
  if (grid.children.length !== s.partitions) {
    grid.replaceChildren();
    for (let p = 0; p < s.partitions; p++) {
      const cell = document.createElement("div");
      cell.className = "cell";
      cell.dataset.partition = String(p);
      grid.appendChild(cell);
    }
  }
  const owners = new Map(s.ownership.map((o) => [o.partition, o]));
  for (let p = 0; p < s.partitions; p++) {
    const cell = grid.children[p];
    const o = owners.get(p);
    cell.className = o ? "cell" : "cell unowned";
    cell.style.background = o ? nodeColor(o.owner) : "";
    cell.dataset.owner = o ? o.owner : "";
    cell.dataset.token = o ? String(o.fencing_token) : "";
    cell.title = o ? `partition ${p}: ${o.owner}, fencing token ${o.fencing_token}, watermark bucket ${o.watermark_bucket}`
      : `partition ${p}: no owner`;
  }
  const t = s.takeover;
  const el = $("takeover");
  if (t) {
    el.dataset.victim = t.victim;
    el.dataset.newOwner = t.new_owner || "";
    el.dataset.newToken = t.new_token === null ? "" : String(t.new_token);
    const killed = ["Killed ", h("strong", {}, String(t.victim)),
      ` (partition ${t.partition}, token ${t.old_token}); `];
    el.replaceChildren(...killed, ...(t.new_owner
      ? [h("strong", {id: "new-owner"}, String(t.new_owner)), " took it over with token ",
         h("strong", {}, String(t.new_token)), ` ${t.seconds.toFixed(1)} s later` +
         (t.all_reowned_s === null ? "; re-owning the rest …"
           : `; all ${t.lost} of its partitions re-owned in ${t.all_reowned_s.toFixed(1)} s.`)]
      : ["waiting for its lease to expire …"]));
  }
}

function renderCharts(s) {
  drawLines($("throughput-chart"), s.timeline, [
    {key: "fired_per_s", label: "fired/s", color: "#e67e22"},
    {key: "executed_per_s", label: "executed/s", color: "#16a085"},
  ], {});
  drawLines($("lateness-chart"), s.timeline, [
    {key: "lateness_p50_ms", label: "p50", color: "#2563eb"},
    {key: "lateness_p99_ms", label: "p99", color: "#8e44ad"},
  ], {});
}

function renderEvents(s) {
  const list = $("events");
  list.replaceChildren();
  s.events.forEach((e) => {
    const li = document.createElement("li");
    li.className = e.kind;
    const at = new Date(e.at).toISOString().slice(11, 19);
    li.append(h("span", {class: "muted"}, at), " ", h("span", {class: "kind"}, String(e.kind)), " ",
      String(e.text));
    list.appendChild(li);
  });
}

function render(s) {
  $("now").textContent = s.now.replace("T", " ").slice(0, 19) + " UTC";
  $("now").dataset.value = s.now;
  $("bucket").textContent = String(s.histogram.current_bucket);
  $("offset").textContent = `${(s.offset_ms / 60000).toFixed(1)} min`;
  const load = s.loading;
  $("load-progress").textContent = !load ? "" : load.error ? `load failed: ${load.error}`
    : load.seconds === null ? `loading ${n(load.done)} / ${n(load.total)} …`
    : `loaded ${n(load.total)} in ${load.seconds.toFixed(1)} s`;
  $("load-progress").dataset.done = load && load.seconds !== null ? "true" : "false";
  if (s.error) say(s.error, "error");
  renderCounts(s);
  renderHistogram(s);
  renderScans(s);
  renderAdvance(s);
  renderOwnership(s);
  renderCharts(s);
  renderEvents(s);
  document.body.dataset.ready = "true";
}

async function refresh() {
  if (!LAB_KEY) {
    say("this address lacks the lab's key: open the URL that chronoq lab printed", "error");
    return;
  }
  try {
    const response = await fetch("/api/state", {cache: "no-store", headers: {[KEY_HEADER]: LAB_KEY}});
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || response.statusText);
    state = data;
    render(state);
  } catch (error) {
    say(`lab unreachable: ${error.message}`, "error");
  }
}

function addLoad(count) {
  act(null, `adding ${n(count)} tasks`, "/api/load", {count},
    (r) => `loading ${n(r.loading)} pending tasks over the coming day`);
}

$("load-button").addEventListener("click", () => addLoad(Number($("load-count").value)));
document.querySelectorAll("[data-load]").forEach((b) => b.addEventListener("click", () => addLoad(Number(b.dataset.load))));
$("advance-button").addEventListener("click", () => act(null, "advancing the clock one minute", "/api/advance",
  {minutes: 1}, (r) => `${n(r.fired)} of ${n(r.due)} due tasks fired`));
$("kill-button").addEventListener("click", () => act(null, "killing the owner", "/api/kill",
  {partition: Number($("kill-partition").value)}, (r) => `SIGKILL sent to ${r.victim} (owner of partition ${r.partition})`));
window.addEventListener("resize", () => state && render(state));

refresh();
setInterval(refresh, 1000);
