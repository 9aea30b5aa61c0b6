"""`fed-ros status --web`: the fleet live in a browser, one self-contained page, no extra package.

The page polls ``/status.json`` every second and draws what a `FleetMonitor` hears from the
server: the round and stage with its deadline, each robot's camera thumbnail
(`fed_ros.ros.fleet.camera_thumbnails`), state in the round (training, answered, accepted or why
not), clusters, success and intervention rate, each cluster's members, and the round timeline.
:func:`fleet_snapshot` builds that JSON from the monitor's
announcement and reports (pure, tested without ROS); :class:`StatusWebServer` serves it with the
standard library's HTTP server on a thread. Bound to 127.0.0.1 by default: the page shows the
fleet's state to whoever can reach the port, so put it behind an SSH tunnel for a remote view.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TIMELINE_ROUNDS = 50  # rounds the timeline keeps (the monitor holds every report it heard)


def _number(value: Any) -> float | None:
    """JSON has no NaN: a value that was not measured is null."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def robot_state(robot_id: str, announcement: Mapping | None, report: Mapping | None) -> str:
    """What one robot is doing, as the server sees it."""
    if announcement is not None and robot_id in announcement.get("participants", ()):
        if announcement.get("stage") == "done":
            return "done"
        return f"{announcement.get('stage', '?')} round {announcement.get('round')}"
    if report is not None:
        return "sat the round out"
    return "registered"


def fleet_snapshot(
    announcement: Mapping[str, Any] | None,
    reports: Sequence[Mapping[str, Any]],
    now: float,
    thumbnails: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The page's data: round, robots (with each one's camera thumbnail, a data URL, when there
    is one), clusters and the timeline (JSON-safe)."""
    thumbnails = thumbnails or {}
    latest: dict[str, Mapping[str, Any]] = {}  # robot -> its line in the newest report naming it
    last_success: dict[str, float] = {}
    for report in reports:
        for line in report.get("robots", []):
            latest[line["robot_id"]] = {**line, "round": report["round"]}
            success = _number(line.get("success_rate"))
            if success is not None:
                last_success[line["robot_id"]] = success
    memberships = dict((announcement or {}).get("memberships", {}))
    robot_ids = sorted(
        set(latest) | set(memberships) | set((announcement or {}).get("participants", ()))
    )
    robots = []
    for rid in robot_ids:
        line = latest.get(rid)
        clusters = memberships.get(rid) or [(c, 1.0) for c in (line or {}).get("cluster_ids", [])]
        robots.append(
            {
                "robot_id": rid,
                "state": robot_state(rid, announcement, line),
                "clusters": [int(c) for c, w in clusters if w > 0],
                "last_round": line["round"] if line else None,
                "accepted": bool(line["accepted"]) if line else None,
                "reason": (line or {}).get("reason", "")[:200],
                "train_loss": _number((line or {}).get("train_loss")),
                "success": last_success.get(rid),
                "interventions_per_episode": _number((line or {}).get("interventions_per_episode")),
                "thumbnail": thumbnails.get(rid),
            }
        )
    clusters: dict[int, list[str]] = {}
    for robot in robots:
        for cid in robot["clusters"]:
            clusters.setdefault(cid, []).append(robot["robot_id"])
    stage = (announcement or {}).get("stage", "waiting")
    deadline = _number((announcement or {}).get("deadline")) if stage != "done" else None
    return {
        "round": (announcement or {}).get("round"),
        "stage": stage,
        "algorithm": (announcement or {}).get("algorithm", ""),
        "deadline_in_s": None if deadline is None else round(deadline - now, 1),
        "robots": robots,
        "clusters": [{"cluster_id": c, "members": m} for c, m in sorted(clusters.items())],
        "timeline": [
            {
                "round": r["round"],
                "status": r["status"],
                "completed": bool(r["completed"]),
                "updates_accepted": int(r["updates_accepted"]),
                "updates_received": int(r["updates_received"]),
                "updates_rejected": int(r["updates_rejected"]),
            }
            for r in list(reports)[-TIMELINE_ROUNDS:]
        ],
    }


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fed_ros fleet</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em}
table{border-collapse:collapse;margin:.4em 0 1.2em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
td img{display:block;image-rendering:pixelated}
th{background:#f1f1f1}
.ok{color:#17702b;font-weight:600}.no{color:#b3261e;font-weight:600}
.bar{display:inline-block;height:.8em;background:#3b7dd8;vertical-align:middle}
#age{color:#777}
</style></head><body>
<h1>fed_ros fleet</h1>
<div id="head">waiting for the fleet server ...</div>
<h2>Robots</h2><table id="robots"></table>
<h2>Clusters</h2><table id="clusters"></table>
<h2>Round timeline</h2><table id="timeline"></table>
<div id="age"></div>
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
  return '<img alt="camera of ' + esc(r.robot_id) + '" width="96" src="' + esc(r.thumbnail) + '">';
}
function success(r) {
  if (r.success === null) return "-";
  const bar = '<span class="bar" style="width:' + Math.round(60 * r.success) + 'px"></span> ';
  return bar + num(r.success, 2);
}
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
    table("clusters", ["cluster", "members"],
      s.clusters.map(c => [c.cluster_id, esc(c.members.join(", "))]));
    table("timeline", ["round", "status", "updates accepted / received", "rejected"],
      s.timeline.slice().reverse().map(t => [t.round,
        span(t.completed ? "ok" : "no", t.status),
        t.updates_accepted + " / " + t.updates_received, t.updates_rejected]));
    document.getElementById("age").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("age").textContent = "no answer from fed-ros status: " + e;
  }
}
refresh();
setInterval(refresh, 1000);
</script></body></html>
"""


class StatusWebServer:
    """Serves the page and ``snapshot()`` as JSON on ``host:port`` (0: any free port)."""

    def __init__(
        self, snapshot: Callable[[], dict[str, Any]], host: str = "127.0.0.1", port: int = 8765
    ) -> None:
        page = PAGE.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                path = self.path.split("?", 1)[0]
                if path in ("/", "/index.html"):
                    body, kind = page, "text/html; charset=utf-8"
                elif path == "/status.json":
                    body, kind = json.dumps(snapshot()).encode(), "application/json"
                else:
                    self.send_error(404, "only / and /status.json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                """Quiet: one request a second per open page."""

        self.httpd = ThreadingHTTPServer((host, int(port)), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}/"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> "StatusWebServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
