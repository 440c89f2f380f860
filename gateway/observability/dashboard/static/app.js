// kvgate dashboard: polls /dashboard/stats.json and redraws. No build step; Chart.js is vendored.
// The page records its own state on <body> (data-updates, data-errors, data-hit-points,
// data-breaker-rows) so a headless browser test can read what was drawn.
"use strict";

const STATS_URL = "/dashboard/stats.json";
const POLL_MS = 2000;
const KEY_STORAGE = "kvgate-admin-key";
const LOAD_HISTORY_POINTS = 150;
const COLORS = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];

const charts = {};
const loadHistory = { labels: [], queue: [], inFlight: {} };

function countError() {
  document.body.dataset.errors = String(Number(document.body.dataset.errors) + 1);
}
window.addEventListener("error", countError);
window.addEventListener("unhandledrejection", countError);

const percent = (value) => (value == null ? "–" : `${(100 * value).toFixed(1)} %`);
const number = (value) => (value == null ? "–" : Math.round(value).toLocaleString("en-US"));
const seconds = (value) => (value == null ? "–" : value < 1 ? `${(1000 * value).toFixed(0)} ms` : `${value.toFixed(2)} s`);
const clock = (epochSeconds) => new Date(epochSeconds * 1000).toLocaleTimeString("en-GB", { hour12: false });
const color = (index) => COLORS[index % COLORS.length];

function setText(id, text) {
  document.getElementById(id).textContent = text;
}

function fillTable(id, rows, cells) {
  const body = document.querySelector(`#${id} tbody`);
  const columns = document.querySelectorAll(`#${id} thead th`).length;
  body.replaceChildren();
  if (!rows.length) {
    const cell = document.createElement("td");
    cell.colSpan = columns;
    cell.className = "empty";
    cell.textContent = "nothing yet";
    body.appendChild(document.createElement("tr")).appendChild(cell);
    return 0;
  }
  for (const row of rows) {
    const tr = body.appendChild(document.createElement("tr"));
    for (const [text, className] of cells(row)) {
      const td = tr.appendChild(document.createElement("td"));
      td.textContent = text;
      if (className) td.className = className;
    }
  }
  return rows.length;
}

function lineChart(id, yAxis) {
  return new Chart(document.getElementById(id), {
    type: "line",
    data: { labels: [], datasets: [] },
    options: {
      animation: false,
      maintainAspectRatio: false,
      spanGaps: true,
      interaction: { mode: "index", intersect: false },
      elements: { point: { radius: 2 }, line: { tension: 0 } },
      scales: { x: { ticks: { maxTicksLimit: 8 } }, y: yAxis },
      plugins: { legend: { labels: { boxWidth: 12 } } },
    },
  });
}

function barChart(id) {
  return new Chart(document.getElementById(id), {
    type: "bar",
    data: { labels: [], datasets: [] },
    options: {
      animation: false,
      maintainAspectRatio: false,
      scales: { x: { stacked: true, ticks: { maxTicksLimit: 8 } }, y: { stacked: true, beginAtZero: true } },
      plugins: { legend: { labels: { boxWidth: 12 } } },
    },
  });
}

function createCharts() {
  const rateAxis = { min: 0, max: 1, ticks: { callback: (value) => `${Math.round(value * 100)} %` } };
  charts.hitRate = lineChart("chart-hit-rate", rateAxis);
  charts.rate = lineChart("chart-rate", { beginAtZero: true });
  charts.ttft = lineChart("chart-ttft", { beginAtZero: true, ticks: { callback: (value) => seconds(value) } });
  charts.reasons = barChart("chart-reasons");
  charts.saved = lineChart("chart-saved", { beginAtZero: true });
  charts.load = lineChart("chart-load", { beginAtZero: true, ticks: { precision: 0 } });
}

function hitRateDatasets(series) {
  const datasets = [
    { label: "all · engine", data: series.hit_rate, borderColor: "#111827", backgroundColor: "#111827", borderWidth: 3 },
    { label: "all · predicted", data: series.predicted_hit_rate, borderColor: "#111827", borderDash: [6, 4], pointRadius: 0 },
  ];
  Object.entries(series.by_backend).forEach(([name, backend], index) => {
    datasets.push({ label: `${name} · engine`, data: backend.hit_rate, borderColor: color(index), backgroundColor: color(index) });
    datasets.push({ label: `${name} · predicted`, data: backend.predicted_hit_rate, borderColor: color(index), borderDash: [6, 4], pointRadius: 0 });
  });
  return datasets;
}

