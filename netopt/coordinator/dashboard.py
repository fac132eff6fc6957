"""The dashboard at ``/``: a static page that reads the JSON API with the user's token.

The page, its script and stylesheet hold no data and need no token. The script
takes the token from the URL fragment (``/#token=...``, never sent to the server,
removed from the address bar at once) or from a form, keeps it in
``sessionStorage`` and sends it only as an ``Authorization`` header. A strict
Content-Security-Policy allows nothing but this origin: no CDN, no inline script.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

__all__ = ["CSP", "page", "script", "security_headers", "stylesheet"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>netopt coordinator</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/dashboard.css"></head>
<body>
<header><h1>netopt</h1>
<form id="auth"><input id="token" type="password" placeholder="token" autocomplete="off">
<button type="submit">Connect</button></form>
<label>metric <select id="metric">
<option value="rtt">RTT p50 (ms)</option><option value="loss">loss</option>
<option value="bw">bandwidth</option></select></label>
<label>window <select id="window"><option value="300">5 min</option>
<option value="3600">1 h</option><option value="86400">24 h</option></select></label>
<span id="status">not connected</span></header>
<main>
<section><h2>Nodes</h2><table id="nodes"></table></section>
<section><h2>Regions</h2><table id="regions" class="heat"></table></section>
<section><h2>Links</h2><table id="matrix" class="heat"></table></section>
<section><h2 id="history-title">Link history</h2><div id="history"></div></section>
</main>
<script src="/dashboard.js"></script>
</body></html>
"""

CSS = """
body { font: 14px system-ui, sans-serif; margin: 0; background: #f4f5f7; color: #1d2330; }
header { display: flex; gap: 16px; align-items: center; padding: 10px 16px;
  background: #1d2330; color: #fff; }
header h1 { font-size: 18px; margin: 0 12px 0 0; }
main { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; padding: 16px; }
section { background: #fff; border-radius: 6px; padding: 8px 12px;
  box-shadow: 0 1px 2px rgba(0,0,0,.15); overflow: auto; }
h2 { font-size: 15px; margin: 4px 0 8px; }
table { border-collapse: collapse; }
td, th { padding: 3px 6px; border: 1px solid #dde; text-align: right; }
th { background: #eef0f4; }
.heat td { min-width: 54px; height: 26px; cursor: pointer; color: #111; }
.heat td.none { background: #e4e6ea; color: #889; }
.live { color: #0a7d2c; font-weight: 600; }
.stale { color: #c26d00; font-weight: 600; }
.left { color: #888; }
#status { margin-left: auto; }
svg text { font-size: 10px; fill: #445; }
"""

