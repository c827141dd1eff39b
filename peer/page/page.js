// The swarm page: polls this daemon's /status and /swarm (the live peers' figures, which the daemon
// fetched and checked: the browser talks to no other address), then draws the run, the peers, the
// loss curves (SVG), the protocol's panels and the last ledgers. Every value is checked before it
// is drawn, each peer and each part is drawn inside its own error boundary, and poll() always
// schedules the next poll, whatever one peer reports.
"use strict";

const POLL_MS = 2000;
const TIMEOUT_MS = 5000;
const MAX_TICKS = 50;
const STATES = new Set(["running", "idle", "finished", "failed", "serving"]);
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
const SVG = "http://www.w3.org/2000/svg";
let polls = 0;

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== "") node.textContent = text;
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

// -- checks: what a value must be before it is drawn ---------------------------------------------

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function list(value) {
  return Array.isArray(value) ? value : [];
}

function text(value, fallback = "-") {
  if (typeof value === "string") return value.length > 200 ? `${value.slice(0, 199)}…` : value;
  if (typeof value === "number" && Number.isFinite(value)) return String(value);
  return fallback;
}

function finite(value) {
  return typeof value === "number" && Number.isFinite(value);
}

function field(object, key) {
  return isObject(object) && Object.prototype.hasOwnProperty.call(object, key) ? object[key] : undefined;
}

