"""`fed-ros status --web` in a real headless browser (Chromium from Debian packages) against a
real fleet over DDS: the page the browser renders names every robot, its cluster, its accepted
updates and each completed round, shows robot_0's camera (a sensor_msgs/Image stream this test
publishes on the arm's camera topic, as a camera driver would) as a thumbnail, and the screenshot
shows it all (``fleet_status.png`` in the test's directory; docs/img/fleet_status.png was taken
this way)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

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


def _chromium(*args: str) -> subprocess.CompletedProcess:
    # --no-sandbox: the sandbox refuses to run as root (CI); the page is our own.
    argv = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    argv += ["--window-size=1100,760", "--virtual-time-budget=4000", *args]
    return subprocess.run(argv, capture_output=True, timeout=120, text=True)


class _Camera:
    """Publishes 84x84 rgb8 frames (a red square on grey) from this process, as a camera driver."""

    def __init__(self, topic: str) -> None:
        import numpy as np
        import rclpy
        from sensor_msgs.msg import Image

        from fed_ros.ros.wire import qos
        from fed_ros.ros.wire.images import image_to_msg

        self.rclpy = rclpy
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("test_camera", context=self.context)
        self.pub = self.node.create_publisher(Image, topic, qos.sensor_qos(1))
        frame = np.full((84, 84, 3), 128, np.uint8)
        frame[20:64, 20:64] = (230, 20, 20)
        self.msg = image_to_msg(frame, "rgb8")

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

    def finished() -> bool:
        camera.publish()  # a camera driver's stream, a frame per poll
        try:
            snap = json.loads(urllib.request.urlopen(url + "status.json", timeout=5).read())
        except OSError:
            return False
        thumbs = {r["robot_id"]: r["thumbnail"] for r in snap["robots"]}
        return (
            snap["stage"] == "done" and len(snap["timeline"]) == 2 and bool(thumbs.get("robot_0"))
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
        from fed_ros.ros.fleet.foxglove_layout import foxglove_layout, layout_topics

        graph = {name for name, _ in camera.node.get_topic_names_and_types()}
        assert layout_topics(foxglove_layout(config)) <= graph, sorted(graph)
    finally:
        camera.close()
    dom = _chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for rid in robots:
        assert f"<td>{rid}</td>" in html, html[-3000:]
    assert html.count('<span class="ok">accepted</span>') == 2  # each robot's last update
    assert html.count('<span class="ok">completed</span>') == 2  # the timeline's rounds
    assert "stage <b>done</b>" in html and "<td>robot_0, robot_1</td>" in html  # one cluster
    assert '<img alt="camera of robot_0" width="96" src="data:image/png;base64,' in html
    assert 'alt="camera of robot_1"' not in html  # robot_1 has no camera stream
    shot = tmp_path / "fleet_status.png"
    res = _chromium(f"--screenshot={shot}", url)
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    import numpy as np
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == (1100, 760)
        pixels = np.asarray(img.convert("RGB")).astype(int)
    dark = int((pixels.mean(axis=2) < 100).sum())  # text and the success bars
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    red = int(((r > 200) & (g < 60) & (b < 60)).sum())
    assert dark > 2000, f"the screenshot is nearly blank ({dark} dark pixels)"
    assert red > 500, f"robot_0's camera (a red square) is not on the screenshot ({red} pixels)"
