"""`fed-ros status --web`: the fleet live in a browser, one self-contained page, no extra package.

The page (:mod:`fed_ros.ros.operator.web_page`) polls ``/status.json`` every second and draws what
a `FleetMonitor` hears from the server: the round and stage with its deadline, each robot's
camera thumbnail (`fed_ros.ros.operator.camera_thumbnails`), state in the round (training,
answered, accepted or why not), clusters, success and intervention rate, charts of success and
training loss per round (`fed_ros.ros.operator.round_history`), each cluster's members, and the
round timeline; a click on a thumbnail shows ``/camera/<robot>.png``, a larger frame.
:func:`fleet_snapshot` builds that JSON from the monitor's announcement, reports and history
(pure, tested without ROS); :class:`StatusWebServer` serves it with the standard library's HTTP
server on a thread. Bound to 127.0.0.1 by default: the page shows the fleet's state to whoever
can reach the port, so put it behind an SSH tunnel for a remote view.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from fed_ros.ros.configuration.fleet_params import ID_RE
from fed_ros.ros.operator.web_page import PAGE

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
    history: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The page's data: round, robots (with each one's camera thumbnail, a data URL, when there
    is one), clusters, the timeline and the charts' history (`RoundHistory.series`; JSON-safe)."""
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
        "history": dict(history or {"rounds": [], "completed": [], "robots": [], "clusters": []}),
    }


CAMERA_PATH = re.compile(r"/camera/([^/]+)\.png")


class StatusWebServer:
    """Serves the page, ``snapshot()`` as JSON and ``camera_frame(robot)`` (a PNG, or None when
    that robot has no frame) as ``/camera/<robot>.png`` on ``host:port`` (0: any free port)."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        host: str = "127.0.0.1",
        port: int = 8765,
        camera_frame: Callable[[str], bytes | None] | None = None,
    ) -> None:
        page = PAGE.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                path = self.path.split("?", 1)[0]
                camera = CAMERA_PATH.fullmatch(path)
                if path in ("/", "/index.html"):
                    body, kind = page, "text/html; charset=utf-8"
                elif path == "/status.json":
                    body, kind = json.dumps(snapshot()).encode(), "application/json"
                elif camera is not None:
                    robot_id = unquote(camera.group(1))
                    if not ID_RE.fullmatch(robot_id):
                        self.send_error(404, f"{ascii(robot_id[:64])} is not a robot id")
                        return
                    png = camera_frame(robot_id) if camera_frame is not None else None
                    if png is None:
                        self.send_error(404, f"no camera frame from {robot_id!r}")
                        return
                    body, kind = png, "image/png"
                else:
                    self.send_error(404, "only /, /status.json and /camera/<robot>.png")
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
