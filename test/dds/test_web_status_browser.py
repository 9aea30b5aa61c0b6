"""`fed-ros status --web` in a real headless browser (Chromium from Debian packages, driven over
its DevTools pipe, test/support/chromium_cdp.py).

Without ROS: the page's charts of a known history, one point per measured value at the right
place; a click on a thumbnail opens the larger camera view (also a link with ``#camera=<robot>``),
Escape closes it; the page fetches nothing but its own origin.

Against a real fleet over DDS: the page names every robot, its cluster, its accepted updates and
each completed round, charts each robot's and the cluster's training loss of every finished
round (as an independent monitor heard the reports), shows robot_0's camera (a sensor_msgs/Image
stream this test publishes on the arm's camera topic, as a camera driver would) as a thumbnail
and, on a click, larger; the screenshots show it all (``fleet_status.png`` and
``fleet_status_camera.png`` in the test's directory).
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import socket
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from support.chromium_cdp import Chromium, Page
from conftest import wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium not installed (make test installs Debian's chromium when run as root)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WIDTH, HEIGHT = 1100, 1150  # CSS pixels: the tables, the four charts and the timeline


def _chart_points(page: Page) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Each chart's points as the browser drew them: chart id -> series -> [(round, value)]."""
    return page.evaluate(
        """(() => { const out = {};
        for (const svg of document.querySelectorAll("svg.chart")) {
          out[svg.id] = {};
          for (const g of svg.querySelectorAll("g.series")) {
            out[svg.id][g.dataset.series] = [...g.querySelectorAll("circle.point")].map(
              c => [Number(c.dataset.round), Number(c.dataset.value)]);
          }
        } return out; })()"""
    )


def _expected_points(series: dict) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """The points a history (`RoundHistory.series`) should give: its measured values."""
    out: dict[str, dict[str, list]] = {}
    for by, key in (("robot", "robots"), ("cluster", "clusters")):
        for metric in ("success", "train_loss"):
            chart = {}
            for s in series[key]:
                points = [[r, v] for r, v in zip(series["rounds"], s[metric]) if v is not None]
                if points:
                    chart[str(s["id"])] = points
            out[f"chart-{by}-{metric}"] = chart
    return out


def _page_fetches_only_its_origin(page: Page, url: str) -> None:
    """The page's source names no other http(s) address and it requested nothing elsewhere."""
    source = page.evaluate("document.documentElement.outerHTML")
    assert re.findall(r"https?://[^\s\"'<>]+", source) == []  # every address is relative
    requested = page.requested_urls()
    assert requested and requested[0] == url
    elsewhere = [u for u in requested if not u.startswith((url, "data:image/png;base64,"))]
    assert elsewhere == [], elsewhere


def _open_camera_by_click(page: Page, robot_id: str) -> dict:
    """Click the robot's thumbnail; the larger view's frame once it has loaded."""
    page.click(f'img.thumb[data-robot="{robot_id}"]')
    return page.wait_for(
        """(() => { const img = document.getElementById("camera-large");
        const note = document.getElementById("camera-note").textContent;
        // complete/naturalWidth turn true before the load event has written the note (CI of
        // b798700 read "loading ..."): wait for the note too.
        if (document.getElementById("camera-view").hidden || !img.complete ||
            !img.naturalWidth || note.startsWith("loading")) return null;
        return {w: img.naturalWidth, h: img.naturalHeight, shown: img.width,
                hash: location.hash, note: document.getElementById("camera-note").textContent};
        })()""",
        30,
    )


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        return np.asarray(img.convert("RGB")).astype(int)


def _red(pixels: np.ndarray) -> int:
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return int(((r > 200) & (g < 60) & (b < 60)).sum())


def _frame() -> np.ndarray:
    """A 240x320 camera frame: a red square on grey."""
    frame = np.full((240, 320, 3), 128, np.uint8)
    frame[60:180, 100:220] = (230, 20, 20)
    return frame