JS = r"""
"use strict";
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("netopt-token") || "";
const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
if (m) {
  token = decodeURIComponent(m[1]);
  sessionStorage.setItem("netopt-token", token);
  history.replaceState(null, "", location.pathname + location.search);
}
let selected = null;
let state = { nodes: [], links: [], regions: null };

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token } });
  if (!r.ok) { throw new Error(path + ": HTTP " + r.status); }
  return r.json();
}
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) { e.textContent = String(text); }
  if (cls) { e.className = cls; }
  return e;
}
function fmt(v, metric) {
  if (v === null || v === undefined) { return "-"; }
  if (metric === "loss") { return (v * 100).toFixed(2) + "%"; }
  if (metric === "bw") {
    return v >= 1e9 ? (v / 1e9).toFixed(1) + "G" : (v / 1e6).toFixed(0) + "M";
  }
  return v < 10 ? v.toFixed(2) : v.toFixed(0);
}
function badness(v, metric) {
  if (metric === "loss") { return Math.min(1, v / 0.05); }
  if (metric === "bw") {
    return 1 - Math.min(1, Math.max(0, Math.log10(v / 1e6) / 4));
  }
  return Math.min(1, Math.max(0, Math.log10(Math.max(v, 0.1)) / Math.log10(300)));
}
function colour(v, metric) {
  const b = badness(v, metric);
  return "hsl(" + Math.round(120 * (1 - b)) + ", 70%, 62%)";
}
function linkValue(link, metric) {
  if (metric === "loss") { return link.window.loss_ratio; }
  if (metric === "bw") {
    return link.bandwidth.aggregate_bps !== null ? link.bandwidth.aggregate_bps
      : link.bandwidth.single_stream_bps;
  }
  return link.window.rtt_p50_ms ? link.window.rtt_p50_ms.p50 : null;
}
function regionValue(pair, metric) {
  if (metric === "loss") { return pair.loss_ratio; }
  if (metric === "bw") { return pair.bandwidth_bps.median; }
  return pair.rtt_p50_ms ? pair.rtt_p50_ms.p50 : null;
}
function cell(v, metric, onclick) {
  const td = el("td", fmt(v, metric));
  if (v === null || v === undefined) { td.className = "none"; }
  else { td.style.background = colour(v, metric); }
  if (onclick) { td.addEventListener("click", onclick); }
  return td;
}
function renderNodes() {
  const t = $("nodes"); t.replaceChildren();
  const head = el("tr");
  for (const h of ["node", "region", "state", "age s", "cpus", "version"]) {
    head.append(el("th", h));
  }
  t.append(head);
  for (const n of state.nodes) {
    const tr = el("tr");
    tr.append(el("td", n.node), el("td", n.region), el("td", n.state, n.state),
      el("td", n.age_s.toFixed(0)), el("td", n.cpu_count), el("td", n.netopt_version));
    t.append(tr);
  }
}
function renderRegions(metric) {
  const t = $("regions"); t.replaceChildren();
  const names = state.regions.regions;
  const byPair = new Map();
  for (const p of state.regions.pairs) {
    byPair.set(p.src_region + "|" + p.dst_region, p);
    byPair.set(p.dst_region + "|" + p.src_region, p);
  }
  const head = el("tr"); head.append(el("th", ""));
  for (const n of names) { head.append(el("th", n)); }
  t.append(head);
  for (const a of names) {
    const tr = el("tr"); tr.append(el("th", a));
    for (const b of names) {
      const p = byPair.get(a + "|" + b);
      tr.append(cell(p ? regionValue(p, metric) : null, metric));
    }
    t.append(tr);
  }
}
function renderMatrix(metric) {
  const t = $("matrix"); t.replaceChildren();
  const names = state.nodes.map((n) => n.node);
  const byPair = new Map();
  for (const l of state.links) {
    byPair.set(l.src + "|" + l.dst, l);
    if (!byPair.has(l.dst + "|" + l.src)) { byPair.set(l.dst + "|" + l.src, l); }
  }
  const head = el("tr"); head.append(el("th", "src \\ dst"));
  for (const n of names) { head.append(el("th", n)); }
  t.append(head);
  for (const a of names) {
    const tr = el("tr"); tr.append(el("th", a));
    for (const b of names) {
      const l = byPair.get(a + "|" + b);
      tr.append(cell(l ? linkValue(l, metric) : null, metric,
        l ? () => { selected = [l.src, l.dst]; loadHistory(); } : null));
    }
    t.append(tr);
  }
}
function svgEl(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const k in attrs) { e.setAttribute(k, attrs[k]); }
  return e;
}
function chart(points, label) {
  const w = 520, h = 140, pad = 30;
  const svg = svgEl("svg", { width: w, height: h, viewBox: "0 0 " + w + " " + h });
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = Math.max(...ys) * 1.1 || 1;
  const sx = (x) => pad + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (w - 2 * pad);
  const sy = (y) => h - pad + 10 - (y / y1) * (h - pad);
  svg.append(svgEl("rect", { x: pad, y: 10, width: w - 2 * pad, height: h - pad,
    fill: "#f7f8fb", stroke: "#ccd" }));
  const d = points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " +
    sy(p[1]).toFixed(1)).join(" ");
  svg.append(svgEl("path", { d: d, fill: "none", stroke: "#2b6cd9", "stroke-width": 2 }));
  for (const p of points) {
    svg.append(svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: "#2b6cd9" }));
  }
  const t = svgEl("text", { x: pad, y: h - 4 }); t.textContent = label; svg.append(t);
  const top = svgEl("text", { x: 2, y: 18 }); top.textContent = y1.toFixed(1); svg.append(top);
  return svg;
}
async function loadHistory() {
  if (!selected) { return; }
  const [src, dst] = selected;
  const win = $("window").value;
  const data = await api("/api/v1/links/" + src + "/" + dst + "/history?window_s=" + win);
  $("history-title").textContent = "Link history " + src + " \u2192 " + dst;
  const box = $("history"); box.replaceChildren();
  const rtt = data.summaries.filter((s) => s.rtt_ms).map((s) => [s.taken_at_s, s.rtt_ms.p50]);
  const loss = data.summaries.filter((s) => s.loss_ratio !== null)
    .map((s) => [s.taken_at_s, s.loss_ratio * 100]);
  if (rtt.length) { box.append(chart(rtt, "RTT p50 (ms)")); }
  if (loss.length) { box.append(chart(loss, "loss (%)")); }
  if (!rtt.length && !loss.length) { box.append(el("p", "no probe data in window")); }
}
async function refresh() {
  if (!token) { $("status").textContent = "enter the token"; return; }
  const win = $("window").value;
  try {
    const [nodes, links, regions] = await Promise.all([api("/api/v1/nodes"),
      api("/api/v1/links?window_s=" + win), api("/api/v1/regions?window_s=" + win)]);
    state = { nodes: nodes.nodes, links: links.links, regions: regions };
    const metric = $("metric").value;
    renderNodes(); renderRegions(metric); renderMatrix(metric);
    if (!selected && state.links.length) {
      selected = [state.links[0].src, state.links[0].dst];
    }
    await loadHistory();
    $("status").textContent = nodes.nodes.length + " nodes, " + links.links.length +
      " links, updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("status").textContent = String(e.message || e);
  }
}
$("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("netopt-token", token);
  $("token").value = "";
  refresh();
});
$("metric").addEventListener("change", refresh);
$("window").addEventListener("change", refresh);
refresh();
setInterval(refresh, 10000);
"""


def _static(body: str, content_type: str) -> web.Response:
    return web.Response(
        text=body, content_type=content_type, charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )  # fmt: skip


async def page(request: web.Request) -> web.Response:
    """``GET /``: the dashboard page."""
    return _static(HTML, "text/html")


async def script(request: web.Request) -> web.Response:
    """``GET /dashboard.js``."""
    return _static(JS, "application/javascript")


async def stylesheet(request: web.Request) -> web.Response:
    """``GET /dashboard.css``."""
    return _static(CSS, "text/css")


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """CSP and friends on every response (JSON ones too: harmless, and defence in depth)."""
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("X-Frame-Options", "DENY")
    return response