function drawCharts(series) {
  const labels = series.t.map(clock);
  charts.hitRate.data = { labels, datasets: hitRateDatasets(series) };
  charts.rate.data = {
    labels,
    datasets: Object.entries(series.by_backend).map(([name, backend], index) => (
      { label: name, data: backend.requests_per_s, borderColor: color(index), backgroundColor: color(index) }
    )),
  };
  charts.ttft.data = {
    labels,
    datasets: [
      { label: "p50", data: series.ttft_p50_s, borderColor: COLORS[0], backgroundColor: COLORS[0] },
      { label: "p99", data: series.ttft_p99_s, borderColor: COLORS[3], backgroundColor: COLORS[3] },
    ],
  };
  charts.reasons.data = {
    labels,
    datasets: Object.entries(series.reasons).map(([reason, counts], index) => (
      { label: reason, data: counts, backgroundColor: color(index) }
    )),
  };
  charts.saved.data = {
    labels,
    datasets: [{ label: "tokens / s", data: series.cached_tokens_per_s, borderColor: COLORS[2], backgroundColor: COLORS[2] }],
  };
  Object.values(charts).forEach((chart) => chart.update("none"));
  document.body.dataset.hitPoints = String(series.hit_rate.filter((value) => value != null).length);
}

// The gateway keeps no history of its gauges; the page records what it polled.
function recordLoad(stats) {
  loadHistory.labels.push(clock(stats.generated_at));
  loadHistory.queue.push(stats.queue.depth);
  for (const replica of stats.replicas) {
    const points = (loadHistory.inFlight[replica.name] ??= new Array(loadHistory.labels.length - 1).fill(null));
    points.push(replica.in_flight);
  }
  if (loadHistory.labels.length > LOAD_HISTORY_POINTS) {
    loadHistory.labels.shift();
    loadHistory.queue.shift();
    Object.values(loadHistory.inFlight).forEach((points) => points.shift());
  }
}

function drawLoad() {
  const datasets = Object.entries(loadHistory.inFlight).map(([name, points], index) => (
    { label: `${name} in flight`, data: points, borderColor: color(index), backgroundColor: color(index) }
  ));
  datasets.push({ label: "queued", data: loadHistory.queue, borderColor: "#111827", borderDash: [6, 4] });
  charts.load.data = { labels: [...loadHistory.labels], datasets };
}

function drawTables(stats) {
  fillTable("replicas", stats.replicas, (r) => [
    [r.name],
    [r.role ?? "both"],
    [r.healthy ? "up" : "down", r.healthy ? "up" : "down"],
    [r.circuit ?? "–"],
    [number(r.in_flight)],
    [number(r.num_running)],
    [number(r.num_waiting)],
    [percent(r.kv_usage)],
    [number(r.requests)],
    [percent(r.hit_rate)],
    [percent(r.predicted_hit_rate)],
    [number(r.saved_tokens)],
    [r.saved_gpu_s == null ? "–" : r.saved_gpu_s.toFixed(2)],
  ]);
  const breakerRows = fillTable("breakers", stats.prefix_breakers, (b) => [
    [b.model], [number(b.position)], [number(b.block)], [number(b.requests)], [number(b.mean_lost_tokens)], [b.preview, "preview"],
  ]);
  document.body.dataset.breakerRows = String(breakerRows);
  const pd = stats.pd ?? { decisions: {}, prefill_legs: [] };
  fillTable("pd-decisions", Object.entries(pd.decisions), ([decision, count]) => [[decision], [number(count)]]);
  fillTable("pd-prefill", pd.prefill_legs, (p) => [
    [p.backend], [number(p.legs)], [number(p.prompt_tokens)], [number(p.cached_tokens)], [percent(p.hit_rate)],
  ]);
  fillTable("normalization", stats.normalization, (n) => [[n.rule], [number(n.requests)], [number(n.cached_tokens)]]);
  fillTable("tenants", stats.tenants, (t) => [
    [t.tenant], [number(t.requests)], [number(t.rejected)], [number(t.prompt_tokens)], [percent(t.hit_rate)],
    [percent(t.predicted_hit_rate)], [seconds(t.mean_ttft_s)], [number(t.queued)],
  ]);
}

function drawCards(stats) {
  const totals = stats.totals;
  setText("card-hit-rate", percent(totals.hit_rate));
  setText("card-predicted", percent(totals.predicted_hit_rate));
  setText("card-saved", number(totals.cached_tokens));
  setText("card-gpu-s", totals.saved_gpu_s == null ? "–" : totals.saved_gpu_s.toFixed(2));
  setText("card-requests", number(totals.requests));
  setText("card-rejected", number(totals.rejected));
  setText("card-queue", number(stats.queue.depth));
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function askForKey() {
  const form = document.getElementById("key-form");
  form.hidden = false;
  form.onsubmit = (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, document.getElementById("admin-key").value);
    form.hidden = true;
    poll();
  };
}

function showStatus(text, isError) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", isError);
}

let timer = null;

async function poll() {
  clearTimeout(timer);
  let response;
  try {
    response = await fetch(STATS_URL, { headers: authHeaders(), cache: "no-store" });
  } catch (error) {
    showStatus("gateway unreachable; retrying", true);
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  if (response.status === 401 || response.status === 403) {
    showStatus("admin key needed", true);
    askForKey();
    return;
  }
  if (!response.ok) {
    showStatus(`stats unavailable (HTTP ${response.status}); retrying`, true);
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  const stats = await response.json();
  drawCards(stats);
  recordLoad(stats);
  drawLoad();
  drawCharts(stats.series);
  drawTables(stats);
  document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
  showStatus(`updated ${clock(stats.generated_at)} · ${stats.bucket_s} s per point`, false);
  timer = setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  createCharts();
  poll();
});