@pytest.mark.timeout(120)
def test_charts_and_the_larger_camera_view_in_chromium():
    from fed_ros.ros.operator.camera_thumbnails import LARGE_SIDE, data_url, png_bytes, thumbnail
    from fed_ros.ros.operator.round_history import RoundHistory
    from fed_ros.ros.operator.web_status import StatusWebServer, fleet_snapshot

    nan = math.nan
    success = {"robot_0": [0.0, 0.5, nan, 1.0], "robot_1": [0.2, 0.4, 0.6, 0.8]}
    history = RoundHistory()
    reports = []
    for r in range(4):
        lines = [
            {
                "robot_id": rid,
                "cluster_ids": [cluster],
                "num_samples": 10 * (k + 1),
                "train_loss": 3.0 / (r + 1) + k,
                "success_rate": success.get(rid, [nan] * 4)[r],
                "accepted": True,
                "reason": "",
            }
            for k, (rid, cluster) in enumerate((("robot_0", 0), ("robot_1", 0), ("robot_2", 1)))
        ]
        reports.append({"round": r, "status": "completed", "completed": True, "robots": lines})
        reports[-1].update(updates_received=3, updates_accepted=3, updates_rejected=0)
        history.add(reports[-1])
    frame = _frame()
    large = png_bytes(thumbnail(frame, LARGE_SIDE))
    web = StatusWebServer(
        lambda: fleet_snapshot(None, reports, 0.0, {"robot_0": data_url(frame)}, history.series()),
        port=0,
        camera_frame=lambda rid: large if rid == "robot_0" else None,
    ).start()
    try:
        with Chromium(CHROMIUM) as browser:
            page = browser.open(web.url, WIDTH, HEIGHT)
            page.wait_for("document.querySelectorAll('svg.chart circle.point').length > 0", 30)
            drawn = _chart_points(page)
            assert drawn["chart-robot-success"]["robot_2"] == []  # never evaluated: no point
            drawn = {c: {s: p for s, p in lines.items() if p} for c, lines in drawn.items()}
            assert drawn == _expected_points(history.series())
            assert len(drawn["chart-robot-success"]["robot_0"]) == 3  # round 2 not evaluated
            assert len(drawn["chart-cluster-train_loss"]["0"]) == 4
            # Higher values are drawn higher, later rounds further right, in every chart.
            geometry = page.evaluate(
                """[...document.querySelectorAll("svg.chart")].map(svg =>
                [...svg.querySelectorAll("circle.point")].map(c => [Number(c.dataset.round),
                  Number(c.dataset.value), Number(c.getAttribute("cx")),
                  Number(c.getAttribute("cy"))]))"""
            )
            for points in geometry:
                for r1, v1, x1, y1 in points:
                    for r2, v2, x2, y2 in points:
                        assert (v1 > v2) == (y1 < y2) and (r1 > r2) == (x1 > x2)
            assert page.evaluate(
                "document.querySelector('#chart-cluster-success text.empty') === null"
            )
            # The larger camera view: a click on the thumbnail, the frame at its own size.
            opened = _open_camera_by_click(page, "robot_0")
            assert (opened["w"], opened["h"], opened["hash"]) == (320, 240, "#camera=robot_0")
            assert opened["shown"] == 480 and "320 x 240 px" in opened["note"]
            pixels = _pixels(page.screenshot())
            assert _red(pixels) > 20 * _red(_pixels(png_bytes(thumbnail(frame))))
            page.key("Escape")
            page.wait_for("document.getElementById('camera-view').hidden", 10)
            assert page.evaluate("location.hash") == ""
            _page_fetches_only_its_origin(page, web.url)
            # A link with the fragment opens the view; a robot without a camera says so.
            linked = browser.open(web.url + "#camera=robot_1", WIDTH, HEIGHT)
            assert "no frame from robot_1" in linked.wait_for(
                "!document.getElementById('camera-view').hidden && "
                "document.getElementById('camera-note').textContent.startsWith('no frame') && "
                "document.getElementById('camera-note').textContent",
                30,
            )
    finally:
        web.close()


class _Camera:
    """Publishes 240x320 rgb8 frames (a red square on grey) from this process, as a camera
    driver."""

    def __init__(self, topic: str) -> None:
        import rclpy
        from sensor_msgs.msg import Image

        from fed_ros.ros.wire import qos
        from fed_ros.ros.wire.images import image_to_msg

        self.rclpy = rclpy
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("test_camera", context=self.context)
        self.pub = self.node.create_publisher(Image, topic, qos.sensor_qos(1))
        self.msg = image_to_msg(_frame(), "rgb8")

    def publish(self) -> None:
        self.pub.publish(self.msg)

    def close(self) -> None:
        self.node.destroy_node()
        self.rclpy.shutdown(context=self.context)


