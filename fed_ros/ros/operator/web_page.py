"""The page of `fed-ros status --web`: one HTML file with its own style and script.

Nothing is fetched but the page's own ``status.json`` (every second) and, while the larger
camera view is open, ``camera/<robot>.png``: no script, style sheet or font from elsewhere, so
the view works on a fleet's offline network. The script draws what the JSON holds
(`fed_ros.ros.operator.web_status.fleet_snapshot`):

- the robots table, each camera thumbnail a button for the larger view;
- four inline SVG charts, success and training loss per round, per robot and per cluster
  (``history``: one ``circle.point`` per measured value, ``data-round`` and ``data-value`` on
  each, a line through each series; success on a fixed 0-1 axis, loss from 0 or its minimum);
- the clusters and the round timeline.

The larger view follows the URL fragment ``#camera=<robot>``: a click on a thumbnail sets it,
Escape, the close button or a click beside the frame clears it, and a link with the fragment
opens the page with the view open. The frame is reloaded every second while it is open.
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fed_ros fleet</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em}
h2{font-size:1.15em;margin:.8em 0 .2em}
table{border-collapse:collapse;margin:.4em 0 1em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
td img{display:block;image-rendering:pixelated}
img.thumb{cursor:zoom-in}
th{background:#f1f1f1}
.ok{color:#17702b;font-weight:600}.no{color:#b3261e;font-weight:600}
.bar{display:inline-block;height:.8em;background:#3b7dd8;vertical-align:middle}
#age{color:#777}
#charts{display:grid;grid-template-columns:repeat(2,460px);gap:.4em 1.6em}
figure{margin:0}
figcaption{font-weight:600;margin:.2em 0}
svg.chart{display:block;background:#fafafa;border:1px solid #ddd}
svg.chart text{font:11px system-ui,sans-serif;fill:#555}
svg.chart .grid{stroke:#e2e2e2}
svg.chart .empty{font-size:13px;fill:#888}
.legend{font-size:12px;min-height:1.2em}
.legend span{margin-right:1em;white-space:nowrap}
.legend i{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:-1px}
#camera-view{position:fixed;inset:0;background:rgba(0,0,0,.55);display:flex;
  align-items:center;justify-content:center}
#camera-view[hidden]{display:none}
#camera-frame{background:#fff;padding:.6em .8em;border-radius:4px}
#camera-large{display:block;width:480px;max-width:90vw;image-rendering:pixelated;
  background:#222;margin:.4em 0}
#camera-note{color:#666;font-size:12px}
</style></head><body>
<h1>fed_ros fleet</h1>
<div id="head">waiting for the fleet server ...</div>
<h2>Robots</h2><table id="robots"></table>
<h2>Per round</h2>
<div id="charts">
<figure><figcaption>Success per robot</figcaption><div id="robot-success"></div>
<div class="legend" id="robot-legend-success"></div></figure>
<figure><figcaption>Training loss per robot</figcaption><div id="robot-train_loss"></div>
<div class="legend" id="robot-legend-train_loss"></div></figure>
<figure><figcaption>Success per cluster</figcaption><div id="cluster-success"></div>
<div class="legend" id="cluster-legend-success"></div></figure>
<figure><figcaption>Training loss per cluster</figcaption><div id="cluster-train_loss"></div>
<div class="legend" id="cluster-legend-train_loss"></div></figure>
</div>
<h2>Clusters</h2><table id="clusters"></table>
<h2>Round timeline</h2><table id="timeline"></table>
<div id="age"></div>
<div id="camera-view" hidden><div id="camera-frame">
<b id="camera-title"></b> <button id="camera-close" type="button">close</button>
<img id="camera-large" alt="">
<div id="camera-note"></div>
</div></div>
<script>
const ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"};
function esc(s) { return String(s).replace(/[&<>"]/g, c => ESC[c]); }
function num(v, d) { return v === null || v === undefined ? "-" : Number(v).toFixed(d); }
function span(cls, text) { return '<span class="' + cls + '">' + esc(text) + "</span>"; }
function table(id, head, rows) {
  const th = "<tr>" + head.map(h => "<th>" + h + "</th>").join("") + "</tr>";
  const tr = rows.map(r => "<tr>" + r.map(c => "<td>" + c + "</td>").join("") + "</tr>");
  document.getElementById(id).innerHTML = th + tr.join("");
}
function lastUpdate(r) {
  if (r.accepted === null) return "-";
  const what = r.accepted ? span("ok", "accepted") : span("no", r.reason || "rejected");
  return what + " (round " + r.last_round + ")";
}
function camera(r) {
  if (!r.thumbnail || !r.thumbnail.startsWith("data:image/png;base64,")) return "-";
  return '<img class="thumb" data-robot="' + esc(r.robot_id) + '" alt="camera of ' +
    esc(r.robot_id) + '" title="larger view" width="96" src="' + esc(r.thumbnail) + '">';
}
function success(r) {
  if (r.success === null) return "-";
  const bar = '<span class="bar" style="width:' + Math.round(60 * r.success) + 'px"></span> ';
  return bar + num(r.success, 2);
}

// Charts: inline SVG markup (no namespace URL needed inside an HTML document).
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
const W = 460, H = 190, L = 46, R = 12, T = 10, B = 26;
function label(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : Number(v.toPrecision(3)); }
function chart(by, key, rounds, series, names) {
  const id = "chart-" + by + "-" + key;
  const what = key === "success" ? "evaluation" : "training";
  const lines = series.map((s, i) => ({
    id: String(s.id), name: names(s), color: COLORS[i % COLORS.length],
    points: s[key].map((v, j) => v === null ? null : [rounds[j], v]).filter(p => p !== null),
  }));
  const values = lines.flatMap(s => s.points.map(p => p[1]));
  let svg = '<svg id="' + id + '" class="chart" data-by="' + by + '" data-metric="' + key +
    '" width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + " " + H + '">';
  if (!values.length) {
    svg += '<text class="empty" x="' + W / 2 + '" y="' + H / 2 + '" text-anchor="middle">no ' +
      what + " reported yet</text></svg>";
    return [svg, ""];
  }
  let lo = key === "success" ? 0 : Math.min(0, ...values);
  let hi = key === "success" ? 1 : Math.max(...values);
  if (hi <= lo) hi = lo + 1;
  const x0 = Math.min(...rounds), x1 = Math.max(...rounds);
  const sx = r => x1 === x0 ? (L + W - R) / 2 : L + (r - x0) * (W - L - R) / (x1 - x0);
  const sy = v => T + (hi - v) * (H - T - B) / (hi - lo);
  for (const v of [lo, (lo + hi) / 2, hi]) {
    svg += '<line class="grid" x1="' + L + '" x2="' + (W - R) + '" y1="' + sy(v) + '" y2="' +
      sy(v) + '"/><text x="' + (L - 4) + '" y="' + (sy(v) + 4) + '" text-anchor="end">' +
      label(v) + "</text>";
  }
  const step = Math.max(1, Math.ceil((x1 - x0 + 1) / 10));
  for (let r = x0; r <= x1; r += step) {
    svg += '<text x="' + sx(r) + '" y="' + (H - B + 16) + '" text-anchor="middle">' + r +
      "</text>";
  }
  svg += '<text x="' + (L - 12) + '" y="' + (H - B + 16) + '" text-anchor="end">round</text>';
  for (const s of lines) {
    svg += '<g class="series" data-series="' + esc(s.id) + '" fill="' + s.color + '" stroke="' +
      s.color + '">';
    if (s.points.length > 1) {
      svg += '<polyline fill="none" stroke-width="2" points="' +
        s.points.map(([r, v]) => sx(r) + "," + sy(v)).join(" ") + '"/>';
    }
    for (const [r, v] of s.points) {
      svg += '<circle class="point" r="3.5" cx="' + sx(r) + '" cy="' + sy(v) +
        '" data-round="' + r + '" data-value="' + v + '"><title>' + esc(s.name) + ", round " +
        r + ": " + label(v) + "</title></circle>";
    }
    svg += "</g>";
  }
  const legend = lines.map(s => '<span><i style="background:' + s.color + '"></i>' +
    esc(s.name) + "</span>").join("");
  return [svg + "</svg>", legend];
}
let drawnHistory = "";
function charts(h) {
  const key = JSON.stringify(h);
  if (key === drawnHistory) return;  // redrawn only when a round report changed it
  drawnHistory = key;
  for (const [by, series, names] of [["robot", h.robots, s => s.id],
                                     ["cluster", h.clusters, s => "cluster " + s.id]]) {
    for (const metric of ["success", "train_loss"]) {
      const [svg, legend] = chart(by, metric, h.rounds, series, names);
      document.getElementById(by + "-" + metric).innerHTML = svg;
      document.getElementById(by + "-legend-" + metric).innerHTML = legend;
    }
  }
}

// The larger camera view, opened by the fragment #camera=<robot>.
let cameraRobot = null;
const view = document.getElementById("camera-view");
const large = document.getElementById("camera-large");
const note = document.getElementById("camera-note");
function loadLarge() {
  if (cameraRobot !== null) {
    large.src = "camera/" + encodeURIComponent(cameraRobot) + ".png?t=" + Date.now();
  }
}
function followHash() {
  const m = /^#camera=([A-Za-z][A-Za-z0-9_]*)$/.exec(location.hash);
  const robot = m ? m[1] : null;
  if (robot === cameraRobot) return;
  cameraRobot = robot;
  view.hidden = robot === null;
  if (robot === null) { large.removeAttribute("src"); return; }
  document.getElementById("camera-title").textContent = "camera of " + robot;
  note.textContent = "loading ...";
  loadLarge();
}
function closeCamera() {
  history.replaceState(null, "", location.pathname + location.search);
  followHash();
}
large.addEventListener("load", () => {
  note.textContent = large.naturalWidth + " x " + large.naturalHeight +
    " px, the newest frame (reloaded every second)";
});
large.addEventListener("error", () => {
  if (cameraRobot !== null) note.textContent = "no frame from " + cameraRobot + "'s camera yet";
});
document.getElementById("robots").addEventListener("click", e => {
  const img = e.target.closest("img.thumb");
  if (img) location.hash = "camera=" + img.dataset.robot;
});
document.getElementById("camera-close").addEventListener("click", closeCamera);
view.addEventListener("click", e => { if (e.target === view) closeCamera(); });
document.addEventListener("keydown", e => { if (e.key === "Escape") closeCamera(); });
window.addEventListener("hashchange", followHash);
followHash();

async function refresh() {
  try {
    const s = await (await fetch("status.json", {cache: "no-store"})).json();
    let head = "round <b>" + esc(s.round ?? "-") + "</b>, stage <b>" + esc(s.stage) + "</b>";
    if (s.algorithm) head += " (" + esc(s.algorithm) + ")";
    if (s.deadline_in_s !== null) head += ", deadline in " + num(s.deadline_in_s, 0) + " s";
    document.getElementById("head").innerHTML = head;
    table("robots",
      ["robot", "camera", "state", "clusters", "last update", "success",
       "interventions / episode", "train loss"],
      s.robots.map(r => [esc(r.robot_id), camera(r), esc(r.state), esc(r.clusters.join(", ")),
        lastUpdate(r), success(r), num(r.interventions_per_episode, 2), num(r.train_loss, 3)]));
    charts(s.history);
    table("clusters", ["cluster", "members"],
      s.clusters.map(c => [c.cluster_id, esc(c.members.join(", "))]));
    table("timeline", ["round", "status", "updates accepted / received", "rejected"],
      s.timeline.slice().reverse().map(t => [t.round,
        span(t.completed ? "ok" : "no", t.status),
        t.updates_accepted + " / " + t.updates_received, t.updates_rejected]));
    loadLarge();
    document.getElementById("age").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("age").textContent = "no answer from fed-ros status: " + e;
  }
}
refresh();
setInterval(refresh, 1000);
</script></body></html>
"""