function bytes(n) {
  if (!finite(n) || n < 0) return "-";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function state(value) {
  return STATES.has(value) ? value : "-";
}

// Runs draw(); on an error, shows it through fail(message) (or drops it) and goes on.
function guarded(draw, fail) {
  try {
    draw();
  } catch (error) {
    if (fail) {
      try { fail(`could not be drawn (${text(error && error.message, "error")})`); } catch (ignored) { /* nothing */ }
    }
  }
}

async function getJson(url) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  try {
    const response = await fetch(url, { signal: controller.signal, cache: "no-store" });
    return response.ok ? await response.json() : null;
  } catch (error) {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

// -- the parts of the page ----------------------------------------------------------------------

function peerId(row) {
  return text(field(row, "peer_id"), "");
}

function label(row) {
  return text(field(row, "name"), "") || peerId(row).slice(0, 12) || "?";
}

function renderHeader(status) {
  document.getElementById("run").textContent = text(status.run_id);
  document.getElementById("protocol").textContent = `protocol ${text(status.protocol)}: ${text(status.summary, "")}`;
  const health = state(field(status.health, "state"));
  const roles = list(status.roles).map((r) => text(r)).join(", ") || "no roles";
  const line = document.getElementById("health");
  line.textContent = `this peer (${label(status)}, ${roles}): ${health}`;
  line.className = `state-${health}`;
  document.getElementById("join").textContent = text(status.join, "");
}

function note(figures) {
  if (!isObject(figures)) return "no figures";
  if (typeof figures.error === "string") return text(figures.error);
  const malformed = list(figures.malformed).map((m) => text(m)).slice(0, 4);
  return malformed.length ? `malformed: ${malformed.join(", ")}` : "";
}

function renderPeers(rows, figures) {
  const body = document.querySelector("#peers tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = el("tr", { "data-peer-id": peerId(row) });
    guarded(() => {
      const fig = field(figures, peerId(row));
      const peerState = state(field(fig, "state"));
      const lastSeen = field(row, "last_seen_s");
      const cells = [label(row), peerId(row).slice(0, 16), list(field(row, "roles")).map((r) => text(r)).join(", ") || "-",
        text(field(row, "device")), text(field(row, "round")), peerState,
        finite(lastSeen) ? `${lastSeen.toFixed(1)} s` : "-", bytes(field(fig, "bytes_sent")),
        bytes(field(fig, "bytes_received")), note(fig)];
      cells.forEach((value, i) => {
        const td = el("td", i === 1 ? { class: "mono" } : {}, value);
        if (i === 5) td.className = `state-${peerState}`;
        tr.appendChild(td);
      });
    }, (message) => {
      tr.replaceChildren(el("td", {}, label(row)), el("td", { colspan: "9" }, `this peer ${message}`));
    });
    body.appendChild(tr);
  }
  document.getElementById("peer-count").textContent = `(${rows.length})`;
  document.body.dataset.peers = String(rows.length);
}

// [{peer, role, name, points: [[x, y], ...]}] from every peer's checked figures.
function collectSeries(rows, figures) {
  const out = [];
  for (const row of rows) {
    guarded(() => {
      for (const series of list(field(field(figures, peerId(row)), "series")).slice(0, 64)) {
        const points = list(field(series, "points")).filter((p) => Array.isArray(p) && finite(p[0]) && finite(p[1]));
        if (points.length) out.push({ peer: label(row), name: text(field(series, "name")), points });
      }
    });
  }
  return out;
}

function niceTicks(low, high, count) {
  const span = high - low;
  if (!finite(span) || span <= 0) return [];
  const step = Math.pow(10, Math.floor(Math.log10(span / count)));
  const mult = [1, 2, 5, 10].find((m) => span / (step * m) <= count) || 10;
  const unit = step * mult;
  const ticks = [];
  const first = Math.ceil(low / unit);
  for (let k = 0; k < MAX_TICKS; k += 1) {
    const t = (first + k) * unit;
    if (!finite(t) || t > high + unit * 1e-9) break;
    ticks.push(Number(t.toPrecision(6)));
  }
  return ticks;
}

function extent(values) {
  let low = Infinity, high = -Infinity;
  for (const v of values) { if (v < low) low = v; if (v > high) high = v; }
  return [low, high];
}

function renderChart(series) {
  const chart = document.getElementById("loss");
  chart.replaceChildren();
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  const all = series.flatMap((s) => s.points);
  document.body.dataset.lossPoints = String(all.length);
  const W = 760, H = 300, left = 50, right = 15, top = 12, bottom = 32;
  if (!all.length) {
    const empty = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#7a8194" });
    empty.textContent = "no loss reported yet";
    chart.appendChild(empty);
    return;
  }
  let [x0, x1] = extent(all.map((p) => p[0]));
  let [y0, y1] = extent(all.map((p) => p[1]));
  if (!(x1 - x0 > 0) || !finite(x1 - x0)) x1 = x0 + 1;
  if (!(y1 - y0 > 0) || !finite(y1 - y0)) { y0 -= 0.5; y1 = y0 + 1; }
  const pad = (y1 - y0) * 0.05;
  y0 -= pad; y1 += pad;
  const X = (x) => left + (x - x0) / (x1 - x0) * (W - left - right);
  const Y = (y) => top + (1 - (y - y0) / (y1 - y0)) * (H - top - bottom);
  for (const t of niceTicks(y0, y1, 5)) {
    chart.appendChild(svg("line", { x1: left, x2: W - right, y1: Y(t), y2: Y(t), stroke: "#eceef3" }));
    const tick = svg("text", { x: left - 6, y: Y(t) + 4, "text-anchor": "end", "font-size": 11, fill: "#4a5266" });
    tick.textContent = String(t);
    chart.appendChild(tick);
  }
  for (const t of niceTicks(x0, x1, 8)) {
    const tick = svg("text", { x: X(t), y: H - bottom + 16, "text-anchor": "middle", "font-size": 11, fill: "#4a5266" });
    tick.textContent = String(t);
    chart.appendChild(tick);
  }
  const axis = svg("text", { x: W - right, y: H - 4, "text-anchor": "end", "font-size": 11, fill: "#7a8194" });
  axis.textContent = "round / step / version";
  chart.appendChild(axis);
  const peers = [...new Set(series.map((s) => s.peer))];
  for (const s of series) {
    guarded(() => {
      const color = COLORS[peers.indexOf(s.peer) % COLORS.length];
      const dashed = /heldout|held_out|test|eval/.test(s.name);
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
      chart.appendChild(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2,
        "stroke-dasharray": dashed ? "6 4" : "", "data-series": `${s.peer}/${s.name}` }));
      for (const p of s.points) {
        chart.appendChild(svg("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: color, class: "loss-point" }));
      }
      const item = el("span");
      const swatch = el("i");
      swatch.style.background = dashed ? `repeating-linear-gradient(90deg, ${color} 0 6px, transparent 6px 10px)` : color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(`${s.peer} ${s.name.replace(/_/g, " ")}`));
      legend.appendChild(item);
    });
  }
}

function renderPanels(status) {
  const section = document.getElementById("panels");
  section.replaceChildren();
  for (const panel of list(status.panels).slice(0, 8)) {
    guarded(() => {
      const table = el("table");
      const head = el("tr");
      list(field(panel, "columns")).forEach((c) => head.appendChild(el("th", {}, text(c))));
      table.appendChild(head);
      for (const row of list(field(panel, "rows")).slice(0, 500)) {
        const tr = el("tr");
        list(row).forEach((cell) => tr.appendChild(el("td", {}, text(cell))));
        table.appendChild(tr);
      }
      section.appendChild(el("h2", {}, text(field(panel, "title"))));
      section.appendChild(table);
    });
  }
}

function renderLedgers(rows, figures) {
  const body = document.querySelector("#ledgers tbody");
  body.replaceChildren();
  for (const row of rows) {
    guarded(() => {
      for (const ledger of list(field(field(figures, peerId(row)), "ledgers")).slice(0, 64)) {
        const tr = el("tr");
        [label(row), ...list(ledger).slice(0, 7).map((cell) => text(cell))].forEach((cell) => tr.appendChild(el("td", {}, cell)));
        body.appendChild(tr);
      }
    });
  }
}

function render(status, figures) {
  const rows = list(status.live_peers).filter(isObject);
  const parts = [() => renderHeader(status), () => renderPeers(rows, figures),
    () => renderChart(collectSeries(rows, figures)), () => renderPanels(status), () => renderLedgers(rows, figures)];
  const failed = [];
  parts.forEach((part, i) => guarded(part, () => failed.push(i)));
  return failed.length ? ` (${failed.length} part(s) could not be drawn)` : "";
}

async function poll() {
  const updated = document.getElementById("updated");
  try {
    const status = await getJson("/status");
    if (isObject(status)) {
      const swarm = await getJson("/swarm");
      const problems = render(status, isObject(field(swarm, "peers")) ? swarm.peers : {});
      updated.textContent = `updated ${new Date().toLocaleTimeString()}${problems}`;
    } else {
      updated.textContent = "this daemon does not answer";
    }
  } catch (error) {
    updated.textContent = `could not update: ${text(error && error.message, "error")}`;
  } finally {
    polls += 1;
    document.body.dataset.polls = String(polls);
    setTimeout(poll, POLL_MS);
  }
}

poll();