@pytest.mark.timeout(300)
def test_live_fleet_view_renders_the_fleet_in_chromium(tmp_path, ros_env, processes):
    from fed_ros.learning.dataset import synthetic_episodes
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
    from fed_ros.ros.fleet.launcher import build_commands, fleet_env
    from fed_ros.ros.fleet.plan import plan_fleet

    robots = ("robot_0", "robot_1")
    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "web",
                "algorithm": "fedavg",
                "rounds": 2,
                "run_dir": str(tmp_path),
                "server": {"round_timeout_s": 120.0, "tracking": "none"},
                "robot_defaults": {
                    "train_max_steps": 2,
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                    "tracking": "none",
                },
                "robots": [{"id": r, "task": "lift", "sim": False} for r in robots],
            }
        }
    )
    for k, rid in enumerate(robots):
        (tmp_path / rid / "demos").mkdir(parents=True)
        for j, episode in enumerate(synthetic_episodes(2, length=20, seed=k)):
            episode.save(tmp_path / rid / "demos" / f"synthetic_{j}.npz")
    env = fleet_env(base=ros_env)
    for c in build_commands(plan_fleet(config, include_server=True), tmp_path):
        if c.spec.executable != "arm_adapter_node":
            processes.start(c.argv, env, log_path=c.log_path)
    port = _free_port()
    fed_ros = str(Path(sys.executable).parent / "fed-ros")
    web_log = tmp_path / "status_web.log"
    web = processes.start([fed_ros, "status", "--web", str(port)], env, log_path=web_log)
    url = f"http://127.0.0.1:{port}/"
    camera = _Camera("/robot_0/arm/agentview/image_raw")
    from fed_ros.ros.operator.monitor import FleetMonitor

    heard = FleetMonitor(track_models=False)  # the reports, as an independent subscriber hears

    def finished() -> bool:
        camera.publish()  # a camera driver's stream, a frame per poll
        heard.spin_once(0.05)
        try:
            snap = json.loads(urllib.request.urlopen(url + "status.json", timeout=5).read())
        except OSError:
            return False
        thumbs = {r["robot_id"]: r["thumbnail"] for r in snap["robots"]}
        return (
            snap["stage"] == "done"
            and len(snap["timeline"]) == 2
            and bool(thumbs.get("robot_0"))
            and len({r["round"] for r in heard.reports}) == 2
        )

    try:
        wait_until(
            finished,
            240,
            "the web view to show both rounds, the end and robot_0's camera",
            interval=0.5,
            diagnostics=lambda: f"fed-ros status exit {web.poll()}: " + web_log.read_text()[-2000:],
        )
        # The Foxglove layout made from this fleet's file reads only topics on the live graph.
        from fed_ros.ros.operator.foxglove_layout import foxglove_layout, layout_topics

        graph = {name for name, _ in camera.node.get_topic_names_and_types()}
        assert layout_topics(foxglove_layout(config)) <= graph, sorted(graph)
    finally:
        camera.close()
        heard.close()
    with Chromium(CHROMIUM) as browser:
        page = browser.open(url, WIDTH, HEIGHT)
        page.wait_for("document.querySelectorAll('svg.chart circle.point').length > 0", 60)
        html = page.evaluate("document.documentElement.outerHTML")
        for rid in robots:
            assert f"<td>{rid}</td>" in html, html[-3000:]
        assert html.count('<span class="ok">accepted</span>') == 2  # each robot's last update
        assert html.count('<span class="ok">completed</span>') == 2  # the timeline's rounds
        assert "stage <b>done</b>" in html and "<td>robot_0, robot_1</td>" in html  # one cluster
        assert 'alt="camera of robot_0" title="larger view" width="96" src="data:image/png' in html
        assert 'alt="camera of robot_1"' not in html  # robot_1 has no camera stream
        # Each robot's training loss of every finished round, as the reports carried it; the
        # cluster's of every round; no success point: this fleet does not evaluate.
        drawn = _chart_points(page)
        finished_rounds = sorted({r["round"] for r in heard.reports if r["completed"]})
        for rid in robots:
            reported = [
                (r["round"], line["train_loss"])
                for r in sorted(heard.reports, key=lambda r: r["round"])
                for line in r["robots"]
                if line["robot_id"] == rid
            ]
            points = drawn["chart-robot-train_loss"][rid]
            assert [r for r, _ in points] == finished_rounds == [0, 1]
            assert points == [[r, pytest.approx(v, rel=1e-6)] for r, v in reported]
        assert [r for r, _ in drawn["chart-cluster-train_loss"]["0"]] == finished_rounds
        expected = _expected_points(heard.history.series())
        for chart in ("chart-robot-train_loss", "chart-cluster-train_loss"):
            assert drawn[chart] == expected[chart]
        assert all(not p for p in drawn["chart-robot-success"].values())
        assert "no evaluation reported yet" in page.evaluate(
            "document.getElementById('chart-robot-success').textContent"
        )
        shot = tmp_path / "fleet_status.png"
        shot.write_bytes(page.screenshot())
        # The larger view of robot_0's camera: its newest frame, at its own size.
        opened = _open_camera_by_click(page, "robot_0")
        assert (opened["w"], opened["h"]) == (320, 240) and opened["shown"] == 480
        (tmp_path / "fleet_status_camera.png").write_bytes(page.screenshot())
        _page_fetches_only_its_origin(page, url)
    pixels = _pixels(shot.read_bytes())
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    dark = int((pixels.mean(axis=2) < 100).sum())  # text and the chart lines
    assert dark > 2000, f"the screenshot is nearly blank ({dark} dark pixels)"
    red = _red(pixels)
    assert red > 500, f"robot_0's camera (a red square) is not on the screenshot ({red} pixels)"
    larger = _red(_pixels((tmp_path / "fleet_status_camera.png").read_bytes()))
    assert larger > 10 * red, f"the larger view shows {larger} red pixels, the thumbnail {red}"
