// The swarm page: polls /status of this daemon and of every live peer it lists, then draws the
// run, the peers, the loss curves (SVG, drawn here), the protocol's panels and the last ledgers.
"use strict";

const POLL_MS = 2000;
const PEER_TIMEOUT_MS = 3000;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
const SVG = "http://www.w3.org/2000/svg";

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

function bytes(n) {
  if (n === undefined || n === null) return "-";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

async function getJson(url) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), PEER_TIMEOUT_MS);
  try {
    const response = await fetch(url, { signal: controller.signal, cache: "no-store" });
    return await response.json();
  } catch (error) {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

// Each live peer's own /status (this daemon's is already at hand).
async function peerStatuses(own) {
  const rows = own.live_peers || [];
  const answers = await Promise.all(rows.map((row) =>
    row.peer_id === own.peer_id ? Promise.resolve(own) : getJson(`http://${row.http_addr}/status`)));
  const byId = {};
  rows.forEach((row, i) => { if (answers[i]) byId[row.peer_id] = answers[i]; });
  byId[own.peer_id] = own;
  return byId;
}

function label(row) {
  return row.name || row.peer_id.slice(0, 12);
}

function renderHeader(own) {
  document.getElementById("run").textContent = own.run_id;
  document.getElementById("protocol").textContent = `protocol ${own.protocol}: ${own.summary || ""}`;
  const health = own.health || { state: "?" };
  const line = document.getElementById("health");
  line.textContent = `this peer (${own.name || own.peer_id.slice(0, 12)}, ${own.roles.join(", ") || "no roles"}): ${health.state}`;
  line.className = `state-${health.state}`;
  document.getElementById("join").textContent = own.join || "";
}

function renderPeers(own, statuses) {
  const body = document.querySelector("#peers tbody");
  body.replaceChildren();
  for (const row of own.live_peers || []) {
    const status = statuses[row.peer_id];
    const state = status && status.health ? status.health.state : "-";
    const tr = el("tr", { "data-peer-id": row.peer_id });
    const cells = [label(row), row.peer_id.slice(0, 16), row.roles.join(", ") || "-", row.device || "-", row.round,
      state, `${row.last_seen_s.toFixed(1)} s`, bytes(status && status.bytes_sent),
      bytes(status && status.bytes_received)];
    cells.forEach((value, i) => {
      const td = el("td", i === 1 ? { class: "mono" } : {}, String(value));
      if (i === 5) td.className = `state-${state}`;
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
  document.getElementById("peer-count").textContent = `(${(own.live_peers || []).length})`;
  document.body.dataset.peers = String((own.live_peers || []).length);
}

// [{peer, role, name, points: [[x, y], ...]}] from every peer's role_status[*].series.
function collectSeries(own, statuses) {
  const out = [];
  for (const row of own.live_peers || []) {
    const status = statuses[row.peer_id];
    if (!status) continue;
    for (const [role, roleStatus] of Object.entries(status.role_status || {})) {
      for (const [name, points] of Object.entries((roleStatus && roleStatus.series) || {})) {
        const finite = points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
        if (finite.length) out.push({ peer: label(row), role, name, points: finite });
      }
    }
  }
  return out;
}

function niceTicks(low, high, count) {
  const span = high - low || 1;
  const step = Math.pow(10, Math.floor(Math.log10(span / count)));
  const mult = [1, 2, 5, 10].find((m) => span / (step * m) <= count) || 10;
  const unit = step * mult;
  const ticks = [];
  for (let t = Math.ceil(low / unit) * unit; t <= high + 1e-9; t += unit) ticks.push(Number(t.toPrecision(6)));
  return ticks;
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
    const text = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#7a8194" });
    text.textContent = "no loss reported yet";
    chart.appendChild(text);
    return;
  }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05;
  y0 -= pad; y1 += pad;
  const X = (x) => left + (x - x0) / (x1 - x0) * (W - left - right);
  const Y = (y) => top + (1 - (y - y0) / (y1 - y0)) * (H - top - bottom);
  for (const t of niceTicks(y0, y1, 5)) {
    chart.appendChild(svg("line", { x1: left, x2: W - right, y1: Y(t), y2: Y(t), stroke: "#eceef3" }));
    const text = svg("text", { x: left - 6, y: Y(t) + 4, "text-anchor": "end", "font-size": 11, fill: "#4a5266" });
    text.textContent = String(t);
    chart.appendChild(text);
  }
  for (const t of niceTicks(x0, x1, 8)) {
    const text = svg("text", { x: X(t), y: H - bottom + 16, "text-anchor": "middle", "font-size": 11, fill: "#4a5266" });
    text.textContent = String(t);
    chart.appendChild(text);
  }
  const axis = svg("text", { x: W - right, y: H - 4, "text-anchor": "end", "font-size": 11, fill: "#7a8194" });
  axis.textContent = "round / step / version";
  chart.appendChild(axis);
  const peers = [...new Set(series.map((s) => s.peer))];
  series.forEach((s) => {
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

function renderPanels(own) {
  const section = document.getElementById("panels");
  section.replaceChildren();
  for (const panel of own.panels || []) {
    section.appendChild(el("h2", {}, panel.title));
    const table = el("table");
    const head = el("tr");
    panel.columns.forEach((c) => head.appendChild(el("th", {}, c)));
    table.appendChild(head);
    for (const row of panel.rows) {
      const tr = el("tr");
      row.forEach((cell) => tr.appendChild(el("td", {}, String(cell))));
      table.appendChild(tr);
    }
    section.appendChild(table);
  }
}

// A ledger is an exchange itself (expected/arrived/...) or holds exchanges under named keys.
function exchanges(ledger) {
  if ("expected" in ledger && "arrived" in ledger) return [["", ledger]];
  return Object.entries(ledger).filter(([, v]) => v && typeof v === "object" && "expected" in v && "arrived" in v);
}

function where(ledger) {
  const parts = [];
  for (const key of ["block", "round", "step", "version"]) if (key in ledger) parts.push(`${key} ${ledger[key]}`);
  return parts.join(" ") || "-";
}

function count(value) {
  if (Array.isArray(value)) return String(value.length);
  if (value && typeof value === "object") {
    const entries = Object.entries(value);
    if (!entries.length) return "0";
    return `${entries.length} (${entries.map(([k, v]) => `${k.slice(0, 8)}: ${v}`).join("; ")})`;
  }
  return value === undefined ? "-" : String(value);
}

function renderLedgers(own, statuses) {
  const body = document.querySelector("#ledgers tbody");
  body.replaceChildren();
  for (const row of own.live_peers || []) {
    const status = statuses[row.peer_id];
    if (!status) continue;
    for (const roleStatus of Object.values(status.role_status || {})) {
      for (const ledger of ((roleStatus && roleStatus.ledgers) || []).slice(-3)) {
        for (const [name, exchange] of exchanges(ledger)) {
          const tr = el("tr");
          [label(row), where(ledger), name || "-", count(exchange.expected), count(exchange.arrived),
            count(exchange.used), count(exchange.rejected), count(exchange.timed_out)]
            .forEach((cell) => tr.appendChild(el("td", {}, cell)));
          body.appendChild(tr);
        }
      }
    }
  }
}

async function poll() {
  const own = await getJson("/status");
  if (own) {
    const statuses = await peerStatuses(own);
    renderHeader(own);
    renderPeers(own, statuses);
    renderChart(collectSeries(own, statuses));
    renderPanels(own);
    renderLedgers(own, statuses);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } else {
    document.getElementById("updated").textContent = "this daemon does not answer";
  }
  setTimeout(poll, POLL_MS);
}

poll();
